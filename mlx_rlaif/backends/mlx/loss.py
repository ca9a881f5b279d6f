"""The model-calling half of the MLX loss: log-probs and entropies of the completion tokens, and
`rl_loss(model, mb, ...) -> (loss, aux)` for `nn.value_and_grad`, which hands them to the pure
objective (`algo.objective`).

Memory: at a real vocabulary (Qwen2.5: 151,936) the float32 logits of a micro-batch,
[sequences, positions, vocabulary], are the largest arrays of the step (8 completions of 512
tokens: 2.5 GB each). So the model is split into its transformer (`body`) and its own output
head (`head`: `lm_head`, or the tied embedding's `as_linear`, quantized in a 4-bit model; never
a re-implementation), and the log-probs and entropies are computed a chunk of positions at a
time (`head_logprobs`: at most `limit_mb` MB of float32 logits a chunk, the budget's share:
memory.logits_chunk_mb), inside the gradient, as one custom function: one pass of the
transformer per micro-batch, nothing evaluated inside the transformation, the chunks chained
with `mx.depends` so that they run one after the other. Where the entropies carry no gradient
(no entropy bonus, the default) each chunk's d logp / d hidden is taken in the forward pass
from the logits at hand and the backward pass only scales it (two of the head's matmuls per
chunk, not three); with an entropy bonus the backward pass recomputes each chunk's logits (Cut
Cross-Entropy's aim, by recomputation). MLX still allocates ahead of the computation; the
update's memory limit (memory.limited) bounds how far (tests/test_chunked_loss.py checks
values and gradients against the full computation, the single transformer pass, and the
memory).

Speed: the vocabulary-sized work (log-softmax and entropy over [N, T, V]) dominates the loss on
small models, so `logprobs_and_entropy` does a single exp pass over the logits, and on MLX's CPU
backend (the `cpu` gate) computes it as 2**(x log2 e), about 3x faster there than `mx.exp`
(BENCHMARKS.md).

Not covered: architectures that transform the logits after the head (logit soft-capping:
`split_head` finds them and the full logits path runs), a fused chunked cross-entropy kernel
(each chunk's logits are materialized, one chunk at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ... import cpu
from ...algo.objective import objective
from ...cpu.kernels import power_exp
from ..batch import chunks
from . import shared_prompt

LOGITS_CHUNK_MB = 64  # the float32 logits of one chunk of positions, at most (the default)


@dataclass(frozen=True)
class Split:
    """model(x, cache) == head(body(x, cache)): the transformer and the model's own head."""

    body: nn.Module
    head: Callable[[mx.array], mx.array]
    vocab: int


def split_head(model: nn.Module) -> Split | None:
    """The model as transformer + output head (mlx-lm's layouts: `model.model` or
    `model.backbone`, then `lm_head` or the tied `embed_tokens.as_linear`, divided by the
    model's `logits_scaling` where it has one (Granite); a multimodal wrapper's
    `language_model` first: Qwen3.5, Mistral 3), checked on a 2-token input; None where the
    model does more than that (soft-capping) or has another layout."""
    lm = model
    while isinstance(getattr(lm, "language_model", None), nn.Module):
        lm = lm.language_model
    body = getattr(lm, "model", None) or getattr(lm, "backbone", None)
    head = getattr(lm, "lm_head", None)
    if head is None and body is not None and hasattr(getattr(body, "embed_tokens", None),
                                                   "as_linear"):
        head = body.embed_tokens.as_linear
    if body is None or head is None:
        return None
    scaling = getattr(lm, "logits_scaling", None)
    if isinstance(scaling, (int, float)) and scaling != 1:
        head = divided(head, scaling)
    x = mx.array([[1, 2]])
    try:
        full, parts = model(x), head(body(x))
    except Exception:  # noqa: BLE001  (any architecture whose body takes other arguments)
        return None
    if full.shape != parts.shape or not mx.allclose(full, parts, rtol=1e-4, atol=1e-4).item():
        return None
    return Split(body, head, full.shape[-1])


def divided(head: Callable[[mx.array], mx.array], by: float) -> Callable[[mx.array], mx.array]:
    """`head`'s logits divided by `by` (Granite's `logits_scaling`)."""
    return lambda h: head(h) / by


