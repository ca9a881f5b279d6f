"""The model-calling half of the MLX loss: log-probs and entropies of the completion tokens, and
`rl_loss(model, mb, ...) -> (loss, aux)` for `nn.value_and_grad`, which hands them to the pure
objective (`algo.objective`).

Memory: at a real vocabulary (Qwen2.5: 151,936) the float32 logits of a micro-batch,
[sequences, positions, vocabulary], are the largest arrays of the step (8 completions of 512
tokens: 2.5 GB each). So the model is split into its transformer (`body`) and its own output
head (`head`: `lm_head`, or the tied embedding's `as_linear`, quantized in a 4-bit model; never
a re-implementation), and where the logits would exceed `LOGITS_CHUNK_MB` the log-probs and
entropies are computed a chunk of positions at a time, and their gradient too, each chunk's
logits recomputed from the hidden states (`chunked_value_and_grad`): the vocabulary-sized memory
is that of one chunk whatever the number of sequences and their length (Cut Cross-Entropy's
aim, by recomputation; tests/test_chunked_loss.py checks values and gradients against the full
computation). Each chunk is evaluated before the next is built: MLX schedules independent
branches of a graph together, so a lazily built chain of chunks would hold them all at once.
Smaller micro-batches keep the one-pass path.

Speed: the vocabulary-sized work (log-softmax and entropy over [N, T, V]) dominates the loss on
small models, so `logprobs_and_entropy` does a single exp pass over the logits, and on MLX's CPU
backend (the `cpu` gate) computes it as 2**(x log2 e), about 3x faster there than `mx.exp`
(BENCHMARKS.md).

Not covered: value losses, sequence-level importance ratios (GSPO), architectures that
transform the logits after the head (logit soft-capping: `split_head` finds them and the full
logits path runs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ... import cpu
from ...algo.gae import value_loss
from ...algo.objective import objective
from ...cpu.kernels import power_exp
from ..batch import chunks
from . import shared_prompt

LOGITS_CHUNK_MB = 64  # the float32 logits of one chunk of positions, at most


@dataclass(frozen=True)
class Split:
    """model(x, cache) == head(body(x, cache)): the transformer and the model's own head."""

    body: nn.Module
    head: Callable[[mx.array], mx.array]
    vocab: int


def split_head(model: nn.Module) -> Split | None:
    """The model as transformer + output head (mlx-lm's layout: `model.model`, then `lm_head` or
    the tied `embed_tokens.as_linear`), checked on a 2-token input; None where the model does
    more than that (soft-capping, scaling) or has another layout."""
    body = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if head is None and body is not None and hasattr(getattr(body, "embed_tokens", None),
                                                   "as_linear"):
        head = body.embed_tokens.as_linear
    if body is None or head is None:
        return None
    x = mx.array([[1, 2]])
    try:
        full, parts = model(x), head(body(x))
    except Exception:  # noqa: BLE001  (any architecture whose body takes other arguments)
        return None
    if full.shape != parts.shape or not mx.allclose(full, parts, rtol=1e-4, atol=1e-4).item():
        return None
    return Split(body, head, full.shape[-1])


def chunk_tokens(vocab: int, limit_mb: int | None = None) -> int:
    """Positions per chunk so that one chunk's float32 logits take at most `limit_mb` (default
    LOGITS_CHUNK_MB)."""
    return max(1, ((limit_mb or LOGITS_CHUNK_MB) << 20) // (4 * vocab))


def chunk_slices(split: Split, positions: int) -> list[slice]:
    return chunks(positions, chunk_tokens(split.vocab))


def head_stats(split: Split, hidden: mx.array, targets: mx.array, temperature: float
               ) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) [N, W] of `targets` [N, W] under the head applied to `hidden`
    [N, W, D], chunk by chunk, each chunk evaluated before the next is built (MLX would
    otherwise schedule the independent chunks together): one chunk's logits at a time."""
    n, w, d = hidden.shape
    flat_h, flat_t = hidden.reshape(n * w, d), targets.reshape(n * w)
    parts = []
    for s in chunk_slices(split, n * w):
        part = logprobs_and_entropy(split.head(flat_h[s]), flat_t[s], temperature)
        mx.eval(part)
        parts.append(part)
    return (mx.concatenate([p[0] for p in parts]).reshape(n, w),
            mx.concatenate([p[1] for p in parts]).reshape(n, w))


def head_grad(split: Split, hidden: mx.array, targets: mx.array, temperature: float,
              d_logp: mx.array, d_entropy: mx.array) -> mx.array:
    """d loss / d hidden [N, W, D] from the loss's gradient with respect to the log-probs and
    entropies [N, W]: each chunk's logits recomputed and differentiated, one chunk at a time."""
    n, w, d = hidden.shape
    flat_h, flat_t = hidden.reshape(n * w, d), targets.reshape(n * w)
    g_logp, g_ent = d_logp.reshape(n * w), d_entropy.reshape(n * w)
    parts = []
    for s in chunk_slices(split, n * w):
        t = flat_t[s]
        _, (dh,) = mx.vjp(lambda h, t=t: logprobs_and_entropy(split.head(h), t, temperature),
                          [flat_h[s]], [g_logp[s], g_ent[s]])
        mx.eval(dh)
        parts.append(dh)
    return mx.concatenate(parts).reshape(n, w, d)


def needs_chunks(split: Split | None, mb: dict[str, mx.array]) -> bool:
    """Whether a micro-batch's logits exceed LOGITS_CHUNK_MB (and the model can be split)."""
    n, width = mb["tokens"].shape
    return split is not None and n * (width - 1) > chunk_tokens(split.vocab)


