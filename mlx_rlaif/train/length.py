"""How long a run is: the step it ends at, from training.max_steps, training.num_epochs and
training.max_minutes, and the one line that says so at the start (RL and SFT alike).

- `max_steps` alone is the number of steps: the task file cycles as often as needed (the
  convention of Hugging Face's `max_steps` and mlx-lm's `--iters`).
- `num_epochs` alone is that many epochs. `num_epochs: 0` (the default) means one epoch, or as
  many as max_steps (or max_minutes) needs: it only bounds a run where it is set.
- Both set: whichever ends first, and the start line says which.
- `max_minutes` ends the run at the step that passes the budget, or earlier at the step bound;
  alone (no max_steps, num_epochs 0) it is the only bound: no step count is known in advance,
  so the progress display counts time, and a cosine schedule, which needs a horizon, is refused
  by the config check.

An epoch here is `ceil(tasks / prompts per step)` steps: one pass over the file in a fixed
order. With dynamic sampling (a step may draw more tasks than it trains on) or the curriculum
(tasks drawn by pass rate) `num_epochs` stays that step count; the `epoch` metric and
epochs.jsonl count the passes the task stream actually made, which may be more.

Not covered: where the run is within its steps (the loop), the learning-rate schedule (its
horizon is the step count fixed at the run's first launch: trainer.schedule_horizon).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunLength:
    """The step a run ends at (None: only the time budget ends it), the time budget in
    minutes (0: none) and the start line."""

    steps: int | None
    minutes: float
    line: str


def run_length(t: Any, per_epoch: int, items: str) -> RunLength:
    """From the training section `t` and the steps of one epoch (`per_epoch`, over `items`, e.g.
    "the 8 tasks at 3 prompts a step")."""
    per_epoch = max(per_epoch, 1)
    by_epochs = t.num_epochs * per_epoch if t.num_epochs else None
    steps: int | None
    if t.max_steps and by_epochs is not None:
        steps = min(t.max_steps, by_epochs)
        first = "training.max_steps" if t.max_steps <= by_epochs else "training.num_epochs"
        line = (f"the run ends at step {steps}, whichever of training.max_steps = {t.max_steps} "
                f"and training.num_epochs = {t.num_epochs} ({by_epochs} steps) comes first: "
                f"{first} (epochs of {per_epoch} steps over {items})")
    elif t.max_steps:
        steps = t.max_steps
        line = f"{steps} steps (training.max_steps): {_passes(steps, per_epoch)} over {items}"
    elif by_epochs is not None:
        steps = by_epochs
        line = f"{steps} steps: {_epochs(t.num_epochs)} of {per_epoch} steps over {items}"
    elif t.max_minutes:
        steps = None
        line = (f"training for {t.max_minutes:g} min (training.max_minutes), cycling {items} "
                "as often as needed")
    else:
        steps = per_epoch
        line = (f"{steps} steps: 1 epoch over {items} (training.max_steps or "
                "training.num_epochs for more)")
    if t.max_minutes and steps is not None:
        line += (f"; or at the step that passes {t.max_minutes:g} min of training "
                 "(training.max_minutes), if that comes first")
    return RunLength(steps, t.max_minutes, line)


def _passes(steps: int, per_epoch: int) -> str:
    whole, part = divmod(steps, per_epoch)
    if not whole:
        return f"{part} of the {per_epoch} steps of an epoch"
    return f"{_epochs(whole)} of {per_epoch} steps" + (f" and {part} more" if part else "")


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")