def chunk_tokens(vocab: int, limit_mb: float | None = None) -> int:
    """Positions per chunk so that one chunk's float32 logits take at most `limit_mb` (default
    LOGITS_CHUNK_MB; the update passes the budget's: memory.logits_chunk_mb)."""
    return max(1, int((limit_mb or LOGITS_CHUNK_MB) * 2**20) // (4 * vocab))


def chunk_slices(split: Split, positions: int, limit_mb: float | None = None) -> list[slice]:
    return chunks(positions, chunk_tokens(split.vocab, limit_mb))


def head_logprobs(split: Split, hidden: mx.array, targets: mx.array, temperature: float,
                  limit_mb: float | None = None, entropy_grad: bool = True
                  ) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) [N, W] of `targets` [N, W] under the head applied to `hidden`
    [N, W, D], a chunk of positions at a time (`chunk_slices`), differentiable with respect to
    `hidden`, lazily: nothing is evaluated here. Without `entropy_grad` the entropies carry no
    gradient (the objective's entropy_coef 0: `rl_loss`) and the log-probs' gradient is taken
    in the forward pass (`logp_gradient_chained`: a third less of the head's work); else
    `recomputed_chained`. Logits that fit one chunk are differentiated as they are."""
    n, w, d = hidden.shape
    slices = chunk_slices(split, n * w, limit_mb)
    if len(slices) == 1:  # within one chunk: the logits kept for the backward pass
        logp, entropy = logprobs_and_entropy(split.head(hidden), targets, temperature)
        return logp, (entropy if entropy_grad else mx.stop_gradient(entropy))
    chained = recomputed_chained if entropy_grad else logp_gradient_chained
    logp, entropy = chained(split.head, hidden.reshape(n * w, d), targets.reshape(n * w),
                            temperature, slices)
    return logp.reshape(n, w), entropy.reshape(n, w)


def recomputed_chained(head: Callable[[mx.array], mx.array], h: mx.array, targets: mx.array,
                       temperature: float, slices: list[slice]) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) [M] of `targets` [M] under `head` on `h` [M, D], differentiable
    for both: one custom function over all chunks (`mx.custom_function`) whose forward keeps no
    logits for the backward pass; its backward recomputes each chunk's logits and takes their
    gradient. The chunks are chained with `mx.depends`, in the forward (chunk k + 1 after chunk
    k's results) and in the backward (chunk k + 1's recomputation after chunk k's gradient, the
    first after the cotangents exist), so MLX, which schedules independent branches of a graph
    together, holds one chunk's vocabulary-sized arrays at a time, and never recomputes a chunk
    during the forward pass."""
    def stats(x: mx.array, s: slice) -> tuple[mx.array, mx.array]:
        return logprobs_and_entropy(head(x), targets[s], temperature)

    @mx.custom_function
    def chained(x: mx.array) -> tuple[mx.array, mx.array]:
        parts: list[tuple[mx.array, mx.array]] = []
        for s in slices:
            parts.append(stats(after(x[s], list(parts[-1]) if parts else []), s))
        return (mx.concatenate([p[0] for p in parts]), mx.concatenate([p[1] for p in parts]))

    @chained.vjp
    def chained_vjp(x: mx.array, cotangents: tuple[mx.array, mx.array], outputs: Any
                    ) -> mx.array:
        g_logp, g_ent = cotangents
        grads: list[mx.array] = []
        for s in slices:
            xs = after(x[s], grads[-1:] or [g_logp, g_ent])
            _, (dh,) = mx.vjp(lambda y, s=s: stats(y, s), [xs], [g_logp[s], g_ent[s]])
            grads.append(dh)
        return mx.concatenate(grads)

    return chained(h)


def logp_gradient_chained(head: Callable[[mx.array], mx.array], h: mx.array, targets: mx.array,
                          temperature: float, slices: list[slice]
                          ) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) [M] of `targets` [M] under `head` on `h` [M, D], the log-probs
    differentiable, the entropies not. A position's log-prob depends on its own hidden state
    only, so its gradient is that of the log-prob times the cotangent: the forward pass takes
    each chunk's d logp / d h [C, D] from the logits it has (`logp_and_gradient`: one
    transposed matmul, no recomputation) and the backward pass is their product with the
    cotangents. The chunks are chained with `mx.depends` (chunk k + 1 after chunk k's results):
    one chunk's vocabulary-sized arrays at a time."""
    @mx.custom_function
    def chained(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        parts: list[tuple[mx.array, mx.array, mx.array]] = []
        for s in slices:
            parts.append(logp_and_gradient(head, after(x[s], list(parts[-1]) if parts else []),
                                           targets[s], temperature))
        return tuple(mx.concatenate([p[i] for p in parts]) for i in range(3))

    @chained.vjp
    def chained_vjp(x: mx.array, cotangents: tuple[mx.array, ...], outputs: Any) -> mx.array:
        return (cotangents[0][:, None] * outputs[2]).astype(x.dtype)

    logp, entropy, _ = chained(h)
    return logp, mx.stop_gradient(entropy)


def logp_and_gradient(head: Callable[[mx.array], mx.array], x: mx.array, targets: mx.array,
                      temperature: float) -> tuple[mx.array, mx.array, mx.array]:
    """(log-probs [C], entropies [C], d logp / d x [C, D]) of `targets` under `head` on `x`
    [C, D]: d logp / d logits = (onehot(target) - softmax) / T, taken through the head's own
    vector-Jacobian product (a transposed matmul: quantized or tied heads alike)."""
    logits = head(x)
    logp, entropy, e, total = softmax_parts(logits, targets, temperature)
    minus_p = -e / total[:, None]
    at_target = mx.take_along_axis(minus_p, targets[:, None], axis=-1) + 1.0
    d_logits = mx.put_along_axis(minus_p, targets[:, None], at_target, axis=-1)
    if temperature != 1.0:
        d_logits = d_logits / temperature
    _, (d_x,) = mx.vjp(head, [x], [d_logits.astype(logits.dtype)])
    return logp, entropy, d_x


def after(x: mx.array, dependencies: list[mx.array]) -> mx.array:
    """`x`, computed only once `dependencies` are (mx.depends; none: `x` as it is)."""
    return mx.depends(x, dependencies) if dependencies else x


def micro_batch_stats(model: nn.Module, split: Split | None, mb: dict[str, mx.array],
                      temperature: float, limit_mb: float | None = None
                      ) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) of a micro-batch's targets: through the body and the chunked head
    (`head_logprobs`) where the model splits, else from the full logits."""
    targets = mb["tokens"][:, 1:]
    if split is None:
        return logprobs_and_entropy(shared_prompt.batch_logits(model, mb), targets, temperature)
    return head_logprobs(split, shared_prompt.batch_logits(split.body, mb), targets, temperature,
                         limit_mb)


def exp(x: mx.array) -> mx.array:
    """e**x: `cpu.kernels.power_exp` where the CPU gate is on, else `mx.exp`."""
    return power_exp(x) if cpu.active() else mx.exp(x)


def logprobs_and_entropy(logits: mx.array, targets: mx.array, temperature: float = 1.0
                         ) -> tuple[mx.array, mx.array]:
    """log softmax(logits / T)[targets] and the entropy of each softmax(logits / T), with one
    exp pass over the vocabulary (its output also serves the backward pass).

    logits: [..., V], targets: [...] -> (logp [...], entropy [...]).
    """
    logp, entropy, _, _ = softmax_parts(logits, targets, temperature)
    return logp, entropy


def softmax_parts(logits: mx.array, targets: mx.array, temperature: float
                  ) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(logp [...], entropy [...], e [..., V], s [...]): e = exp(z - max z), z = logits / T in
    float32, s = sum e, so softmax = e / s."""
    z = logits.astype(mx.float32)
    if temperature != 1.0:
        z = z / temperature
    z = z - mx.stop_gradient(z.max(axis=-1, keepdims=True))
    e = exp(z)
    s = e.sum(axis=-1)
    log_s = mx.log(s)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1)[..., 0] - log_s
    entropy = log_s - (e * z).sum(axis=-1) / s  # -sum p log p, p = e / s, log p = z - log s
    return logp, entropy, e, s