def critic_loss(model: nn.Module, hidden: mx.array, mb: dict[str, mx.array], rl: Any
                ) -> tuple[mx.array, dict[str, mx.array]]:
    """The weighted clipped value loss of `model.value_head` on `hidden`, and its aux sums."""
    values = model.value_head(hidden)
    vl = value_loss(values, mb["old_values"], mb["returns"], rl.value_clip, mx)
    total = (vl * mb["weights"]).sum()
    return total, {"value_loss": total, "value": (values * mb["mask"]).sum()}


def micro_batch_stats(model: nn.Module, split: Split | None, mb: dict[str, mx.array],
                      temperature: float) -> tuple[mx.array, mx.array]:
    """(log-probs, entropies) of a micro-batch's targets, without gradients: chunk by chunk
    where the logits would exceed LOGITS_CHUNK_MB (`needs_chunks`), else in one pass."""
    targets = mb["tokens"][:, 1:]
    if not needs_chunks(split, mb):
        return logprobs_and_entropy(shared_prompt.batch_logits(model, mb), targets, temperature)
    return head_stats(split, shared_prompt.batch_logits(split.body, mb), targets, temperature)


def chunked_value_and_grad(model: nn.Module, split: Split, rl: Any, temperature: float
                           ) -> Callable[..., Any]:
    """`(mb, kl_penalty) -> ((loss, aux), grads)`, as `nn.value_and_grad(model, rl_loss)` gives
    it, in bounded vocabulary memory. Three passes: the transformer's hidden states (kept; its
    activations are not); the head chunk by chunk for the log-probs and entropies, then, from
    the objective's gradient with respect to them (a small [N, W] computation), the hidden
    states' gradient chunk by chunk; last, the adapters' gradient as that of
    sum(hidden * d_hidden) through the transformer. The transformer runs forward twice (about
    a third more compute than one backward pass); the head is frozen (its gradient is not
    taken)."""

    def surrogate(m: nn.Module, mb: dict[str, mx.array], d_hidden: mx.array) -> mx.array:
        h = shared_prompt.batch_logits(split.body, mb)
        out = (h * d_hidden).sum()
        return out + rl.value_coef * critic_loss(m, h, mb, rl)[0] if "returns" in mb else out

    grad_of = nn.value_and_grad(model, surrogate)
    # the transformer's passes compiled (as the unchunked update is): eager MLX pays per op,
    # which on a small model costs more than the arithmetic; the head's chunks stay eager
    body = with_model_state(lambda mb: shared_prompt.batch_logits(split.body, mb), model)
    body_grads = with_model_state(lambda mb, d_hidden: grad_of(model, mb, d_hidden)[1], model)

    def fn(mb: dict[str, mx.array], kl_penalty: mx.array) -> Any:
        targets = mb["tokens"][:, 1:]
        hidden = mx.stop_gradient(body(mb))
        mx.eval(hidden)
        logp, entropy = head_stats(split, hidden, targets, temperature)

        def loss_of(lp: mx.array, ent: mx.array) -> tuple[mx.array, dict[str, mx.array]]:
            return objective(lp, ent, mb, rl, kl_penalty)

        (loss, aux), (d_logp, d_ent) = mx.value_and_grad(loss_of, argnums=(0, 1))(logp, entropy)
        d_hidden = head_grad(split, hidden, targets, temperature, d_logp, d_ent)
        critic = "returns" in mb
        grads = body_grads(mb, d_hidden)
        if critic:
            v_loss, v_aux = critic_loss(model, hidden, mb, rl)
            loss = loss + rl.value_coef * v_loss
            aux = {**aux, **v_aux, "loss": loss}
        return (loss, aux), grads

    return fn


def with_model_state(fn: Callable[..., Any], model: nn.Module) -> Callable[..., Any]:
    """`fn` under `mx.compile`, the model's arrays and MLX's random state implicit inputs and
    outputs (retraced for each new input shape, as every compiled update here is)."""
    state = [model.state, mx.random.state]
    return mx.compile(fn, inputs=state, outputs=state)


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
            temperature: float, split: Split | None = None
            ) -> tuple[mx.array, dict[str, mx.array]]:
    """(loss, aux) for one micro-batch, differentiable (the full logits: `update.grad_fn` takes
    `chunked_value_and_grad` where they would not fit). `mb` holds tokens [N, T+1],
    mask/weights/old_logp/ref_logp [N, T], adv [N] or [N, T] (backends.batch.build), or with
    `prefix` the layout of backends.batch.build_shared; with a critic also returns and
    old_values [N, T], and the values come from `model.value_head` on the hidden states
    (`split` needed). aux holds masked sums (divide by aux['tokens'] for means)."""
    values = None
    if "returns" in mb:
        hidden = shared_prompt.batch_logits(split.body, mb)
        logits, values = split.head(hidden), model.value_head(hidden)
    else:
        logits = shared_prompt.batch_logits(model, mb)
    logp, entropy = logprobs_and_entropy(logits, mb["tokens"][:, 1:], temperature)
    if rl.entropy_coef == 0:
        entropy = mx.stop_gradient(entropy)
    return objective(logp, entropy, mb, rl, kl_penalty, values=values)


def token_logprobs(model: nn.Module, tokens: mx.array, temperature: float = 1.0
                   ) -> tuple[mx.array, mx.array]:
    """Log-probs of tokens[:, 1:] given tokens[:, :-1] at `temperature`, and the entropy of each
    next-token distribution: tokens [B, T] -> ([B, T-1], [B, T-1])."""
    return logprobs_and_entropy(model(tokens[:, :-1]), tokens[:, 1:], temperature)
