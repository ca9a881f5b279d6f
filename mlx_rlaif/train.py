"""The RL loop: sample -> score -> advantages -> clipped policy-gradient update, on one set of
MLX weights in one process.

`rl_step` is one step, readable on one screen. `train(cfg, ...)` sets up (tasks, reward, model,
optimizer, run directory), loops over steps, checkpoints, and resumes. The reference model is the
policy with its LoRA layers bypassed (`lora_disabled`); with `kl_penalty = 0` no reference
forward runs. The update changes the arrays the next rollout samples from: there is no
weight-sync step.

Not covered: multi-device training, asynchronous (off-policy) rollouts, value models.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from . import advantages, checkpoint
from .config import Config, dump
from .data import TaskOrder, load_tasks
from .errors import ConfigError, TeacherError
from .ops import OPS, Ops, mlx_ops
from .records import Reward, Rollout, Task
from .rewards.base import RewardFn
from .rewards.build import build_reward
from .rollout import SamplingParams, prompt_formatter
from .update import make_optimizer, reference_logprobs, update  # noqa: F401  (public API)

EVAL_FILE = "eval.json"  # held-out evaluations of the run: {"before": {...}, "after": {...}}


@dataclass
class Run:
    """Everything a step needs. `state` is replaced (frozen LoopState) after each step."""

    cfg: Config
    policy: Any  # backends.mlx.Policy, or backends.torch.TorchPolicy
    reward_fn: RewardFn
    optimizer: Any
    run_dir: Path
    state: checkpoint.LoopState
    format: Callable[[Task], list[int]]
    skipped: int = 0
    stop: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ops: Ops = field(default_factory=lambda: mlx_ops())


# --- one step ------------------------------------------------------------------------------------


def rl_step(run: Run, tasks: list[Task]) -> tuple[dict[str, float], list[dict]]:
    cfg, ops, beta = run.cfg, run.ops, run.state.kl_coef
    t0 = time.perf_counter()
    rollouts, gen = ops.sample(run, tasks, _step_seed(cfg.training.seed, run.state.step))
    t1 = time.perf_counter()
    rewards = run.reward_fn.score([r.task for r in rollouts], [r.text for r in rollouts])
    t2 = time.perf_counter()
    values = [rw.value for rw in rewards]
    ref, kl_seq = None, {}
    if beta > 0 and cfg.rl.kl_in_reward:
        ref = ops.reference(run, rollouts)
        k1 = [np.subtract(r.logprobs, q) for r, q in zip(rollouts, ref, strict=True)]
        values = [None if v is None else v - beta * float(k.sum()) for v, k in zip(values, k1, strict=True)]
        kl_seq = {"kl/mean": float(np.concatenate(k1).mean()) if k1 else 0.0}
    adv = advantages.compute(values, [r.task.id for r in rollouts], cfg.rl.advantage,
                             cfg.rl.scale, cfg.rl.whiten, cfg.rl.drop_zero_std,
                             run.state.reinforce_baseline, cfg.rl.reinforce_decay)
    keep = [i for i in range(len(rollouts)) if adv.keep[i]
            and not (cfg.rl.mask_truncated and rollouts[i].truncated)]
    if beta > 0 and not cfg.rl.kl_in_reward and keep:
        ref = ops.reference(run, [rollouts[i] for i in keep])
    elif ref is not None:
        ref = [ref[i] for i in keep]
    upd = {**ops.update(run, [rollouts[i] for i in keep], adv.values[keep], ref), **kl_seq}
    t3 = time.perf_counter()
    run.state = replace(run.state, step=run.state.step + 1,
                        reinforce_baseline=adv.baseline,
                        kl_coef=_adapt_kl(cfg, beta, upd.get("kl/mean"), len(keep)))
    metrics = {**gen, **upd, **step_metrics(rollouts, rewards, adv, keep),
               "kl/coef": beta, "time/generate": t1 - t0, "time/score": t2 - t1,
               "time/train": t3 - t2, "time/step": t3 - t0,
               **run.reward_fn.metrics(), **_memory()}
    return metrics, sample_records(run, rollouts, rewards, adv.values)



# --- metrics -------------------------------------------------------------------------------------


def step_metrics(rollouts: list[Rollout], rewards: list[Reward], adv: advantages.Advantages,
                 keep: list[int]) -> dict[str, float]:
    vals = np.array([r.value for r in rewards if r.value is not None], dtype=np.float64)
    lens = np.array([len(r.tokens) for r in rollouts], dtype=np.float64)
    m = {
        "reward/mean": float(vals.mean()) if len(vals) else float("nan"),
        "reward/std": float(vals.std()) if len(vals) else float("nan"),
        "reward/min": float(vals.min()) if len(vals) else float("nan"),
        "reward/max": float(vals.max()) if len(vals) else float("nan"),
        "reward/frac_zero_std": adv.frac_zero_std,
        "reward/frac_none": float(1 - adv.valid.mean()),
        "gen/completion_len_mean": float(lens.mean()),
        "gen/truncated_frac": float(np.mean([r.truncated for r in rollouts])),
        "gen/diversity": len({r.text for r in rollouts}) / len(rollouts),
        "train/sequences": float(len(keep)),
    }
    for name in {k for r in rewards for k in r.parts}:
        parts = [r.parts.get(name) for r in rewards]
        parts = [p for p in parts if p is not None]
        if parts:
            m[f"reward/part/{name}"] = float(np.mean(parts))
    return m


def sample_records(run: Run, rollouts: list[Rollout], rewards: list[Reward], adv: np.ndarray,
                   split: str = "train") -> list[dict]:
    step = run.state.step
    return [{
        "step": step, "task_id": r.task.id, "prompt": r.task.prompt, "language": r.task.language,
        "completion": r.text, "reward": rw.value, "parts": dict(rw.parts),
        "advantage": float(a), "reason": rw.reason, "rationale": rw.details.get("rationale"),
        "truncated": r.truncated, "teacher_code": rw.details.get("teacher_code"),
        "teacher_score": rw.details.get("teacher_score"), "split": split,
    } for r, rw, a in zip(rollouts, rewards, adv, strict=True)]


def _memory() -> dict[str, float]:
    import psutil

    return {"memory/mlx_peak_gb": mx.get_peak_memory() / 1e9,
            "memory/rss_gb": psutil.Process().memory_info().rss / 1e9}


# --- small pure helpers ----------------------------------------------------------------------------


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31)


def _sampling(cfg: Config) -> SamplingParams:
    return SamplingParams.from_config(cfg.generation)


def _adapt_kl(cfg: Config, beta: float, kl: float | None, n: int) -> float:
    """Ziegler et al.'s proportional controller: beta *= 1 + clip(kl/target - 1, +-0.2) n/H."""
    if not cfg.rl.adaptive_kl or kl is None or beta == 0:
        return beta
    err = float(np.clip(kl / cfg.rl.kl_target - 1.0, -0.2, 0.2))
    return beta * (1.0 + err * n / cfg.rl.kl_horizon)