def rl_loss(model: nn.Module, mb: dict[str, mx.array], rl: Any, kl_penalty: mx.array,
            temperature: float, split: Split | None = None, limit_mb: float | None = None
            ) -> tuple[mx.array, dict[str, mx.array]]:
    """(loss, aux) for one micro-batch, differentiable, in one pass of the transformer: the
    head's log-probs a chunk of at most `limit_mb` MB of logits at a time where the model splits
    (`head_logprobs`), else the full logits. `mb` holds tokens [N, T+1],
    mask/weights/old_logp/ref_logp [N, T], adv [N] or [N, T] (backends.batch.build), or with
    `prefix` the layout of backends.batch.build_shared; with a critic also returns and
    old_values [N, T], and the values come from `model.value_head` on the hidden states
    (`split` needed). aux holds masked sums (divide by aux['tokens'] for means)."""
    values = None
    targets = mb["tokens"][:, 1:]
    if split is None:
        logp, entropy = logprobs_and_entropy(shared_prompt.batch_logits(model, mb), targets,
                                             temperature)
    else:
        hidden = shared_prompt.batch_logits(split.body, mb)
        logp, entropy = head_logprobs(split, hidden, targets, temperature, limit_mb,
                                      entropy_grad=rl.entropy_coef != 0)
        if "returns" in mb:
            values = model.value_head(hidden)
    if rl.entropy_coef == 0:
        entropy = mx.stop_gradient(entropy)
    return objective(logp, entropy, mb, rl, kl_penalty, values=values)


def token_logprobs(model: nn.Module, tokens: mx.array, temperature: float = 1.0
                   ) -> tuple[mx.array, mx.array]:
    """Log-probs of tokens[:, 1:] given tokens[:, :-1] at `temperature`, and the entropy of each
    next-token distribution: tokens [B, T] -> ([B, T-1], [B, T-1])."""
    return logprobs_and_entropy(model(tokens[:, :-1]), tokens[:, 1:], temperature)
