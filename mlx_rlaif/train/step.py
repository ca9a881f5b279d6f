"""One RL step: sample -> score -> advantages -> clipped policy-gradient update, readable on one
screen (`rl_step`), and the step's metrics and sample records.

The backend does the array work with explicit inputs (policy, optimizer, rollouts, advantages,
reference log-probs, KL penalty); this module holds the order of the phases and the bookkeeping.
With `kl_penalty = 0` no reference forward runs.

Not covered: the loop around it (loop.py), off-policy (asynchronous) rollouts.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..algo import advantages
from ..config import Config
from ..records import Reward, Rollout, Task
from .run import Run


def rl_step(run: Run, tasks: list[Task]) -> tuple[dict[str, float], list[dict]]:
    cfg, ops, kl_penalty = run.cfg, run.ops, run.state.kl_penalty
    t0 = time.perf_counter()
    rollouts, gen = sample_chunks(run, tasks)
    t1 = time.perf_counter()
    rewards = run.reward_fn.score([r.task for r in rollouts], [r.text for r in rollouts])
    t2 = time.perf_counter()
    scores = [rw.value for rw in rewards]
    values, ref, kl_seq = scores, None, {}
    if kl_penalty > 0 and cfg.rl.kl_in_reward:  # the KL goes into the reward, not the loss
        k1 = [np.subtract(r.logprobs, q)
              for r, q in zip(rollouts, ops.reference(run.policy, rollouts, cfg), strict=True)]
        values = [None if v is None else v - kl_penalty * float(k.sum())
                  for v, k in zip(scores, k1, strict=True)]
        kl_seq = {"kl/mean": float(np.concatenate(k1).mean()) if k1 else 0.0}
    adv = advantages.compute(values, [r.task.id for r in rollouts], cfg.rl.advantage,
                             cfg.rl.scale, cfg.rl.whiten, cfg.rl.drop_zero_std,
                             run.state.reinforce_baseline, cfg.rl.reinforce_decay,
                             task_rewards=scores)
    keep = [i for i in range(len(rollouts)) if adv.keep[i]
            and not (cfg.rl.mask_truncated and rollouts[i].truncated)]
    kept = [rollouts[i] for i in keep]
    if kl_penalty > 0 and not cfg.rl.kl_in_reward and keep:
        ref = ops.reference(run.policy, kept, cfg)
    upd, skipped = ops.update(run.policy, run.optimizer, kept, adv.values[keep], ref, cfg,
                              kl_penalty)
    t3 = time.perf_counter()
    run.state = replace(run.state, step=run.state.step + 1,
                        reinforce_baseline=adv.baseline, skipped=run.state.skipped + skipped,
                        kl_penalty=adapt_kl(cfg, kl_penalty, (kl_seq or upd).get("kl/mean"),
                                            len(keep)))
    metrics = {**gen, **upd, **kl_seq, **step_metrics(rollouts, rewards, adv, keep),
               "kl/penalty": kl_penalty, "optim/skipped": float(run.state.skipped),
               "time/generate": t1 - t0, "time/score": t2 - t1, "time/train": t3 - t2,
               "time/step": t3 - t0, **run.reward_fn.metrics()}
    return metrics, sample_records(run.state.step, rollouts, rewards, adv.values)


def sample_chunks(run: Run, tasks: list[Task]) -> tuple[list[Rollout], dict[str, float]]:
    """The step's rollouts, sampled `training.batch_size` prompts at a time (more than one
    chunk with gradient accumulation), the sampling stream seeded once per step."""
    P, seed = run.cfg.training.batch_size, step_seed(run.cfg.training.seed, run.state.step)
    rollouts, stats = [], {}
    for i in range(0, len(tasks), P):
        part, s = run.sample(tasks[i: i + P], seed if i == 0 else None)
        rollouts += part
        stats = s if not stats else merge_gen_stats(stats, s)
    return rollouts, stats


def merge_gen_stats(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Generation stats of two chunks sampled one after the other."""
    tokens, seconds = a["gen/tokens"] + b["gen/tokens"], a["gen/seconds"] + b["gen/seconds"]
    return {**a, "gen/tokens": tokens, "gen/seconds": seconds,
            "gen/tokens_per_sec": tokens / seconds if seconds > 0 else 0.0,
            "gen/decode_width": max(a["gen/decode_width"], b["gen/decode_width"]),
            "gen/decode_width_mean": (a["gen/decode_width_mean"] + b["gen/decode_width_mean"]) / 2}


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


def sample_records(step: int, rollouts: list[Rollout], rewards: list[Reward],
                   adv: np.ndarray | None = None, split: str = "train") -> list[dict]:
    """One record per completion (samples.jsonl, the dataset's `split`). `student_score` is the
    student's own score: the judge's rubric score where a teacher scored it (in ratio mode the
    reward is a ratio), else the reward."""
    adv = np.zeros(len(rollouts)) if adv is None else adv
    return [{
        "step": step, "task_id": r.task.id, "prompt": r.task.prompt, "language": r.task.language,
        "completion": r.text, "reward": rw.value, "parts": dict(rw.parts),
        "student_score": _detail(rw, "student_score", rw.value),
        "advantage": float(a), "reason": rw.reason, "rationale": _detail(rw, "rationale"),
        "truncated": r.truncated, "teacher_code": _detail(rw, "teacher_code"),
        "teacher_score": _detail(rw, "teacher_score"), "split": split,
    } for r, rw, a in zip(rollouts, rewards, adv, strict=True)]


def _detail(reward: Reward, key: str, default: object = None) -> object:
    """A detail of a reward, or of one of a mix's parts (details keyed by part name)."""
    if key in reward.details:
        return reward.details[key]
    found = [d[key] for d in reward.details.values() if isinstance(d, dict) and key in d]
    return found[0] if found else default


# --- small pure helpers ----------------------------------------------------------------------------


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31)


def adapt_kl(cfg: Config, kl_penalty: float, kl: float | None, n: int) -> float:
    """Ziegler et al.'s proportional controller: kl_penalty *= 1 + clip(kl/target - 1, +-0.2)
    n/H."""
    if not cfg.rl.adaptive_kl or kl is None or kl_penalty == 0:
        return kl_penalty
    err = float(np.clip(kl / cfg.rl.kl_target - 1.0, -0.2, 0.2))
    return kl_penalty * (1.0 + err * n / cfg.rl.kl_horizon)
