"""The RL objective, as pure array functions. Shapes: N sequences, T target positions.

Per token t of a kept completion (ratio = exp(logp - old_logp), old = the sampler's log-probs):

    pg_t  = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    kl_t  = k(logp, ref_logp)            k1 = logp - ref, k2 = (logp - ref)^2 / 2,
                                         k3 = exp(ref - logp) - (ref - logp) - 1
    l_t   = pg_t + kl_penalty * kl_t - entropy_coef * H_t (+ value_coef * vloss_t with a critic)
    loss  = sum_t w_t * l_t

The weights w_t (aggregation.py) carry the aggregation and its divisor, computed once over the
whole rollout batch, so summing micro-batch losses gives the same gradient for any micro-batch
size.

The KL estimators as a loss term, on samples of the policy pi (Schulman's k1/k2/k3; the
gradient is taken through logp only, as here):
    k1  grad = grad logp: zero in expectation (E_pi[grad log pi] = 0): the penalty does
        nothing, so config.check refuses k1 in the loss (the reward's KL, rl.kl_in_reward,
        is k1: there it is a number, not differentiated)
    k2  grad = (logp - ref) grad logp: in expectation grad KL(pi || ref), the KL the penalty
        names (the default)
    k3  grad = (1 - ref / pi) grad logp: in expectation grad KL(ref || pi), the reverse
        direction (its value is an unbiased estimate of KL(pi || ref), its gradient is not)
With num_iterations > 1 the samples are the sampler's, not the current policy's (no
importance weight on the KL term), so these hold at the first iteration only.

Every function takes the array library as `xp` (mlx.core by default; torch for the torch
backend), so both backends optimise the same formulas. The log-probs come from the backends
(`backends/mlx/loss.py`, `backends/torch/update.py`).

A is one number per sequence (group baselines) or, with a critic (`rl.advantage: gae`), one per
token (gae.py, which also holds the clipped value loss).

Variants of the policy term (`policy_term`): GSPO's sequence-level ratio (`rl.ratio_level:
sequence`), and CISPO (`rl.loss: cispo`), a REINFORCE term weighted by the clipped, detached
ratio, which keeps every token's gradient where PPO's clip zeroes it. The clip range defaults
by the ratio level (`clip_range`): 0.2 / 0.28 for token ratios (PPO, DAPO's clip-higher),
3e-4 / 4e-4 for sequence ratios (the GSPO paper's).

With `rl.is_correction` (tis, mis) the old policy is the trainer's recomputed log-probs and the
policy term carries a truncated or masked importance weight against the sampler's
(correction.py, which also measures the gap every step: aux sampler_*).

Not covered: per-token clipping schedules, asymmetric sequence clipping beyond clip_low/high.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from . import correction
from .gae import value_loss

# (clip_low, clip_high) where the config leaves them unset, by ratio level
CLIP = {"token": (0.2, 0.28), "sequence": (3e-4, 4e-4)}


def clip_range(rl: Any) -> tuple[float, float]:
    """(clip_low, clip_high) of the RL config section `rl`: its values, or where unset (None)
    the ratio level's (`CLIP`)."""
    low, high = CLIP[rl.ratio_level]
    return (low if rl.clip_low is None else rl.clip_low,
            high if rl.clip_high is None else rl.clip_high)


