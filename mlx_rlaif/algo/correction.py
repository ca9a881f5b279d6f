"""Sampler and trainer in agreement: how far the sampler's log-probs are from the trainer's, and
the importance-sampling correction for the gap (`rl.is_correction`). Pure array functions, `xp`
the array library (mlx.core; torch for the torch backend), as objective.py.

The sampler records the log-prob of every token it draws (cached, incremental decoding, the LoRA
possibly fused into a copy of the weights); the update recomputes the same tokens teacher-forced.
The first iteration of the update runs at the weights that sampled (the optimizer steps after
it), so its detached log-probs ARE the recomputed old policy: measuring and correcting the gap
costs no extra forward. Per token, with d = trainer - sampler log-prob and C = rl.is_cap:

    sampler_k3   exp(d) - d - 1            KL(sampler || trainer), estimated on the sampler's
                                           own draws (k3: unbiased, never negative)
    absdiff_max  max |d|
    far          |d| > ln C                the weight pi_old / pi_sampler leaves [1/C, C]

The correction (`correct`), with old = the recomputed log-probs (detached), w = exp(d):

    none   the PPO ratio against the sampler's log-probs (the behaviour before this module)
    tis    ratio against old, the policy term times min(w, C)        (truncated IS; Yao et al.)
    mis    ratio against old, times w where 1/C <= w <= C, else 0    (masked IS; both bounds,
                                                                      as verl's mask mode and
                                                                      IcePop)

`rl.is_level: sequence` uses one weight per sequence, the geometric mean of its token weights,
exp(mean_t d_t) (a product overflows at hundreds of tokens). The weight is a constant (no
gradient flows through it) and multiplies the policy term only: the KL and entropy terms are
the trainer's own. MIS keeps a masked token's place in the loss divisor (the weights of
algo/aggregation.py are fixed before the forward): the step shrinks by the masked share, which
Adam's per-parameter normalisation all but cancels.

Not covered: corrections of the KL term, veto thresholds, per-turn weights.
"""

from __future__ import annotations

import math
from typing import Any

TRAINER_LOGP = "trainer_logp"  # the micro-batch key of the recomputed old log-probs [N, T]


def detached(x: Any, xp: Any) -> Any:
    """x without gradient (torch: .detach(); mlx: stop_gradient)."""
    return x.detach() if hasattr(x, "detach") else xp.stop_gradient(x)


def old_logp(logp: Any, mb: dict[str, Any], rl: Any, xp: Any) -> Any:
    """The old policy's log-probs of the PPO ratio: the sampler's (`mb['old_logp']`) without a
    correction; with one, the trainer's at the sampling weights: those kept from the first
    iteration (`mb[TRAINER_LOGP]`), or in the first iteration `logp` itself, detached."""
    if rl.is_correction == "none":
        return mb["old_logp"]
    return mb[TRAINER_LOGP] if TRAINER_LOGP in mb else detached(logp, xp)


def agreement(logp: Any, sampler_logp: Any, mask: Any, cap: float, xp: Any
              ) -> dict[str, Any]:
    """Masked sums (and one max) of the sampler-vs-trainer gap, for the aux of the loss:
    sampler_k3, sampler_far (tokens whose |d| > ln cap), sampler_absdiff_max, and
    sampler_tokens (the mask's). `mask`: the tokens sampled at the trainer's weights (a carried
    group's were sampled updates ago: its gap is the policy's change, not a mismatch)."""
    d = (detached(logp, xp) - sampler_logp) * mask
    far = (xp.abs(d) > math.log(cap)) * mask
    k3 = xp.clip(xp.expm1(d) - d, 0.0, None)  # exp(d) - d - 1, exact for tiny gaps
    return {"sampler_k3": (k3 * mask).sum(), "sampler_far": far.sum(),
            "sampler_absdiff_max": xp.abs(d).max(), "sampler_tokens": mask.sum()}


def log_weights(old: Any, sampler_logp: Any, mask: Any, level: str) -> Any:
    """log(pi_old / pi_sampler) per token [N, T], or per sequence (the mean over its tokens,
    the log of the geometric mean) as [N, 1]."""
    d = (old - sampler_logp) * mask
    if level != "sequence":
        return d
    return d.sum(-1)[:, None] / (mask.sum(-1)[:, None] + 1e-9)


def weights(old: Any, sampler_logp: Any, mask: Any, rl: Any, xp: Any) -> tuple[Any, Any]:
    """(the importance weight [N, T] or [N, 1], where it was truncated or masked), by
    rl.is_correction (tis, mis), rl.is_cap and rl.is_level. Computed from detached inputs."""
    lw = detached(log_weights(old, sampler_logp, mask, rl.is_level), xp)
    bound = math.log(rl.is_cap)
    if rl.is_correction == "tis":
        return xp.exp(xp.clip(lw, None, bound)), lw > bound  # min(w, C), never overflows
    outside = (lw > bound) | (lw < -bound)
    return xp.exp(xp.clip(lw, -bound, bound)) * (1.0 - outside * 1.0), outside


def correct(pg: Any, old: Any, mb: dict[str, Any], rl: Any, xp: Any
            ) -> tuple[Any, dict[str, Any]]:
    """The policy term `pg` [N, T] times the importance weight (unchanged for `none`), and the
    weight's aux sums (is_weight: the weight over kept tokens; is_truncated (tis) or is_masked
    (mis): the tokens whose weight was truncated or masked)."""
    if rl.is_correction == "none":
        return pg, {}
    mask = mb["mask"]
    w, hit = weights(old, mb["old_logp"], mask, rl, xp)
    ones = xp.ones_like(pg)
    hits = "is_truncated" if rl.is_correction == "tis" else "is_masked"
    return pg * w, {"is_weight": (w * ones * mask).sum(), hits: (hit * ones * mask).sum()}


def accumulate(total: dict[str, Any], part: dict[str, Any], xp: Any) -> dict[str, Any]:
    """Two micro-batches' aux together: sums, except `*_max` keys (their maximum)."""
    return {k: xp.maximum(v, part[k]) if k.endswith("_max") else v + part[k]
            for k, v in total.items()}


def metrics(first: dict[str, float]) -> dict[str, float]:
    """The metrics of the first iteration's aux sums (plain numbers): policy/sampler_kl (mean
    k3 per token), policy/sampler_logp_absdiff_max, policy/sampler_far_frac; with a correction
    policy/is_weight_mean and policy/is_truncated_frac (tis) or policy/is_masked_frac (mis)."""
    n = max(first.get("tokens", 0.0), 1.0)
    seen = first.get("sampler_tokens", n)
    m = {}
    if "sampler_k3" in first and seen > 0:  # none when every row was carried (dynamic.py)
        m["policy/sampler_kl"] = first["sampler_k3"] / seen
        m["policy/sampler_far_frac"] = first["sampler_far"] / seen
    if "sampler_absdiff_max" in first and seen > 0:  # a rank with no rows has no maximum
        m["policy/sampler_logp_absdiff_max"] = first["sampler_absdiff_max"]
    for key in ("is_weight", "is_truncated", "is_masked"):
        if key in first:
            m[f"policy/{key}_{'mean' if key == 'is_weight' else 'frac'}"] = first[key] / n
    return m
