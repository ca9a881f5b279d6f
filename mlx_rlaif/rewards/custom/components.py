"""The reward as a list of components: built-in rewards (exec, teacher, syntax), your
functions and reward servers, combined into one value per completion.

Each component has a name (its metric key), a weight (0: computed and logged, never trained
on) and scores the whole batch once per call of `score` (never again for the metrics). The
built-ins run first, concurrently; the exec reward's result of each completion is then passed
to the functions and servers, which run concurrently too. A completion's value is the weighted
sum of its trained components that are not None (`aggregation: sum`), or of each component
standardized within the prompt's group first (`normalize`: (v - mean) / std over the group's
values that are not None, 0 where they do not vary); None when every trained component is None
(unscorable: advantage 0, counted as reward/frac_none). Its parts are each component's value
and named parts (`format`, `judge/correctness`, ...).

A function's error, timeout or a value the contract refuses either raises RewardError at once
(`on_error: stop`, naming the component, the task and the traceback's last line; the step
stops before its update) or makes that completion's value None for that component
(`unscorable`), counted, with RewardError once more than `max_error_frac` of a batch errs.
Per component, `metrics()` reports reward/<name>/mean, std, frac_none, errors, timeouts and
seconds since its last call (the step's), and the built-ins' own metrics. Only batches scored
for a training step count (the trainer sets `step` before it scores; `metrics()` clears it):
the held-out evaluations' completions are scored the same way but stay out of the step's
statistics.

Not covered: per-task weights, components that depend on each other beyond the exec result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import RewardError
from ...records import Reward, Task, group_indices
from ..base import RewardFn
from .contract import ValueProblem, as_lists, check_list, check_value, exec_summary, shown, units
from .pool import Outcome

Scorer = Callable[[list[dict[str, Any]], int], list[Outcome]]


@dataclass
class Custom:
    """A function or server component: `scorer(units, step)` gives one outcome per unit; a
    function of lists gets one unit per batch (or per group: `group`)."""

    name: str
    weight: float
    scorer: Scorer
    what: str  # how errors name it: the spec or the URL
    batched: bool = False
    group: bool = False
    timeout_s: float = 0.0
    close: Callable[[], None] = lambda: None
    server: bool = False  # a timeout is the request's (nothing to kill)


@dataclass
class _Tally:
    values: list[float] = field(default_factory=list)
    none: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Scored:
    """One component's result for one completion."""

    value: float | None
    parts: dict[str, float | None]
    reason: str = ""
    details: dict | None = None


