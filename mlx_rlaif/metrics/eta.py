"""When a run will end: the seconds left, from the steps' measured times and the run's ending
rule (train/length.py: the step bound of training.max_steps and training.num_epochs, and
training.max_minutes, whichever comes first).

A step costs the median of the recent steps (`RECENT` of them: a first step that compiles, or
one the machine slowed, moves it little) plus the periodic work (checkpoints, held-out
evaluations) spread over every step so far: their total over the steps done. The step bound
ends the run after the steps left at that cost; the time budget at the step that passes it,
so after `ceil(training time left / step cost)` steps. The earlier of the two is the ETA.

`StepClock` holds the measurements of this process (a resumed run starts measuring again);
`eta_seconds` is the pure arithmetic; `short` writes `12m30s` for the plain step lines.

Not covered: the held-out evaluation after the last step (its length is not known before it
runs), time paused on battery (not training time: the loop leaves it out of both clocks).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

RECENT = 20  # steps whose median is the step's cost


def step_cost(step_times: Sequence[float], periodic_s: float, steps_done: int) -> float | None:
    """Seconds a step costs: the median of `step_times` (the recent ones) plus `periodic_s`
    (every checkpoint and periodic evaluation so far) over `steps_done`; None before a step."""
    if not step_times or steps_done <= 0:
        return None
    return statistics.median(step_times) + periodic_s / steps_done


def eta_seconds(step_times: Sequence[float], periodic_s: float, steps_done: int,
                steps_left: int | None, budget_left_s: float | None) -> float | None:
    """Seconds until the run ends: `steps_left` (None: no step bound) at the step's cost, or,
    with a time budget (`budget_left_s` of training time left; None: none), the steps that pass
    it, whichever is sooner. None before a step has been measured or with neither bound."""
    cost = step_cost(step_times, periodic_s, steps_done)
    if cost is None:
        return None
    by_steps = max(0, steps_left) * cost if steps_left is not None else math.inf
    by_time = math.inf
    if budget_left_s is not None:
        by_time = math.ceil(max(0.0, budget_left_s) / cost) * cost if cost > 0 else 0.0
    out = min(by_steps, by_time)
    return None if math.isinf(out) else float(out)


@dataclass
class StepClock:
    """This process's step times (the last RECENT) and the periodic work's total."""

    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    periodic_s: float = 0.0
    steps: int = 0

    def step(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.steps += 1

    def periodic(self, seconds: float) -> None:
        self.periodic_s += max(0.0, seconds)

    def median(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def eta(self, steps_left: int | None, budget_left_s: float | None) -> float | None:
        return eta_seconds(list(self.recent), self.periodic_s, self.steps, steps_left,
                           budget_left_s)


def short(seconds: float | None) -> str:
    """`45s`, `12m30s`, `2h05m` (`-`: unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
