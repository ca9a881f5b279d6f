"""Setting up and running a training run: `train(cfg, ...)` checks the inputs, loads the tasks,
the reward, the model and its optimizer, resumes a checkpoint, evaluates the held-out tasks
before and after, and runs the loop (loop.py). Every check that can fail on user input runs
before anything is written (`prepare`; the memory plan, `memory_plan.resolve`, once the model is
loaded: the run uses the config it resolves).

On `--resume`, the loop state comes from the checkpoint (data cursor, baselines, the KL penalty
the adaptive controller reached). A setting the user changed since the checkpoint wins over the
saved state, with a printed line (`resumed_state`): today that is `rl.kl_penalty`.

Not covered: several processes (data parallel), changing the model or LoRA shape on resume
(refused by the checkpoint loader).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..artifacts import checkpoint
from ..artifacts.atomic import write_json_atomic
from ..backends.ops import OPS
from ..backends.sampling import prompt_formatter
from ..config import Config, dump, prompts_per_step, to_dict
from ..data import TaskOrder, load_tasks
from ..errors import ConfigError
from ..records import Task
from ..rewards.build import build_reward
from .evaluate import evaluate_tasks
from .loop import loop
from .memory_plan import resolve
from .run import Run
from .step import sample_records

EVAL_FILE = "eval.json"  # held-out evaluations of the run: {"before": {...}, "after": {...}}


def prepare(cfg: Config, run_dir: Path, resume_from: Path | None):
    """All checks that can fail on user input, before anything is written."""
    from ..config import check

    check(cfg)
    d = cfg.data
    tasks = load_tasks(d.train_file, d.languages, d.max_tasks, d.difficulties)
    eval_tasks = load_tasks(d.eval_file, d.languages, 0, d.difficulties) if d.eval_file else []
    if resume_from is None and checkpoint.list_checkpoints(run_dir):
        raise ConfigError(f"output dir {run_dir} already holds a run: pass --resume to continue "
                          "it or choose another --output-dir")
    langs = {t.language for t in tasks + eval_tasks}
    reward_fn = build_reward(cfg, run_dir, languages=langs)
    return tasks, eval_tasks, reward_fn


def total_steps(cfg: Config, n_tasks: int) -> int:
    per_epoch = TaskOrder(n_tasks, cfg.training.seed).batches_per_epoch(prompts_per_step(cfg))
    total = per_epoch * cfg.training.num_epochs
    return min(total, cfg.training.max_steps) if cfg.training.max_steps else total


def schedule_horizon(cfg: Config, steps: int, saved: checkpoint.LoopState | None) -> int:
    """Optimizer updates the learning-rate schedule spans: fixed at the run's first launch
    (saved in its checkpoints), so a resume continues the same schedule whatever
    training.max_steps it is given (checkpoints from before 0.2 carry none: this launch's)."""
    if saved is not None and saved.total_updates:
        return saved.total_updates
    return steps * cfg.rl.num_iterations


def resumed_state(saved: checkpoint.LoopState, cfg: Config, saved_cfg: Config | None,
                  say: Any) -> checkpoint.LoopState:
    """The loop state to continue from: the checkpoint's, except where the user changed a
    setting since (the new value wins, and `say` prints one line saying so)."""
    new, old = cfg.rl.kl_penalty, (saved_cfg.rl.kl_penalty if saved_cfg else None)
    if old is not None and new != old:
        say(f"rl.kl_penalty = {new} (changed since the checkpoint) replaces the saved "
            f"{saved.kl_penalty:g}")
        return replace(saved, kl_penalty=new)
    return saved


def saved_config(ckpt: Path) -> Config | None:
    """The config a checkpoint was written with (None where it has none or it no longer loads)."""
    from ..config import load

    path = Path(ckpt) / "config.yaml"
    try:
        return load(path) if path.is_file() else None
    except ConfigError:
        return None


def train(cfg: Config, resume_from: Path | None = None, interactive: bool = False,
          hub: Any = None) -> Path:
    """Run (or resume) training; returns the run directory."""
    run_dir = Path(cfg.training.output_dir)
    tasks, eval_tasks, reward_fn = prepare(cfg, run_dir, resume_from)
    ops = OPS[cfg.model.backend]()
    policy = ops.load(cfg)
    try:  # the memory plan: a run that cannot fit stops here
        user_cfg, (cfg, memory_line) = cfg, resolve(cfg, getattr(policy, "model", None),
                                                    tasks + eval_tasks,
                                                    prompt_formatter(policy.tokenizer, cfg.model))
    except ConfigError:
        reward_fn.close()
        raise
    steps = total_steps(cfg, len(tasks))
    saved = checkpoint.load_state(resume_from) if resume_from is not None else None
    horizon = schedule_horizon(cfg, steps, saved)
    optimizer = ops.optimizer(policy, cfg, horizon)
    state = checkpoint.LoopState(kl_penalty=cfg.rl.kl_penalty, total_updates=horizon)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.clean_partial(run_dir)
    if hub is None:
        from ..metrics import MetricsHub

        hub = MetricsHub.create(cfg.logging, run_dir, interactive, steps, hparams(cfg),
                                resume=resume_from is not None)
    try:
        hub.message(memory_line)
        if resume_from is not None:
            state = resumed_state(ops.restore(policy, optimizer, resume_from), cfg,
                                  saved_config(resume_from), hub.message)
            if cfg.training.lr_schedule == "cosine" and horizon != steps * cfg.rl.num_iterations:
                hub.message(f"the learning-rate schedule keeps the horizon of the run's first "
                            f"launch ({horizon} updates), whatever training.max_steps says now")
            state = replace(state, total_updates=horizon)
        (run_dir / "config.yaml").write_text(dump(user_cfg))  # the plan is made again on resume
        run = Run(cfg, ops, policy, optimizer, reward_fn, run_dir, state,
                  prompt_formatter(policy.tokenizer, cfg.model))
        if eval_tasks and "before" not in read_evals(run_dir):
            held_out_eval(run, eval_tasks, hub, "before")
        loop(run, tasks, steps, hub)
        if eval_tasks and run.stop is None:
            held_out_eval(run, eval_tasks, hub, "after")
    finally:
        reward_fn.close()
        hub.close()
    return run_dir


def held_out_eval(run: Run, tasks: list[Task], hub: Any, when: str) -> dict[str, float]:
    """pass@1 and mean reward on the held-out tasks, kept in eval.json under `when`
    ("before" training or "after" it) and reported to the hub."""
    d, records = run.cfg.data, []
    res = evaluate_tasks(run.ops.sample, run.policy, tasks, run.reward_fn, run.cfg,
                         n=d.eval_samples, seed=run.cfg.training.seed,
                         temperature=d.eval_temperature,
                         on_scored=lambda rs, rws: records.extend(
                             sample_records(run.state.step, rs, rws, split="evaluation")))
    hub.log_samples(run.state.step, records)
    summary = {"step": run.state.step, "tasks": res["n_tasks"], "samples_per_task": d.eval_samples,
               "temperature": d.eval_temperature, "pass@1": res["pass@1"],
               "reward_mean": res["reward_mean"]}
    evals = {**read_evals(run.run_dir), when: summary}
    write_json_atomic(run.run_dir / EVAL_FILE, evals)
    line = (f"held-out eval {when} training ({res['n_tasks']} tasks x {d.eval_samples}, "
            f"T={d.eval_temperature}): pass@1 {res['pass@1']:.3f}, mean reward "
            f"{res['reward_mean']:.3f}")
    if when == "after" and "before" in evals:
        gain = 100 * (res["pass@1"] - evals["before"]["pass@1"])
        line += f" (before: {evals['before']['pass@1']:.3f}, {gain:+.1f} points)"
    hub.message(line)
    return summary


def read_evals(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / EVAL_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def hparams(cfg: Config) -> dict:
    """The config flattened to dotted keys (TensorBoard's hparams, the dataset card)."""
    flat: dict = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and k != "criteria":
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)

    walk(to_dict(cfg), "")
    return flat