class ComponentsReward:
    name = "components"
    whole_step = True  # scored once per batch: the trainer does not score group by group

    def __init__(self, builtins: Sequence[tuple[str, float, RewardFn]],
                 customs: Sequence[Custom], aggregation: str = "sum", on_error: str = "stop",
                 max_error_frac: float = 0.1) -> None:
        self.builtins, self.customs = list(builtins), list(customs)
        self.parts = [(fn, w) for _, w, fn in self.builtins]  # multiturn finds the exec here
        self.names = [n for n, _, _ in self.builtins] + [c.name for c in self.customs]
        self.weights = [w for _, w, _ in self.builtins] + [c.weight for c in self.customs]
        self.aggregation, self.on_error, self.max_error_frac = aggregation, on_error, \
            max_error_frac
        self.step: int | None = None  # set by the training step: its batches are counted
        self._tally = {n: _Tally() for n in self.names}
        self._pool = ThreadPoolExecutor(max(1, len(self.names)), thread_name_prefix="reward")

    # scoring ------------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]:
        tasks, completions = list(tasks), list(completions)
        built = [self._pool.submit(self._builtin, n, fn, tasks, completions)
                 for n, _, fn in self.builtins]
        raw = [f.result() for f in built]
        per: list[list[_Scored]] = [[_Scored(r.value, dict(r.parts), r.reason, dict(r.details))
                                     for r in rewards] for rewards in raw]
        exec_rewards = next((rewards for (n, _, fn), rewards in zip(self.builtins, raw,
                                                                    strict=True)
                             if getattr(fn, "name", "") == "exec"), None)
        args = units(tasks, completions, [exec_summary(r) for r in exec_rewards]
                     if exec_rewards else [None] * len(tasks))
        customs = [self._pool.submit(self._custom, c, args, tasks) for c in self.customs]
        per += [f.result() for f in customs]
        return [self._combine(i, per, exec_rewards, tasks) for i in range(len(tasks))]

    def _builtin(self, name: str, fn: RewardFn, tasks: list[Task], completions: list[str]
                 ) -> list[Reward]:
        t0 = time.perf_counter()
        rewards = fn.score(tasks, completions)
        self._count(name, [_Scored(r.value, {}) for r in rewards], 0, 0,
                    time.perf_counter() - t0)
        return rewards

    def _custom(self, c: Custom, args: list[dict[str, Any]], tasks: list[Task]
                ) -> list[_Scored]:
        t0 = time.perf_counter()
        if c.batched:
            chunks = list(group_indices([t.id for t in tasks]).values()) if c.group \
                else [list(range(len(args)))]
            outcomes = c.scorer([as_lists([args[i] for i in ix]) for ix in chunks],
                                  self.step or 0)
            flat: list[tuple[Outcome, int]] = [None] * len(args)  # type: ignore[list-item]
            for ix, (status, value) in zip(chunks, outcomes, strict=True):
                if status == "ok":
                    try:
                        value = check_list(value, len(ix))
                    except ValueProblem as e:
                        status, value = "error", str(e)
                for k, i in enumerate(ix):
                    flat[i] = ((status, value[k] if status == "ok" else value), i)
            results = [o for o, _ in flat]
        else:
            results = c.scorer(args, self.step or 0)
        out, errors, timeouts = [], 0, 0
        for task, (status, value) in zip(tasks, results, strict=True):
            if status == "ok":
                try:
                    v, parts = check_value(value)
                    out.append(_Scored(v, parts))
                    continue
                except ValueProblem as e:
                    status, value = "error", str(e)
            errors += status == "error"
            timeouts += status == "timeout"
            why = value if status != "timeout" else \
                f"{c.what} did not answer within {c.timeout_s:g} s" if c.server else \
                f"timed out after {c.timeout_s:g} s (its worker was killed)"
            if self.on_error == "stop":
                self._count(c.name, out, errors, timeouts, time.perf_counter() - t0)
                raise RewardError(f"reward component {c.name} ({c.what}) on task {task.id}: "
                                  f"{why}: fix it, or set reward.on_error unscorable")
            out.append(_Scored(None, {}, f"{status}: {why}"))
        self._count(c.name, out, errors, timeouts, time.perf_counter() - t0)
        if out and (errors + timeouts) / len(out) > self.max_error_frac:
            last = next(s.reason for s in reversed(out) if s.reason)
            raise RewardError(f"reward component {c.name} ({c.what}) failed on "
                              f"{errors + timeouts} of {len(out)} completions, above "
                              f"reward.max_error_frac {self.max_error_frac:g}; last: {last}")
        return out

    def _count(self, name: str, out: list[_Scored], errors: int, timeouts: int,
               seconds: float) -> None:
        if self.step is None:  # not a training step's batch (a held-out evaluation)
            return
        t = self._tally[name]
        t.values += [s.value for s in out if s.value is not None]
        t.none += sum(s.value is None for s in out)
        t.errors, t.timeouts, t.seconds = t.errors + errors, t.timeouts + timeouts, \
            t.seconds + seconds

    def _combine(self, i: int, per: list[list[_Scored]], exec_rewards: list[Reward] | None,
                 tasks: list[Task]) -> Reward:
        values = [scored[i].value for scored in per]
        if self.aggregation == "normalize":
            values = [normalized(scored, i, tasks) for scored in per]
        value = weighted_sum(values, self.weights)
        parts: dict[str, float | None] = {}
        details: dict[str, Any] = {}
        reasons = []
        for name, scored in zip(self.names, per, strict=True):
            s = scored[i]
            parts[name] = s.value
            parts.update({f"{name}/{k}": v for k, v in s.parts.items()})
            if s.details:
                details[name] = s.details
            if s.reason:
                reasons.append(f"{name}: {s.reason}")
        if exec_rewards is not None:  # pass@k and the curriculum read the exec verdict here
            d = exec_rewards[i].details
            if "tests" in d:
                details["tests"] = d["tests"]
                details["all_passed"] = bool(d.get("total")) and d.get("passed") == d.get("total")
        return Reward(value, parts, "; ".join(reasons), details)

    # reporting ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for _, _, fn in self.builtins:
            out.update(fn.metrics())
        for name, t in self._tally.items():
            n = len(t.values) + t.none
            if not n and not t.errors:
                continue
            vals = np.array(t.values, dtype=np.float64)
            out.update({f"reward/{name}/mean": float(vals.mean()) if len(vals) else math.nan,
                        f"reward/{name}/std": float(vals.std()) if len(vals) else math.nan,
                        f"reward/{name}/frac_none": t.none / n if n else 0.0,
                        f"reward/{name}/errors": float(t.errors),
                        f"reward/{name}/timeouts": float(t.timeouts),
                        f"reward/{name}/seconds": t.seconds})
        self._tally = {n: _Tally() for n in self.names}
        self.step = None
        return out

    def stop_reason(self) -> str | None:
        for _, _, fn in self.builtins:
            reason = getattr(fn, "stop_reason", lambda: None)()
            if reason:
                return reason
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for _, _, fn in self.builtins:
            fn.close()
        for c in self.customs:
            c.close()


def weighted_sum(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The sum of weight x value over the trained components (weight > 0) that are not None;
    None when there are none."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w > 0]
    return sum(v * w for v, w in pairs) if pairs else None


def normalized(scored: list[_Scored], i: int, tasks: list[Task]) -> float | None:
    """Completion i's value standardized over its group's values that are not None (0 where
    they do not vary)."""
    if scored[i].value is None:
        return None
    group = [scored[j].value for j, t in enumerate(tasks) if t.id == tasks[i].id]
    vals = np.array([v for v in group if v is not None], dtype=np.float64)
    std = float(vals.std())
    return 0.0 if std < 1e-8 else (scored[i].value - float(vals.mean())) / std


__all__ = ["ComponentsReward", "Custom", "normalized", "shown", "weighted_sum"]
