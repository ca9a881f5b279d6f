"""The loop over steps: the data order and cursor, the baseline reward, Ctrl-C, logging and
checkpoints, until `steps` steps are done or a stop (a teacher's 401/403, the budget, Ctrl-C).

Not covered: the step's contents (step.py), setting up a run (trainer.py).
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..artifacts import checkpoint
from ..config import prompts_per_step
from ..data import TaskOrder
from ..errors import TeacherError
from ..records import Task
from .run import Run, maybe_save, save, saved_at
from .step import rl_step, sample_records, step_seed


def loop(run: Run, tasks: list[Task], steps: int, hub: Any) -> None:
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
    while run.state.step < steps:
        s = run.state
        idx = order.batch(s.epoch, s.cursor, P)
        try:
            metrics, samples = rl_step(run, [tasks[i] for i in idx])
        except TeacherError as e:
            run.stop = str(e)
            break
        cursor = s.cursor + len(idx)
        epoch_end = cursor >= len(tasks)
        run.state = replace(run.state, epoch=s.epoch + epoch_end, cursor=0 if epoch_end else cursor)
        run.state = track_reward(run.state, metrics.get("reward/mean"))
        metrics.update({"epoch": float(s.epoch + 1), "batch": float(s.cursor // P + 1)})
        if cfg.training.max_memory_gb:  # the memory plan's budget (train/memory_plan.py)
            metrics["memory/budget_gb"] = cfg.training.max_memory_gb
        hub.log_step(run.state.step, metrics)
        hub.log_samples(run.state.step, samples)
        stop = getattr(run.reward_fn, "stop_reason", lambda: None)()
        run.stop = stop or ("interrupted" if interrupted() else None)
        if epoch_end:
            hub.end_epoch(s.epoch + 1)
        maybe_save(run, hub, s.epoch + 1, s.cursor // P + 1, epoch_end)
        if run.stop:
            break
    if run.stop:
        hub.message(f"stopping: {run.stop}; checkpoint saved")
        save(run, hub, checkpoint.checkpoint_name(run.state.epoch + 1, None, run.state.step,
                                                  final=True))
    elif steps and not saved_at(run, run.state.step):
        save(run, hub, checkpoint.checkpoint_name(0, None, run.state.step, final=True))


def baseline(run: Run, tasks: list[Task], order: TaskOrder, hub: Any) -> float:
    """Mean reward of the first N batches, sampled before any update; their completions are the
    dataset's validation split."""
    cfg, values = run.cfg, []
    for b in range(cfg.logging.baseline_eval_batches):
        idx = order.batch(0, b * cfg.training.batch_size, cfg.training.batch_size)
        if not idx:
            break
        rollouts, _ = run.sample([tasks[i] for i in idx], step_seed(cfg.training.seed + 1, b))
        rewards = run.reward_fn.score([r.task for r in rollouts], [r.text for r in rollouts])
        values += [r.value for r in rewards if r.value is not None]
        hub.log_samples(0, sample_records(0, rollouts, rewards, split="validation"))
    return float(np.mean(values)) if values else float("nan")


def track_reward(state: checkpoint.LoopState, reward: float | None) -> checkpoint.LoopState:
    if reward is None or not math.isfinite(reward):
        return state
    best = reward if state.best_reward is None else max(state.best_reward, reward)
    base = state.baseline_reward if state.baseline_reward is not None else reward
    return replace(state, best_reward=best, baseline_reward=base)


def install_sigint() -> Callable[[], bool]:
    """First Ctrl-C: finish the step, save, stop. Second: stop at once."""
    hit = {"n": 0}
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        hit["n"] += 1
        if hit["n"] > 1:
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        print("\nCtrl-C: finishing this step, then saving a checkpoint (again to abort)",
              flush=True)

    with contextlib.suppress(ValueError):  # not the main thread: no handler
        signal.signal(signal.SIGINT, handler)
    return lambda: hit["n"] > 0
