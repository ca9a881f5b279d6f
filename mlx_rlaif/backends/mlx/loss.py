"""The model-calling half of the MLX loss: log-probs and entropies of the completion tokens, and
`rl_loss(model, mb, ...) -> (loss, aux)` for `nn.value_and_grad`, which hands them to the pure
objective (`algo.objective`).

Speed: the vocabulary-sized work (log-softmax and entropy over [N, T, V]) dominates the loss on
small models, so `logprobs_and_entropy` does a single exp pass over the logits, and on MLX's CPU
backend (the `cpu` gate) computes it as 2**(x log2 e), about 3x faster there than `mx.exp`
(BENCHMARKS.md).

Not covered: value losses, sequence-level importance ratios (GSPO).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ... import cpu
from ...algo.objective import objective
from ...cpu.kernels import power_exp
from . import shared_prompt


def exp(x: mx.array) -> mx.array:
    """e**x: `cpu.kernels.power_exp` where the CPU gate is on, else `mx.exp`."""
    return power_exp(x) if cpu.active() else mx.exp(x)


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


def rl_loss(model: nn.Module, mb: dict[str, mx.array], rl: Any, kl_penalty: mx.array,
            temperature: float) -> tuple[mx.array, dict[str, mx.array]]:
    """(loss, aux) for one micro-batch. `mb` holds tokens [N, T+1], mask/weights/old_logp/
    ref_logp [N, T], adv [N] (backends.batch.build), or with `prefix` the layout of
    backends.batch.build_shared. aux holds masked sums (divide by aux['tokens'] for means)."""
    logp, entropy = logprobs_and_entropy(shared_prompt.batch_logits(model, mb),
                                         mb["tokens"][:, 1:], temperature)
    if rl.entropy_coef == 0:
        entropy = mx.stop_gradient(entropy)
    return objective(logp, entropy, mb, rl, kl_penalty)


def token_logprobs(model: nn.Module, tokens: mx.array, temperature: float = 1.0
                   ) -> tuple[mx.array, mx.array]:
    """Log-probs of tokens[:, 1:] given tokens[:, :-1] at `temperature`, and the entropy of each
    next-token distribution: tokens [B, T] -> ([B, T-1], [B, T-1])."""
    return logprobs_and_entropy(model(tokens[:, :-1]), tokens[:, 1:], temperature)
