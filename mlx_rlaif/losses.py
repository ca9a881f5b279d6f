"""The RL objective, as pure functions of MLX arrays. Shapes: N sequences, T target positions.

Per token t of a kept completion (ratio = exp(logp - old_logp), old = the sampler's log-probs):

    pg_t  = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    kl_t  = k(logp, ref_logp)            k1 = logp - ref, k2 = (logp - ref)^2 / 2,
                                         k3 = exp(ref - logp) - (ref - logp) - 1
    l_t   = pg_t + beta * kl_t - entropy_coef * H_t
    loss  = sum_t w_t * l_t

The weights w_t (batch.py) carry the aggregation and its divisor, computed once over the whole
rollout batch, so summing micro-batch losses gives the same gradient for any micro-batch size.

Speed: the vocabulary-sized work (log-softmax and entropy over [N, T, V]) dominates the loss on
small models, so `logprobs_and_entropy` does a single exp pass over the logits, and on MLX's CPU
backend computes it as 2**(x log2 e), about 3x faster there than `mx.exp` (BENCHMARKS.md).

Not covered: value losses, sequence-level importance ratios (GSPO).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import cpu_kernels, shared_prompt


def exp(x: mx.array) -> mx.array:
    """e**x. On the CPU backend as 2**(x log2 e): same float32 accuracy, ~3x faster there. (Not
    `cpu_kernels.exp2e`: its floor would keep one more vocabulary-sized array for the backward
    pass, +0.5 GB at the 0.5B shape.)"""
    if mx.default_device() == mx.cpu:
        return mx.power(2.0, x * cpu_kernels.LOG2E)
    return mx.exp(x)


def logprobs_and_entropy(logits: mx.array, targets: mx.array, temperature: float = 1.0
                         ) -> tuple[mx.array, mx.array]:
    """log softmax(logits / T)[targets] and the entropy of each softmax(logits / T), with one
    exp pass over the vocabulary (its output also serves the backward pass).

    logits: [..., V], targets: [...] -> (logp [...], entropy [...]).
    """
    z = logits.astype(mx.float32)
    if temperature != 1.0:
        z = z / temperature
    z = z - mx.stop_gradient(z.max(axis=-1, keepdims=True))
    e = exp(z)
    s = e.sum(axis=-1)
    log_s = mx.log(s)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1)[..., 0] - log_s
    entropy = log_s - (e * z).sum(axis=-1) / s  # -sum p log p, p = e / s, log p = z - log s
    return logp, entropy


def kl_estimate(logp: Any, ref_logp: Any, kind: str, xp: Any = mx) -> Any:
    """Per-token estimate of KL(policy || ref) from samples of the policy. `xp`: the array
    library (mlx.core; torch for the torch backend)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return xp.exp(d) - d - 1.0


def clipped_surrogate(logp: Any, old_logp: Any, adv: Any, clip_low: float, clip_high: float,
                      xp: Any = mx) -> tuple[Any, Any, Any]:
    """Per-token PPO loss, the ratio, and where clipping was active. adv: [N] -> broadcast.
    `xp`: the array library (mlx.core; torch for the torch backend)."""
    ratio = xp.exp(logp - old_logp)
    a = adv[:, None]
    unclipped = -a * ratio
    clipped = -a * xp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return xp.maximum(unclipped, clipped), ratio, (clipped > unclipped)


def rl_loss(model: nn.Module, mb: dict[str, mx.array], rl: Any, kl_coef: float,
            temperature: float) -> tuple[mx.array, dict[str, mx.array]]:
    """(loss, aux) for one micro-batch. `mb` holds tokens [N, T+1], mask/weights/old_logp/
    ref_logp [N, T], adv [N] (batch.build), or with `prefix` the layout of batch.build_shared.
    aux holds masked sums (divide by aux['tokens'] for means)."""
    logp, entropy = logprobs_and_entropy(shared_prompt.batch_logits(model, mb),
                                         mb["tokens"][:, 1:], temperature)
    if rl.entropy_coef == 0:
        entropy = mx.stop_gradient(entropy)
    return objective(logp, entropy, mb, rl, kl_coef)


def objective(logp: Any, entropy: Any, mb: dict[str, Any], rl: Any, kl_coef: float,
              xp: Any = mx) -> tuple[Any, dict[str, Any]]:
    """The loss and aux sums of one micro-batch from the policy's log-probs and entropies
    [N, T] of its targets. `xp`: the array library (mlx.core; torch for the torch backend)."""
    mask, w, old = mb["mask"], mb["weights"], mb["old_logp"]
    pg, ratio, clipped = clipped_surrogate(logp, old, mb["adv"], rl.clip_low, rl.clip_high, xp)
    per_token = pg - rl.entropy_coef * entropy
    aux = {"tokens": mask.sum(), "pg": (pg * w).sum(), "entropy": (entropy * mask).sum(),
           "clipped": (clipped * mask).sum(), "ratio": (ratio * mask).sum(),
           "approx_kl": (0.5 * (logp - old) ** 2 * mask).sum()}
    if "ref_logp" in mb:
        kl = kl_estimate(logp, mb["ref_logp"], rl.kl_estimator, xp)
        per_token = per_token + kl_coef * kl
        aux["kl_loss"] = (kl * w).sum()
        aux["kl"] = ((logp - mb["ref_logp"]) * mask).sum()
    loss = (per_token * w).sum()
    aux["loss"] = loss
    return loss, aux
