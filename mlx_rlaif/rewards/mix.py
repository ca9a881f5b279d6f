"""A weighted mix of reward functions, e.g. exec tests and a teacher judge.

Covered: `MixReward([(reward_fn, weight), ...])`. A completion's value is the weighted mean of the
parts whose value is not None, the weights renormalised over those parts (so a teacher outage
leaves the exec reward in charge instead of pulling the value toward 0); it is None only when
every part is None. Parts are namespaced by the part's name (`exec`, `teacher/correctness`,
...); details are kept per part; metrics are the parts' own (already namespaced). The parts score
the batch concurrently: the first in the calling thread, the others in worker threads, so a
teacher's network wait overlaps the sandbox runs. `stop_reason()` passes on the first part's
reason to stop (a teacher budget). With an `exec` and a `teacher` part, the judge is compared
with the exec reward over the last `window` batches (agreement.py): `teacher/exec_corr`
(Spearman), `teacher/best_disagree`, `teacher/fail_over_pass` and `teacher/exec_pairs` join the
metrics, so a judge that starts paying for failing code shows during training.

Not covered: non-linear combinations, per-task weights, parts whose scales differ (every
built-in reward is in [0, 1]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import ConfigError
from ..records import Reward, Task
from .agreement import AgreementWindow
from .base import RewardFn


class MixReward:
    name = "mix"

    def __init__(self, parts: Sequence[tuple[RewardFn, float]], window: int = 10) -> None:
        if not parts:
            raise ConfigError("a mixed reward needs at least one part")
        for fn, w in parts:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                    or w < 0:
                raise ConfigError(f"reward weight of {fn.name} = {w!r}: use a finite number >= 0")
        if sum(w for _, w in parts) <= 0:
            raise ConfigError("reward weights sum to 0: give at least one part a positive weight")
        self.parts = [(fn, float(w)) for fn, w in parts]
        self.names = _unique([fn.name for fn, _ in parts])
        self._pool = ThreadPoolExecutor(max(1, len(parts) - 1), thread_name_prefix="reward-mix")
        both = "exec" in self.names and "teacher" in self.names
        self._agreement = AgreementWindow(window) if both else None

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]:
        rest = [self._pool.submit(fn.score, tasks, completions) for fn, _ in self.parts[1:]]
        first = self.parts[0][0].score(tasks, completions)
        per_part = [first] + [f.result() for f in rest]
        if self._agreement is not None:
            by_name = dict(zip(self.names, per_part, strict=True))
            self._agreement.add([t.id for t in tasks], by_name["exec"],
                                [r.value for r in by_name["teacher"]])
        return [self._combine([rs[i] for rs in per_part]) for i in range(len(tasks))]

    def _combine(self, rewards: list[Reward]) -> Reward:
        value = mix_values([r.value for r in rewards], [w for _, w in self.parts])
        named = list(zip(self.names, rewards, strict=True))
        parts: dict[str, float | None] = {}
        for name, r in named:
            parts[name] = r.value
            parts.update({f"{name}/{k}": v for k, v in r.parts.items()})
        reason = "; ".join(f"{name}: {r.reason}" for name, r in named)
        details = {name: dict(r.details) for name, r in named}
        return Reward(value, parts, reason, details)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for fn, _ in self.parts:
            out.update(fn.metrics())
        if self._agreement is not None:
            out.update(self._agreement.metrics())
        return out

    def stop_reason(self) -> str | None:
        for fn, _ in self.parts:
            reason = getattr(fn, "stop_reason", lambda: None)()
            if reason:
                return reason
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for fn, _ in self.parts:
            fn.close()


def mix_values(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """Weighted mean over the values that are not None (and have weight > 0); None if none."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w > 0]
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    return sum(v * w for v, w in pairs) / total


def _unique(names: list[str]) -> list[str]:
    """Names made unique by suffixing repeats (`teacher`, `teacher_2`)."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return out
