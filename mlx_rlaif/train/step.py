"""One RL step: sample -> score -> advantages -> clipped policy-gradient update, readable on one
screen (`rl_step`), and the step's metrics and sample records.

The backend does the array work with explicit inputs (policy, optimizer, rollouts, advantages,
reference log-probs, KL penalty); this module holds the order of the phases and the bookkeeping.
Advantages come from group baselines (`group_targets`) or, with `rl.advantage: gae`, from a
critic (`critic_targets`), of the rewards less DAPO's soft overlong penalty where it is on
(`shaped`; the test for signal reads the unshaped ones). With `kl_penalty = 0` no reference forward runs.

With several ranks (`run.world`: distributed.py) a step runs on this rank's share of the
prompts (with dynamic sampling, of the groups collected by every rank); the batch statistics,
the loss divisor and the gradients are summed over the ranks.

Not covered: the loop around it (loop.py), off-policy (asynchronous) rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from ..algo import advantages, overlong
from ..algo.distill import combined
from ..algo.gae import masked_gae, token_rewards, whiten
from ..config import Config, prompts_per_step
from ..faults import fault
from ..records import Reward, Rollout, Task
from ..rewards import signals as hacks
from . import distill
from .carry import Group
from .draws import apart, flatten, groups_of
from .dynamic import collect
from .guidance import guide
from .multiturn import hidden_tasks, shape, turn_metrics
from .run import Run


def rl_step(run: Run, draw: Callable[..., list[Task]],
            observe: Callable[[list[Rollout], list[Reward]], None] = lambda rs, ws: None
            ) -> tuple[dict[str, float], list[dict]]:
    """One step on the tasks `draw(n, across_epochs=False)` gives; `observe(rollouts, rewards)`
    sees every scored completion (a curriculum's pass rates)."""
    cfg, ops, kl_penalty = run.cfg, run.ops, run.state.kl_penalty
    t0 = time.perf_counter()
    fault("generate")
    groups, gen, extra, sampled = gather(run, draw, observe)
    rollouts, rewards, keys = flatten(groups)  # keys: one group per draw (draws.py)
    t2 = time.perf_counter()
    t1 = t0 + gen.get("gen/seconds", 0.0)
    fault("update")
    scores = [rw.value for rw in rewards]
    dist = distill.terms(run, rollouts, rewards, keys)  # None: distill.kind off
    targets = (critic_targets(run, rollouts, scores, kl_penalty, dist)
               if cfg.rl.advantage == "gae"
               else group_targets(run, rollouts, scores, kl_penalty, keys, dist))
    kept = [rollouts[i] for i in targets.keep]
    shard = run.world.shard([r.trained_tokens for r in kept])  # None on one machine
    upd, skipped = ops.update(run.policy, run.optimizer, kept, targets.adv, targets.ref, cfg,
                              kl_penalty, targets.critic, shard=shard)
    ops.advance_reference(run.policy, cfg, run.state.step + 1)
    t3 = time.perf_counter()
    run.state = replace(run.state, step=run.state.step + 1,
                        reinforce_baseline=targets.summary.baseline,
                        skipped=run.state.skipped + skipped,
                        kl_penalty=adapt_kl(cfg, kl_penalty, (targets.kl or upd).get("kl/mean"),
                                            shard.sequences if shard else len(kept)))
    metrics = {**gen, **upd, **targets.kl,
               **step_metrics(*(sampled if sampled[0] else (rollouts, rewards)),
                              targets.summary, targets.keep),
               "kl/penalty": kl_penalty, "optim/skipped": float(run.state.skipped),
               "time/generate": t1 - t0, "time/score": t2 - t1, "time/train": t3 - t2,
               "time/step": t3 - t0, **run.reward_fn.metrics(), **extra,
               **overlong_metrics(cfg, rollouts), **(dist.metrics if dist else {})}
    if cfg.generation.max_turns > 1:
        metrics.update(turn_metrics(rollouts, rewards))
    return metrics, sample_records(run.state.step, rollouts, rewards, targets.summary.values)


def score(run: Run, rollouts: list[Rollout]) -> list[Reward]:
    """The rewards of the rollouts' (last) answers: on the task, or with several turns on its
    hidden tests, shaped by the number of turns taken (multiturn.shape)."""
    fault("score")
    if hasattr(run.reward_fn, "step"):  # components: a user's function may take the step,
        run.reward_fn.step = run.state.step + 1  # numbered as batches.jsonl will number it
    gen, rl = run.cfg.generation, run.cfg.rl
    texts, G = [r.text for r in rollouts], gen.num_samples_per_prompt
    if gen.max_turns == 1:
        return apart([r.task for r in rollouts], texts, G, run.reward_fn.score)
    raw = apart(hidden_tasks(rollouts, gen.visible_tests), texts, G, run.reward_fn.score)
    return shape(raw, rollouts, gen.max_turns, rl.turn_discount, rl.early_pass_bonus)


@dataclass(frozen=True)
class Targets:
    """What the update trains on: the kept rollouts (indices), their advantages (one number, or
    with a critic one array per token), the reference log-probs for the loss's KL term (None:
    no KL in the loss), a critic's returns and old values, KL metrics measured on the way, and
    the per-rollout summary the metrics and records use."""

    keep: list[int]
    adv: list
    ref: list[np.ndarray] | None
    critic: dict[str, list[np.ndarray]] | None
    kl: dict[str, float]
    summary: advantages.Advantages


def kl_k1(run: Run, rollouts: list[Rollout], ref: list[np.ndarray]) -> list[np.ndarray]:
    """k1 = logp - ref_logp per token, logp the sampler's (0 on a conversation's feedback
    tokens, which are not the student's)."""
    return [np.subtract(r.logprobs, q) * (1 if r.mask is None else np.asarray(r.mask))
            for r, q in zip(rollouts, ref, strict=True)]


def student_k1(rollouts: list[Rollout], k1: list[np.ndarray]) -> np.ndarray:
    """The k1 of the student's tokens of every rollout, flat (a conversation's feedback tokens
    left out: they are not the policy's, so not part of its KL)."""
    parts = [k if r.mask is None else k[np.asarray(r.mask, dtype=bool)]
             for r, k in zip(rollouts, k1, strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0)


def group_targets(run: Run, rollouts: list[Rollout], scores: list[float | None],
                  kl_penalty: float, keys: list[str] | None = None,
                  dist: distill.Terms | None = None) -> Targets:
    """Group-baseline advantages (grpo, rloo, reinforce) over the groups `keys` names (one per
    draw; None: one per task); with the KL in the reward, the reward less kl_penalty times the
    summed k1, and no KL term in the loss. With distillation terms (`dist`), per-token
    advantages (`with_terms`), and a completion with a term is trained on even where its
    group's rewards carry no signal."""
    cfg, ops = run.cfg, run.ops
    keys = [r.task.id for r in rollouts] if keys is None else keys
    values, ref, kl = shaped(cfg, rollouts, scores), None, {}
    if kl_penalty > 0 and cfg.rl.kl_in_reward:  # the KL goes into the reward, not the loss
        k1 = kl_k1(run, rollouts, ops.reference(run.policy, rollouts, cfg))
        values = [None if v is None else v - kl_penalty * float(k.sum())
                  for v, k in zip(values, k1, strict=True)]  # the shaped reward, less the KL
        kl = {"kl/mean": advantages.batch_moments(student_k1(rollouts, k1), run.world.reduce,
                                                  std=False)[1]}
    adv = advantages.compute(values, keys, cfg.rl.advantage,
                             cfg.rl.scale, cfg.rl.whiten, cfg.rl.drop_zero_std,
                             run.state.reinforce_baseline, cfg.rl.reinforce_decay,
                             task_rewards=scores, reduce=run.world.reduce)
    keep = [i for i in range(len(rollouts))
            if (adv.keep[i] or (dist is not None and dist.per_token[i] is not None))
            and not (cfg.rl.mask_truncated and rollouts[i].truncated)]
    if kl_penalty > 0 and not cfg.rl.kl_in_reward and keep:
        ref = ops.reference(run.policy, [rollouts[i] for i in keep], cfg)
    seq = [adv.values[i] if adv.keep[i] else 0.0 for i in keep]
    return Targets(keep, with_terms(cfg, rollouts, keep, seq, dist), ref, None, kl, adv)


def with_terms(cfg: Config, rollouts: list[Rollout], keep: list[int], adv: list,
               dist: distill.Terms | None) -> list:
    """The kept rollouts' advantages `adv`, or with distillation terms one array per token:
    distill.weight_reward times the advantage plus the term (algo/distill.py)."""
    if dist is None:
        return list(adv)
    return [combined(a, dist.per_token[i], len(rollouts[i].tokens), cfg.distill.weight_reward)
            for i, a in zip(keep, adv, strict=True)]


def critic_targets(run: Run, rollouts: list[Rollout], scores: list[float | None],
                   kl_penalty: float, dist: distill.Terms | None = None) -> Targets:
    """PPO with a critic (rl.advantage gae): the value head's values of every kept completion
    token (a fresh head first set to this batch's mean reward), per-token rewards (the score on
    the last token; with the KL in the reward, -kl_penalty * k1 on each), GAE advantages
    whitened over the batch's tokens and the returns the value loss regresses on. In a
    conversation, over the student's tokens only (algo/gae.py: feedback is no time step)."""
    cfg, ops, rl, reduce = run.cfg, run.ops, run.cfg.rl, run.world.reduce
    scores = shaped(cfg, rollouts, scores)
    valid = np.array([s is not None for s in scores], dtype=bool)
    keep = [i for i in range(len(rollouts)) if valid[i]
            and not (rl.mask_truncated and rollouts[i].truncated)]
    kept = [rollouts[i] for i in keep]
    ref = ops.reference(run.policy, kept, cfg) if kl_penalty > 0 and keep else None
    n, mean, _ = advantages.batch_moments(np.array([scores[i] for i in keep], dtype=np.float64),
                                          reduce, std=False)  # every rank's, with several
    values = ops.values(run.policy, kept, cfg, mean if n else None) if n else []
    k1 = kl_k1(run, kept, ref) if ref is not None and rl.kl_in_reward else None
    per_seq = [masked_gae(token_rewards(scores[i], len(r.tokens), k1[j] if k1 else None,
                                        kl_penalty, r.mask), v, rl.gamma, rl.lam, r.mask)
               for j, (i, r, v) in enumerate(zip(keep, kept, values, strict=True))]
    adv = whiten([a for a, _ in per_seq], reduce, [r.mask for r in kept])
    summary = np.zeros(len(rollouts))
    summary[keep] = [float(a.sum() / r.trained_tokens) if r.trained_tokens else 0.0
                     for a, r in zip(adv, kept, strict=True)]
    mask = np.zeros(len(rollouts), dtype=bool)
    mask[keep] = True
    kl = kl_mean(None if k1 is None else student_k1(kept, k1), reduce,
                 kl_penalty > 0 and rl.kl_in_reward)
    return Targets(keep, with_terms(cfg, rollouts, keep, adv, dist),
                   None if rl.kl_in_reward else ref,
                   {"returns": [ret for _, ret in per_seq], "old_values": values}, kl,
                   advantages.Advantages(summary, mask, np.zeros(len(rollouts), dtype=bool),
                                         valid, None))


def shaped(cfg: Config, rollouts: list[Rollout], scores: list[float | None]
           ) -> list[float | None]:
    """The scores less DAPO's soft overlong penalty (rl.overlong_penalty; algo/overlong.py)."""
    if cfg.rl.overlong_penalty <= 0:
        return scores
    return overlong.shape(scores, [len(r.tokens) for r in rollouts],
                          cfg.generation.max_new_tokens, cfg.rl.overlong_buffer,
                          cfg.rl.overlong_penalty)


def overlong_metrics(cfg: Config, rollouts: list[Rollout]) -> dict[str, float]:
    """reward/overlong_penalty: the mean penalty over the step's completions (when it is on)."""
    rl, n = cfg.rl, cfg.generation.max_new_tokens
    if rl.overlong_penalty <= 0 or not rollouts:
        return {}
    return {"reward/overlong_penalty": float(np.mean([
        overlong.penalty(len(r.tokens), n, rl.overlong_buffer, rl.overlong_penalty)
        for r in rollouts]))}


def kl_mean(k1: np.ndarray | None, reduce: advantages.Reduce | None, wanted: bool
            ) -> dict[str, float]:
    """kl/mean over the student's tokens' k1 (`student_k1`; {} without any): with several
    ranks (`reduce`), over every rank's, whenever the config asks for it (`wanted`), so every
    rank sums."""
    if (k1 is None or not len(k1)) and not (wanted and reduce is not None):
        return {}
    n, mean, _ = advantages.batch_moments(np.zeros(0) if k1 is None else k1, reduce, std=False)
    return {"kl/mean": mean} if n else {}


def gather(run: Run, draw: Callable[..., list[Task]],
           observe: Callable[[list[Rollout], list[Reward]], None]
           ) -> tuple[list[Group], dict[str, float], dict[str, float],
                      tuple[list[Rollout], list[Reward]]]:
    """The step's scored groups, one per prompt drawn (draws.py): of the next batch of prompts,
    or with dynamic sampling the groups with signal it collects (dynamic.py). `observe` sees
    the sampled completions before any reference answer takes a place (rl.guidance:
    guidance.py). Returns (groups, generation stats, dynamic-sampling and guidance metrics,
    every completion this step sampled and its reward: with dynamic sampling more than the
    groups it trains on, and the step's reward metrics are theirs; none when carried groups
    filled the step, whose metrics are then those of the groups trained)."""
    need = prompts_per_step(run.cfg)
    guided: list[int] = []
    seen: tuple[list[Rollout], list[Reward]] = ([], [])

    def sample(tasks: list[Task], first: bool
               ) -> tuple[list[Rollout], list[Reward], dict[str, float]]:
        rollouts, rewards, gen = agreed_sample(run, tasks, first)
        observe(rollouts, rewards)
        if run.cfg.rl.guidance:
            rollouts, rewards, n = run.world.agreed(lambda: guide(run, rollouts, rewards),
                                                    "check of the reference answers")
            guided.append(n)
        seen[0].extend(rollouts)
        seen[1].extend(rewards)
        return rollouts, rewards, gen

    if not run.cfg.rl.dynamic_sampling:
        rollouts, rewards, gen = sample(run.world.share(draw(need)), True)
        groups = groups_of(rollouts, rewards, run.state.step,
                           run.cfg.generation.num_samples_per_prompt)
        return groups, gen, guidance_metrics(run, guided), seen
    groups, gen, extra = collect(run, need, lambda n: draw(n, True), sample)
    return groups, gen, {**extra, **guidance_metrics(run, guided)}, seen


def guidance_metrics(run: Run, guided: list[int]) -> dict[str, float]:
    """sample/guided: the groups given their reference answer this step (every rank's)."""
    if not run.cfg.rl.guidance:
        return {}
    n = float(sum(guided))
    return {"sample/guided": float(run.world.sum(np.array([n]), "sum of guided groups")[0])}


SCORERS = 4  # groups scored at once while decoding (the reward's own pool bounds the sandboxes)


def agreed_sample(run: Run, tasks: list[Task], seeded: bool = True
                  ) -> tuple[list[Rollout], list[Reward], dict[str, float]]:
    """`sample_scored`; with several ranks, an error that stops the run (a teacher's 401) on
    any of them is raised on all, before the next exchange."""
    return run.world.agreed(lambda: sample_scored(run, tasks, seeded), "check of the scoring")


def sample_scored(run: Run, tasks: list[Task], seeded: bool = True
                  ) -> tuple[list[Rollout], list[Reward], dict[str, float]]:
    """The rollouts of `tasks` and their rewards. With generation.score_while_decoding (single
    answers), each task's group is scored in a background thread as soon as its last completion
    ends, while the other rows still decode; a reward scores each completion on its own, so the
    rewards are the ones scoring after would give."""
    if not (run.cfg.generation.score_while_decoding and run.cfg.generation.max_turns == 1) \
            or getattr(run.reward_fn, "whole_step", False):  # your functions: once per batch
        rollouts, gen = sample_chunks(run, tasks, seeded)
        return rollouts, score(run, rollouts), gen
    pending: list[tuple[list[Rollout], Future[list[Reward]]]] = []
    beside = run.cores.decoding() if run.cores is not None else nullcontext()
    with ThreadPoolExecutor(SCORERS, thread_name_prefix="score") as pool:
        with beside:  # the sandboxes get the cores decoding leaves free (rewards/exec/cores.py)
            rollouts, gen = sample_chunks(run, tasks, seeded, lambda group: pending.append(
                (group, pool.submit(score, run, group))))
        by_id = {id(r): w for group, f in pending for r, w in zip(group, f.result(), strict=True)}
    return rollouts, [by_id[id(r)] for r in rollouts], gen


def sample_chunks(run: Run, tasks: list[Task], seeded: bool = True,
                  on_group: Callable[[list[Rollout]], None] | None = None
                  ) -> tuple[list[Rollout], dict[str, float]]:
    """The step's rollouts, sampled `training.batch_size` prompts at a time (more than one
    chunk with gradient accumulation), the sampling stream seeded once per step (`seeded`:
    here; else it continues). `on_group` sees each task's rollouts as soon as they have ended."""
    P = run.cfg.training.batch_size
    seed = run.world.rank_seed(step_seed(run.cfg.training.seed, run.state.step)) if seeded \
        else None
    rollouts, stats = [], {}
    for i in range(0, len(tasks), P):
        part, s = run.sample(tasks[i: i + P], seed if i == 0 else None, on_group)
        rollouts += part
        stats = s if not stats else merge_gen_stats(stats, s)
    return rollouts, stats


def merge_gen_stats(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Generation stats of two chunks sampled one after the other."""
    tokens, seconds = a["gen/tokens"] + b["gen/tokens"], a["gen/seconds"] + b["gen/seconds"]
    return {**a, "gen/tokens": tokens, "gen/seconds": seconds,
            "gen/tokens_per_sec": tokens / seconds if seconds > 0 else 0.0,
            "gen/decode_width": max(a["gen/decode_width"], b["gen/decode_width"]),
            "gen/decode_width_mean": (a["gen/decode_width_mean"] + b["gen/decode_width_mean"]) / 2,
            **{k: (a[k] + b[k]) / 2 for k in ("gen/tokens_per_pass", "gen/draft_accept")
               if k in a and k in b}}


# --- metrics -------------------------------------------------------------------------------------


def step_metrics(rollouts: list[Rollout], rewards: list[Reward], adv: advantages.Advantages,
                 keep: list[int]) -> dict[str, float]:
    """The step's reward and generation metrics, over the completions it sampled (with dynamic
    sampling also those of groups without signal, not trained on; a reference answer put in by
    rl.guidance is trained on but is not the policy's: left out), and the sequences trained."""
    sampled = [i for i in range(len(rewards)) if rewards[i].details.get("guidance") is not True]
    rollouts, rewards = [rollouts[i] for i in sampled], [rewards[i] for i in sampled]
    vals = np.array([r.value for r in rewards if r.value is not None], dtype=np.float64)
    lens = np.array([len(r.tokens) for r in rollouts], dtype=np.float64)
    m = {
        "reward/mean": float(vals.mean()) if len(vals) else float("nan"),
        "reward/std": float(vals.std()) if len(vals) else float("nan"),
        "reward/min": float(vals.min()) if len(vals) else float("nan"),
        "reward/max": float(vals.max()) if len(vals) else float("nan"),
        "reward/frac_zero_std": adv.frac_zero_std,
        "reward/frac_none": float(1 - adv.valid.mean()) if len(adv.valid) else 0.0,
        "gen/completion_len_mean": float(lens.mean()) if len(lens) else 0.0,
        "gen/truncated_frac": float(np.mean([r.truncated for r in rollouts] or [0.0])),
        "gen/diversity": len({r.text for r in rollouts}) / max(len(rollouts), 1),
        "train/sequences": float(len(keep)),
    }
    for name in {k for r in rewards for k in r.parts}:
        parts = [r.parts.get(name) for r in rewards]
        parts = [p for p in parts if p is not None]
        if parts:
            m[f"reward/part/{name}"] = float(np.mean(parts))
    m.update(hacks.step_metrics(rewards))  # hack/frac, hack/<signal> (rewards/signals.py)
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
        "signals": hacks.names_of(rw),
        "signal_reasons": {s["name"]: s["reason"] for s in hacks.of(rw)},
        **({"turns": [{"answer": t.text, "feedback": t.feedback, "passed": t.passed}
                      for t in r.turns]} if len(r.turns) > 1 else {}),
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