# --- the run ----------------------------------------------------------------------------------------


def prepare(cfg: Config, run_dir: Path, resume_from: Path | None):
    """All checks that can fail on user input, before anything is written."""
    from .config import check

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
    per_epoch = TaskOrder(n_tasks, cfg.training.seed).batches_per_epoch(cfg.training.batch_size)
    total = per_epoch * cfg.training.num_epochs
    return min(total, cfg.training.max_steps) if cfg.training.max_steps else total


def train(cfg: Config, resume_from: Path | None = None, interactive: bool = False,
          hub: Any = None) -> Path:
    """Run (or resume) training; returns the run directory."""
    run_dir = Path(cfg.training.output_dir)
    tasks, eval_tasks, reward_fn = prepare(cfg, run_dir, resume_from)
    ops = OPS[cfg.model.backend]()
    policy = ops.load(cfg)
    steps = total_steps(cfg, len(tasks))
    optimizer = ops.optimizer(policy, cfg, steps * cfg.rl.num_iterations)
    state = checkpoint.LoopState(kl_coef=cfg.rl.kl_penalty)
    if resume_from is not None:
        state = ops.restore(policy, optimizer, resume_from)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.clean_partial(run_dir)
    (run_dir / "config.yaml").write_text(dump(cfg))
    run = Run(cfg, policy, reward_fn, optimizer, run_dir, state,
              prompt_formatter(policy.tokenizer, cfg.model), ops=ops)
    if hub is None:
        from .metrics import MetricsHub

        hub = MetricsHub.create(cfg.logging, run_dir, interactive, steps, _hparams(cfg),
                                resume=resume_from is not None)
    try:
        if eval_tasks and cfg.model.backend != "mlx":
            hub.message("held-out eval: MLX backend only; run `mlx-rlaif eval` on a checkpoint")
            eval_tasks = []
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
    from .evaluate import evaluate_tasks

    d = run.cfg.data
    res = evaluate_tasks(run.policy, tasks, run.reward_fn, run.cfg, n=d.eval_samples,
                         seed=run.cfg.training.seed, temperature=d.eval_temperature)
    summary = {"step": run.state.step, "tasks": res["n_tasks"], "samples_per_task": d.eval_samples,
               "temperature": d.eval_temperature, "pass@1": res["pass@1"],
               "reward_mean": res["reward_mean"]}
    evals = {**read_evals(run.run_dir), when: summary}
    checkpoint.write_json_atomic(run.run_dir / EVAL_FILE, evals)
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