def kl_estimate(logp: Any, ref_logp: Any, kind: str, xp: Any = mx) -> Any:
    """Per-token estimate of KL(policy || ref) from samples of the policy (each one's gradient:
    the module's docstring). `xp`: the array library (mlx.core; torch for the torch backend)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return xp.exp(d) - d - 1.0


def clipped_surrogate(logp: Any, old_logp: Any, adv: Any, clip_low: float, clip_high: float,
                      xp: Any = mx) -> tuple[Any, Any, Any]:
    """Per-token PPO loss, the ratio, and where clipping was active. adv: [N] (broadcast) or
    [N, T] (per token, a critic's). `xp`: the array library (mlx.core; torch for the torch
    backend)."""
    a = adv[:, None] if adv.ndim == 1 else adv  # per sequence [N], or per token [N, T]
    return ppo_clip(xp.exp(logp - old_logp), a, clip_low, clip_high, xp)


def ppo_clip(ratio: Any, a: Any, low: float, high: float, xp: Any) -> tuple[Any, Any, Any]:
    """(max(-A r, -A clip(r, 1 - low, 1 + high)), r, where the clip was active)."""
    unclipped, clipped = -a * ratio, -a * xp.clip(ratio, 1.0 - low, 1.0 + high)
    return xp.maximum(unclipped, clipped), ratio, clipped > unclipped


def sequence_ratio(logp: Any, old_logp: Any, mask: Any, xp: Any = mx) -> Any:
    """GSPO's importance ratio of each sequence, exp(mean over its tokens of logp - old_logp),
    as [N, 1] (broadcast over the tokens)."""
    n = mask.sum(-1)[:, None] + 1e-9  # a sequence without tokens: ratio exp(0)
    return xp.exp(((logp - old_logp) * mask).sum(-1)[:, None] / n)


def token_sequence_ratio(logp: Any, old_logp: Any, mask: Any, xp: Any = mx) -> Any:
    """GSPO-token's ratio [N, T]: sg(s) * exp(logp_t - sg(logp_t)), s the sequence ratio. Its
    value is s on every token, its gradient s * grad logp_t: with one advantage per sequence
    and the per-sequence aggregation this is GSPO's gradient exactly; with per-token advantages
    (a critic's) each token keeps its own (the GSPO paper's token variant)."""
    s = _detached(sequence_ratio(logp, old_logp, mask, xp), xp)
    return s * xp.exp(logp - _detached(logp, xp))


def _detached(x: Any, xp: Any) -> Any:
    return x.detach() if hasattr(x, "detach") else xp.stop_gradient(x)


def policy_term(logp: Any, old_logp: Any, adv: Any, mask: Any, rl: Any, xp: Any = mx
                ) -> tuple[Any, Any, Any]:
    """Per-token policy loss, the ratio it used and where its clip was active, by `rl.loss` and
    `rl.ratio_level`:
        ppo, token:     max(-A r_t, -A clip(r_t))             r_t = exp(logp_t - old_t)
        ppo, sequence:  max(-A s, -A clip(s)) on every token   s = exp(mean_t(logp_t - old_t))
                        (GSPO: one ratio, clipped, per sequence; in its token form,
                        `token_sequence_ratio`)
        cispo:          -sg(clip(r)) A logp_t                  (the clipped ratio a detached
                        weight; r per token, or s per sequence; MiniMax-M1's CISPO)"""
    a = adv[:, None] if adv.ndim == 1 else adv
    low, high = clip_range(rl)
    ratio = (token_sequence_ratio(logp, old_logp, mask, xp) if rl.ratio_level == "sequence"
             else xp.exp(logp - old_logp))  # [N, T] either way
    if rl.loss != "cispo":
        return ppo_clip(ratio, a, low, high, xp)
    bounded = xp.clip(ratio, 1.0 - low, 1.0 + high)
    return -_detached(bounded, xp) * a * logp, ratio, bounded != ratio


def objective(logp: Any, entropy: Any, mb: dict[str, Any], rl: Any, kl_penalty: Any,
              xp: Any = mx, values: Any = None) -> tuple[Any, dict[str, Any]]:
    """The loss and aux sums of one micro-batch from the policy's log-probs and entropies
    [N, T] of its targets, and with a critic its values [N, T] (`mb` then holds `returns` and
    `old_values`). `xp`: the array library (mlx.core; torch for the torch backend)."""
    mask, w, sampler = mb["mask"], mb["weights"], mb["old_logp"]
    old = correction.old_logp(logp, mb, rl, xp)  # the sampler's, or recomputed (rl.is_correction)
    pg, ratio, clipped = policy_term(logp, old, mb["adv"], mask, rl, xp)
    pg, is_aux = correction.correct(pg, old, mb, rl, xp)
    per_token = pg - rl.entropy_coef * entropy
    aux = {"tokens": mask.sum(), "pg": (pg * w).sum(), "entropy": (entropy * mask).sum(),
           "clipped": (clipped * mask).sum(), "ratio": (ratio * mask).sum(),
           "approx_kl": (0.5 * (logp - sampler) ** 2 * mask).sum(),
           **correction.agreement(logp, sampler, mb.get("sampled", mask), rl.is_cap, xp),
           **is_aux}
    if rl.is_correction != "none" and correction.TRAINER_LOGP not in mb:
        aux[correction.TRAINER_LOGP] = correction.detached(logp, xp)  # kept for iterations 2..
    if "ref_logp" in mb:
        kl = kl_estimate(logp, mb["ref_logp"], rl.kl_estimator, xp)
        per_token = per_token + kl_penalty * kl
        aux["kl_loss"] = kl_penalty * (kl * w).sum()  # the KL term of the loss, penalty included
        aux["kl"] = ((logp - mb["ref_logp"]) * mask).sum()
    if values is not None:
        vl = value_loss(values, mb["old_values"], mb["returns"], rl.value_clip, xp)
        per_token = per_token + rl.value_coef * vl
        aux["value_loss"] = (vl * w).sum()
        aux["value"] = (values * mask).sum()
    loss = (per_token * w).sum()
    aux["loss"] = loss
    return loss, aux
