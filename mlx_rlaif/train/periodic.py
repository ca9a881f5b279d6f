"""Held-out evaluation during training (`data.eval_every`) and the best checkpoint
(`training.keep_best`).

Every `eval_every` steps the loop calls `periodic_eval`: pass@1 and mean reward on the held-out
tasks (`data.eval_file`, or the same seeded subset of `data.eval_max_tasks` of them each time),
sampled by the backend's own sampler (`run.ops.sample`, as the before/after evaluation in
trainer.py), with `data.eval_samples` samples per task at `data.eval_temperature` and the run's
seed, so every evaluation of a run draws from the same random stream. The row goes to
eval.jsonl, TensorBoard (`eval/pass@1`, `eval/reward_mean`) and the dashboard (hub.log_eval).
Training is not perturbed: each step seeds its own sampling.

With `keep_best`, an evaluation that beats the best so far (pass@1, ties broken by mean reward)
marks the checkpoint of that step as the best (saving one if none was written at that step) in
checkpoints/best.json; retention never deletes it. On resume, the rows of steps after the
checkpoint are dropped (the resumed run does those steps again) and an evaluation due at the
checkpoint's own step that has no row yet (a crash during it) runs first: no row is lost or
written twice.

With several ranks the evaluation is sharded over them (each its share of the tasks), rank 0
alone writes eval.jsonl and the best checkpoint, and decides from its files on resume.

Not covered: early stopping on the held-out score, evaluating with another reward than the run's,
the periodic evaluations' completions in the collected dataset (the before/after ones are).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import checkpoint
from ..config import prompts_per_step
from ..metrics.jsonl import read_jsonl, trim_after
from ..records import Task
from .distributed_metrics import merge_eval
from .evaluate import evaluate_tasks
from .run import Run, save, saved_at

EVAL_LOG = "eval.jsonl"


def eval_subset(tasks: Sequence[Task], max_tasks: int, seed: int) -> list[Task]:
    """At most `max_tasks` of `tasks` (0: all), a seeded choice kept in file order."""
    if not max_tasks or max_tasks >= len(tasks):
        return list(tasks)
    picked = np.random.default_rng([seed, 22]).choice(len(tasks), max_tasks, replace=False)
    return [tasks[i] for i in sorted(picked.tolist())]


def is_due(step: int, every: int) -> bool:
    return every > 0 and step > 0 and step % every == 0


def periodic_eval(run: Run, tasks: Sequence[Task], hub: Any, epoch: int, batch: int) -> dict | None:
    """Evaluate when the step just done is due; `epoch` and `batch` name a checkpoint saved for
    a new best. Returns the row written, or None when no evaluation was due."""
    d, step = run.cfg.data, run.state.step
    if not tasks or not is_due(step, d.eval_every):
        return None
    res = evaluate_tasks(run.ops.sample, run.policy, run.world.share(tasks), run.reward_fn,
                         run.cfg, n=d.eval_samples, seed=run.world.rank_seed(run.cfg.training.seed),
                         temperature=d.eval_temperature)
    res = merge_eval(run.world, res, [])[0]
    row: dict[str, Any] = {"eval/pass@1": res["pass@1"], "eval/reward_mean": res["reward_mean"],
                           "eval/tasks": res["n_tasks"], "eval/samples_per_task": d.eval_samples,
                           "eval/temperature": d.eval_temperature}
    if run.cfg.training.keep_best and run.world.rank == 0:
        name = checkpoint.checkpoint_name(epoch, batch, step)
        row["new_best"] = keep_if_best(run, hub, row, name)
    hub.log_eval(step, row)
    return row


def score(row: dict) -> tuple[float, float]:
    """What "best" compares: pass@1, then mean reward (a missing or NaN value ranks lowest)."""

    def num(key: str) -> float:
        x = row.get(key)
        return x if isinstance(x, (int, float)) and math.isfinite(x) else -math.inf

    return num("eval/pass@1"), num("eval/reward_mean")


def keep_if_best(run: Run, hub: Any, row: dict, name: str) -> bool:
    """Mark this step's checkpoint (saved now unless one exists) as the best when `row` beats
    the recorded best; the previous best becomes an ordinary checkpoint again."""
    best = checkpoint.read_best(run.run_dir)
    if best is not None and score(best) >= score(row):
        return False
    step = run.state.step
    path = checkpoint.latest_checkpoint(run.run_dir) if saved_at(run, step) else None
    path = path or save(run, hub, name)
    checkpoint.mark_best(run.run_dir, path, {"step": step, **row})
    checkpoint.prune(run.run_dir, run.cfg.training.save_total_limit)
    hub.message(f"best held-out pass@1 so far ({row['eval/pass@1']:.3f} at step {step}): "
                f"{path} (named in checkpoints/{checkpoint.BEST})")
    return True


def resume_history(run: Run, tasks: Sequence[Task], hub: Any) -> None:
    """On resume: drop eval.jsonl rows after the checkpoint's step, then run an evaluation due
    at that step whose row is missing."""
    path, step = Path(run.run_dir) / EVAL_LOG, run.state.step

    def trimmed() -> list:  # rank 0's file (the other ranks write none)
        trim_after(path, "step", step)
        return [r.get("step") for r in read_jsonl(path)]

    done = set(run.world.first(trimmed))
    if tasks and is_due(step, run.cfg.data.eval_every) and step not in done:
        s = run.state
        periodic_eval(run, tasks, hub, s.epoch + 1, s.cursor // prompts_per_step(run.cfg))