def loop(run: Run, tasks: list[Task], steps: int, hub: Any) -> None:
    cfg = run.cfg
    order = TaskOrder(len(tasks), cfg.training.seed, cfg.data.shuffle)
    P = cfg.training.batch_size
    per_epoch = order.batches_per_epoch(P)
    if run.state.baseline_reward is None and cfg.logging.baseline_eval_batches:
        run.state = replace(run.state, baseline_reward=baseline(run, tasks, order))
        hub.message(f"baseline reward: {run.state.baseline_reward:.4f}")
    if run.state.baseline_reward is not None:
        hub.set_baseline(run.state.baseline_reward,
                         f"baseline evaluation ({cfg.logging.baseline_eval_batches} batches)"
                         if cfg.logging.baseline_eval_batches else "first step's reward")
    interrupted = _install_sigint()
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
        run.state = _track_reward(run.state, metrics.get("reward/mean"))
        run.timings["reward_recent"] = _ema(run.timings.get("reward_recent"),
                                            metrics.get("reward/mean"))
        metrics.update({"epoch": float(s.epoch + 1), "batch": float(s.cursor // P + 1)})
        hub.log_step(run.state.step, metrics)
        hub.log_samples(run.state.step, samples)
        stop = getattr(run.reward_fn, "stop_reason", lambda: None)()
        run.stop = stop or ("interrupted" if interrupted() else None)
        if epoch_end:
            hub.end_epoch(s.epoch + 1)
        _maybe_save(run, hub, s.epoch + 1, s.cursor // P + 1, epoch_end, per_epoch)
        if run.stop:
            break
    if run.stop:
        hub.message(f"stopping: {run.stop}; checkpoint saved")
        save(run, hub, checkpoint.checkpoint_name(run.state.epoch + 1, None, run.state.step,
                                                  final=True))
    elif steps and not _saved_at(run, run.state.step):
        save(run, hub, checkpoint.checkpoint_name(0, None, run.state.step, final=True))


def baseline(run: Run, tasks: list[Task], order: TaskOrder) -> float:
    """Mean reward of the first N batches, sampled before any update."""
    cfg, values = run.cfg, []
    for b in range(cfg.logging.baseline_eval_batches):
        idx = order.batch(0, b * cfg.training.batch_size, cfg.training.batch_size)
        if not idx:
            break
        rollouts, _ = run.ops.sample(run, [tasks[i] for i in idx],
                                     _step_seed(cfg.training.seed + 1, b))
        rewards = run.reward_fn.score([r.task for r in rollouts], [r.text for r in rollouts])
        values += [r.value for r in rewards if r.value is not None]
    return float(np.mean(values)) if values else float("nan")


def _track_reward(state: checkpoint.LoopState, reward: float | None) -> checkpoint.LoopState:
    if reward is None or not math.isfinite(reward):
        return state
    best = reward if state.best_reward is None else max(state.best_reward, reward)
    base = state.baseline_reward if state.baseline_reward is not None else reward
    return replace(state, best_reward=best, baseline_reward=base)


def _ema(prev: float | None, x: float | None, decay: float = 0.8) -> float | None:
    if x is None or not math.isfinite(x):
        return prev
    return x if prev is None else decay * prev + (1 - decay) * x


def _maybe_save(run: Run, hub: Any, epoch: int, batch: int, epoch_end: bool,
                per_epoch: int) -> None:
    t, step = run.cfg.training, run.state.step
    if t.save_every_batches and step % t.save_every_batches == 0:
        save(run, hub, checkpoint.checkpoint_name(epoch, batch, step))
    elif epoch_end and t.save_every_epochs and epoch % t.save_every_epochs == 0:
        save(run, hub, checkpoint.checkpoint_name(epoch, None, step))


def _saved_at(run: Run, step: int) -> bool:
    latest = checkpoint.latest_checkpoint(run.run_dir)
    return latest is not None and checkpoint.checkpoint_step(latest) == step


def save(run: Run, hub: Any, name: str) -> Path:
    s = run.state
    recent = run.timings.get("reward_recent")
    gain = None if recent is None or s.baseline_reward is None else recent - s.baseline_reward
    summary = {"epoch": s.epoch, "global_step": s.step, "cursor": s.cursor,
               "baseline_reward": s.baseline_reward, "best_reward": s.best_reward,
               "reward_gain_from_baseline": gain}
    path = run.ops.save(run, name, {"checkpoint_summary.json": summary,
                                    "training_stats.json": hub.stats()})
    bits = run.cfg.training.save_mlx_model_bits
    if bits:
        from .export import write_mlx_model

        model, tokenizer = run.ops.mlx_model(run, path)
        write_mlx_model(model, tokenizer, path, None if bits == 16 else bits)
    checkpoint.prune(run.run_dir, run.cfg.training.save_total_limit)
    hub.message(f"saved {path}")
    return path


def _install_sigint() -> Callable[[], bool]:
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


def _hparams(cfg: Config) -> dict:
    from .config import to_dict

    flat: dict = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and k != "criteria":
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)

    walk(to_dict(cfg), "")
    return flat
