"""Which tasks a step trains on: the run's place in its tasks (`Stream`), in a fixed shuffled
order per epoch, or with a curriculum.

The curriculum (as the Rust trainer had it, `data.curriculum: true`) buckets the tasks by
difficulty and family (`data.curriculum_by`) and draws each prompt from a bucket chosen with
probability proportional to p (1 - p) + floor, p the bucket's recent pass rate (an EMA of the
share of its completions that passed, `data.curriculum_rate`; 0.5 before any): buckets the
student always fails or always solves give no group signal and are drawn rarely, never never
(`floor`). Within a bucket tasks come in a shuffled order of their own. Everything is
deterministic from the seed and the state, and the state (rates, per-bucket positions, draws)
is saved with each checkpoint, so a resumed run draws what the uninterrupted one would have.

Not covered: curricula over other task features, or over prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..records import Task
from .tasks import TaskOrder


def bucket_of(task: Task, keys: Sequence[str]) -> str:
    """A task's bucket: its difficulty and/or family (`meta["family"]`), "-" where missing."""
    parts = []
    for k in keys:
        value = task.difficulty if k == "difficulty" else task.meta.get(k)
        parts.append(str(value) if value is not None else "-")
    return "/".join(parts) or "-"


def bucket_weights(rates: Sequence[float], floor: float) -> np.ndarray:
    """Draw probabilities of buckets from their pass rates: p (1 - p) + floor, normalized."""
    w = np.array([p * (1 - p) for p in rates], dtype=np.float64) + floor
    return w / w.sum()


@dataclass
class Curriculum:
    """Buckets of task indices and their state; `draw(n)` the next n task indices."""

    buckets: dict[str, list[int]]
    seed: int
    floor: float = 0.05
    rate: float = 0.3
    pass_rate: dict[str, float] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)  # draws from each bucket so far
    draws: int = 0

    @classmethod
    def of(cls, tasks: Sequence[Task], keys: Sequence[str], seed: int, floor: float,
           rate: float) -> Curriculum:
        buckets: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            buckets.setdefault(bucket_of(t, keys), []).append(i)
        return cls(dict(sorted(buckets.items())), seed, floor, rate)

    def draw(self, n: int) -> list[int]:
        names = list(self.buckets)
        probs = bucket_weights([self.pass_rate.get(b, 0.5) for b in names], self.floor)
        rng = np.random.default_rng([self.seed, 7, self.draws])
        out = []
        for b in rng.choice(len(names), size=n, p=probs):
            out.append(self._next(names[b]))
        self.draws += 1
        return out

    def _next(self, bucket: str) -> int:
        """The bucket's next task: its own shuffled order, a new one each pass over it."""
        members = self.buckets[bucket]
        k = self.position.get(bucket, 0)
        self.position[bucket] = k + 1
        order = TaskOrder(len(members), self.seed + 1 + sum(map(ord, bucket)))
        return members[order.permutation(k // len(members))[k % len(members)]]

    def observe(self, results: Sequence[tuple[Task, float]], keys: Sequence[str]) -> None:
        """Fold a step's (task, passed 0..1) results into the buckets' pass rates."""
        seen: dict[str, list[float]] = {}
        for task, value in results:
            seen.setdefault(bucket_of(task, keys), []).append(value)
        for b, values in seen.items():
            before = self.pass_rate.get(b, 0.5)
            self.pass_rate[b] = (1 - self.rate) * before + self.rate * float(np.mean(values))

    def state(self) -> dict[str, Any]:
        return {"pass_rate": self.pass_rate, "position": self.position, "draws": self.draws}

    def restore(self, state: dict[str, Any]) -> None:
        self.pass_rate = {k: float(v) for k, v in state.get("pass_rate", {}).items()}
        self.position = {k: int(v) for k, v in state.get("position", {}).items()}
        self.draws = int(state.get("draws", 0))


@dataclass
class Stream:
    """The run's place in its tasks: `take(n)` the next tasks, advancing (epoch, cursor). In a
    fixed order a take stays within the epoch (the last batch of an epoch is shorter) unless
    `across` is set; with a curriculum the epoch is notional (n tasks drawn)."""

    tasks: list[Task]
    order: TaskOrder
    epoch: int = 0
    cursor: int = 0
    curriculum: Curriculum | None = None

    def take(self, n: int, across: bool = False) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            want = n - len(out)
            if self.curriculum is not None:
                idx = self.curriculum.draw(min(want, len(self.tasks) - self.cursor))
            else:
                idx = self.order.batch(self.epoch, self.cursor, want)
            out += [self.tasks[i] for i in idx]
            self.cursor += len(idx)
            if self.cursor >= len(self.tasks):
                self.epoch, self.cursor = self.epoch + 1, 0
                if not across:
                    break
            if not across:
                break
        return out
