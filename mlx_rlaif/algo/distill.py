"""The distillation term of the objective, as pure numpy functions: a target for every token.

Per student token t of a completion (GKD's reverse KL as a reward; Thinking Machines' on-policy
distillation; SDPO's self-distillation):

    d_t  = coef * (log p_target(y_t | x, y_<t) - log p_student(y_t | x, y_<t))
    d_t  = clip(d_t, -clip, clip)                  (distill.clip > 0)
    A_t  = weight_reward * A + d_t                 (A: the sequence's advantage from the
                                                    rewards, or a critic's per-token one)

log p_student is the sampler's recorded log-prob (the rollout's), so the term costs no
forward of the student; the target is a teacher model's, or the student's own with feedback in
its context. A_t then goes through the same loss as any advantage (importance ratio against the
sampler, PPO clip, TIS/MIS: algo/objective.py). Tokens that are not the student's (a
conversation's feedback turns: mask 0) get no term.

The reported KL is the per-token reverse KL's sample estimate, log p_student - log p_target
(k1 on the student's own samples: unbiased for KL(student || target)), its mean and 90th
percentile over the tokens that have a target.

Not covered: forward KL or full-distribution (top-k) distillation: only the sampled token's
log-prob is known for each position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_terms(target: np.ndarray, student: np.ndarray, mask: np.ndarray | None, coef: float,
                clip: float = 0.0) -> np.ndarray:
    """d_t [T] of one completion: coef * (target - student), clipped to +-clip (0: none), 0
    where mask is 0. target, student: [T] log-probs of the sampled tokens."""
    d = coef * (np.asarray(target, np.float64) - np.asarray(student, np.float64))
    if clip > 0:
        d = np.clip(d, -clip, clip)
    if mask is not None:
        d = d * np.asarray(mask, np.float64)
    return d.astype(np.float32)


def combined(adv: float | np.ndarray, term: np.ndarray | None, length: int,
             weight_reward: float) -> np.ndarray:
    """A_t [length]: weight_reward times the advantage (one number, or one per token) plus the
    distillation term (None: no term for this completion)."""
    base = np.broadcast_to(np.asarray(adv, np.float64) * weight_reward, (length,))
    out = base if term is None else base + term
    return np.asarray(out, np.float32)


def reverse_kl(target: Sequence[np.ndarray], student: Sequence[np.ndarray],
               masks: Sequence[np.ndarray | None]) -> np.ndarray:
    """log p_student - log p_target of every student token, flat."""
    parts = [(np.asarray(s, np.float64) - np.asarray(t, np.float64))[
        np.ones(len(s), bool) if m is None else np.asarray(m, bool)]
        for t, s, m in zip(target, student, masks, strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0)


def kl_metrics(k: np.ndarray) -> dict[str, float]:
    """distill/kl (mean) and distill/kl_p90 of per-token reverse-KL estimates ({} for none)."""
    if not len(k):
        return {}
    return {"distill/kl": float(k.mean()), "distill/kl_p90": float(np.percentile(k, 90))}
