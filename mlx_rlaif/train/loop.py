"""The loop over steps: the data order and cursor, the baseline reward, Ctrl-C, logging,
checkpoints and the periodic held-out evaluation (periodic.py), until `steps` steps are done
(length.py: the task file cycles as often as they need), the step that passes
training.max_minutes, or a stop (a teacher's 401/403, the budget, Ctrl-C or SIGTERM: the step in
progress finishes, a checkpoint is saved, the run ends), or training.on_battery (laptop.py:
after a step, stop as the time budget does, or pause with a checkpoint written until AC power
returns; the pause is not training time). Each step's record also holds `dist/world_size` (the
ranks), `time/training_s` (the seconds training.max_minutes counts), `time/eta_s` (when the run
will end: metrics/eta.py) and, on macOS, the power and thermal readings (laptop.py).

With several ranks every rank draws the same tasks and takes its share (step.py); after the
step their metrics, records and stop reasons are gathered (distributed_metrics.sync_step), the
curriculum sees every rank's results, and rank 0's clock decides the time budget: every rank
stops at the same step.

Not covered: the step's contents (step.py), setting up a run (trainer.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..artifacts import checkpoint
from ..config import prompts_per_step
from ..data import TaskOrder
from ..data.curriculum import Stream
from ..errors import TeacherError
from ..metrics.eta import StepClock
from ..records import Reward, Rollout, Task
from .distributed import World
from .distributed_metrics import sync_step
from .laptop import PowerWatch, boundary
from .periodic import periodic_eval
from .run import Run, maybe_save, save, saved_at
from .step import rl_step, sample_records, score, step_seed


def loop(run: Run, tasks: list[Task], steps: int | None, hub: Any,
         eval_tasks: Sequence[Task] = ()) -> None:
    """Steps until `steps` (None: until training.max_minutes; length.py); `eval_tasks`:
    held-out tasks of the periodic evaluation."""
    cfg = run.cfg
    order = TaskOrder(len(tasks), cfg.training.seed, cfg.data.shuffle)
    P = prompts_per_step(cfg)
    if run.state.baseline_reward is None and cfg.logging.baseline_eval_batches:
        run.state = replace(run.state, baseline_reward=baseline(run, tasks, order, hub))
        hub.message(f"baseline reward: {run.state.baseline_reward:.4f}")
    if run.state.baseline_reward is not None:
        hub.set_baseline(run.state.baseline_reward,
                         f"baseline evaluation ({cfg.logging.baseline_eval_batches} batches)"
                         if cfg.logging.baseline_eval_batches else "first step's reward")
    interrupted = install_sigint()
    stream = Stream(tasks, order, run.state.epoch, run.state.cursor, run.curriculum)
    keys = cfg.data.curriculum_by
    observe = (lambda rs, ws: run.curriculum.observe(
        every_rank_values(run.world, pass_values(rs, ws), tasks), keys)) \
        if run.curriculum is not None else (lambda rs, ws: None)
    started, paused = time.monotonic(), 0.0  # paused on battery: not training time
    mark = started  # when the next step began (the clock is read twice a step)
    deadline = started + 60 * cfg.training.max_minutes if cfg.training.max_minutes else math.inf
    clock, watch = StepClock(), PowerWatch(cfg.training.on_battery, hub.message)
    while run.state.step < (math.inf if steps is None else steps):
        s = run.state
        try:
            metrics, samples = rl_step(run, stream.take, observe)
        except TeacherError as e:
            run.stop = str(e)
            break
        stop = getattr(run.reward_fn, "stop_reason", lambda: None)() or (
            "interrupted" if interrupted() else None)
        metrics, samples, stop = sync_step(run.world, metrics, samples, stop,  # every rank's
                                           run.world.digest(run.policy))
        epoch_end = stream.epoch > s.epoch
        run.state = replace(run.state, epoch=stream.epoch, cursor=stream.cursor)
        run.state = track_reward(run.state, metrics.get("reward/mean"))
        now = time.monotonic()
        clock.step(now - mark)
        metrics.update({"epoch": float(s.epoch + 1), "batch": float(s.cursor // P + 1),
                        "dist/world_size": float(run.world.size),
                        "time/training_s": now - started - paused, **watch.read(),
                        **eta_of(clock, steps, run.state.step, cfg.training,
                                 now - started - paused)})
        watch.slowed(now - mark, clock.median())
        if cfg.training.max_memory_gb:  # the memory plan's budget (train/memory_plan.py)
            metrics["memory/budget_gb"] = cfg.training.max_memory_gb
        hub.log_samples(run.state.step, samples)  # first: the health check names their tasks
        hub.log_step(run.state.step, metrics)
        run.stop = stop
        if epoch_end:  # the passes completed (dynamic sampling may complete several a step)
            hub.end_epoch(stream.epoch)
        maybe_save(run, hub, s.epoch + 1, s.cursor // P + 1, epoch_end)
        run.stop = run.stop or ("interrupted" if interrupted() else None)  # during the save
        if not run.stop:
            periodic_eval(run, eval_tasks, hub, s.epoch + 1, s.cursor // P + 1)
            run.stop = "interrupted" if interrupted() else None  # during the evaluation
        if run.stop:
            break
        end = time.monotonic()
        clock.periodic(end - now)  # logging, checkpoint, periodic evaluation
        if deadline < math.inf and run.world.first(lambda e=end - paused: e >= deadline):
            hub.message(f"time budget of {cfg.training.max_minutes:g} min reached after "
                        f"{run.state.step} steps")
            break
        on_battery_stop, waited = boundary(run, hub, watch, interrupted, s.cursor // P + 1)
        paused, mark = paused + waited, end + waited
        run.stop = "interrupted" if interrupted() else None  # during a pause
        if on_battery_stop or run.stop:
            break
    if run.stop:
        hub.message(f"stopping: {run.stop}; checkpoint saved")
        save(run, hub, checkpoint.checkpoint_name(run.state.epoch + 1, None, run.state.step,
                                                  final=True))
    elif steps != 0 and not saved_at(run, run.state.step):
        save(run, hub, checkpoint.checkpoint_name(0, None, run.state.step, final=True))
    interrupted.restore()


def eta_of(clock: StepClock, steps: int | None, step: int, t: Any, training_s: float
           ) -> dict[str, float]:
    """`time/eta_s`: the seconds until the step bound (`steps`) or training.max_minutes ends
    the run, whichever is sooner (metrics/eta.py); nothing before it can be known."""
    left = steps - step if steps is not None else None
    budget = 60 * t.max_minutes - training_s if t.max_minutes else None
    eta = clock.eta(left, budget)
    return {} if eta is None else {"time/eta_s": eta}


def pass_values(rollouts: list[Rollout], rewards: list[Reward]) -> list[tuple[Task, float]]:
    """(task, 1 if the completion passed every test else 0) per completion; the reward itself
    for tasks without tests (a teacher's score)."""
    from .evaluate import passed

    return [(r.task, float(passed(w)) if "tests" in w.details or "tests" in w.parts
             else float(w.value or 0.0)) for r, w in zip(rollouts, rewards, strict=True)]


def every_rank_values(world: World, values: list[tuple[Task, float]], tasks: list[Task]
                      ) -> list[tuple[Task, float]]:
    """Every rank's (task, value) pairs (one process: `values`), so that every rank's
    curriculum sees the same results and draws the same tasks."""
    if world.size == 1:
        return values
    by_id = {t.id: t for t in tasks}
    pairs = world.gather_flat([(t.id, v) for t, v in values], "exchange of pass rates")
    return [(by_id[i], v) for i, v in pairs]


def baseline(run: Run, tasks: list[Task], order: TaskOrder, hub: Any) -> float:
    """Mean reward of the first N batches, sampled before any update; their completions are the
    dataset's validation split."""
    cfg, values = run.cfg, []
    for b in range(cfg.logging.baseline_eval_batches):
        idx = order.batch(0, b * cfg.training.batch_size, cfg.training.batch_size)
        if not idx:
            break
        part, world = [tasks[i] for i in run.world.share(idx)], run.world  # this rank's share
        rollouts = run.sample(part, world.rank_seed(step_seed(cfg.training.seed + 1, b)))[0] \
            if part else []
        rewards = world.agreed(lambda r=rollouts: score(run, r), "check of the scoring")
        values += world.gather_flat([r.value for r in rewards if r.value is not None])
        hub.log_samples(0, world.gather_flat(sample_records(0, rollouts, rewards,
                                                            split="validation")))
    return float(np.mean(values)) if values else float("nan")


def track_reward(state: checkpoint.LoopState, reward: float | None) -> checkpoint.LoopState:
    if reward is None or not math.isfinite(reward):
        return state
    best = reward if state.best_reward is None else max(state.best_reward, reward)
    base = state.baseline_reward if state.baseline_reward is not None else reward
    return replace(state, best_reward=best, baseline_reward=base)


class StopSignals:
    """First Ctrl-C (SIGINT) or SIGTERM: finish the step, save, stop. Second: stop at once
    (KeyboardInterrupt). Calling it says whether one was received; `restore()` puts the
    previous handlers back."""

    def __init__(self) -> None:
        self.hits = 0
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            for s in self.previous:
                signal.signal(s, self._handler)

    def __call__(self) -> bool:
        return self.hits > 0

    def restore(self) -> None:
        with contextlib.suppress(ValueError, TypeError):  # not the main thread, or not ours
            for s, h in self.previous.items():
                signal.signal(s, h)

    def _handler(self, signum: int, frame: Any) -> None:
        self.hits += 1
        if self.hits > 1:
            self.restore()
            raise KeyboardInterrupt
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        # os.write, not print: a handler that prints while the loop prints fails (reentrant)
        with contextlib.suppress(OSError):
            os.write(sys.stdout.fileno(), f"\n{name}: finishing this step, then saving a "
                     "checkpoint (again to abort)\n".encode())


def install_sigint() -> StopSignals:
    """The stop handlers for SIGINT and SIGTERM (see StopSignals)."""
    return StopSignals()
