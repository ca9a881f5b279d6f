"""Kernels for the compiled decode step (backends/mlx/compiled_decode.py) on MLX's CPU build.

Inside the compiled step every shape is fixed for the trace (the KV buffers grow by whole
buckets), so what `kernels.py` keeps shapeless for a key length that grows every step can be
specialized here (measured in BENCHMARKS.md, "Decoding: where a step goes"):
- `decode_attention`: one query per row. The scores are `keys @ q^T` (a [length, head dim] by
  [head dim, query heads per key head] product per row and key head, which OpenBLAS runs faster
  than the [query heads, head dim] by [head dim, length] one), the softmax's exponential is
  `kernels.pow2` (vectorized; the shapeless attention takes the C library's powf per element),
  and there is no backward pass (decoding never differentiates). Anything else (several query
  tokens, attention sinks, quantized caches, a mask that is not an array) goes to
  `kernels.scaled_dot_product_attention`.
- shared RoPE tables: every `kernels.DecodeRoPE` of one frequency table reads the same arrays,
  held outside the model's parameters (a plain attribute shadowing its own), so that the
  compiled step sees them as one constant and `mx.compile` computes the rotation angles of a
  step once for all layers instead of once per layer and projection (the positions are the
  same; arrays among the model's parameters are separate inputs of the compiled step).
- `DecodeLinear`: the transformer blocks' float32 linear layers (a fused decode copy's, or an
  unfused adapter's base layer) with the weight stored transposed, [in, out], so a step's
  products are `x @ W_t` with neither operand transposed. OpenBLAS packs the weight on every
  call, and on one thread packs this layout faster: 11-18% more tokens/s at widths 4 and 8. On
  every core (width 16 and up) it was level at 16 and 3% slower at 32, so the decode loop asks
  for it only where it decodes at the default thread count (`transposed`; BENCHMARKS.md,
  "Decoding: where a step goes"; `tools/profile_decode.py --ablate transposed`). Not the
  output head (a vocabulary-wide product, faster as it is). The copies cost the blocks' weight
  bytes again, so models whose block weights exceed `TRANSPOSED_MAX_BYTES` decode as they are.

`compiled_decode_kernels(model, transposed)` applies all three for the duration of a `with`
block and restores the model's modules on exit; like everything in this folder it does nothing
unless the gate (`cpu.active()`) is on. Results equal `kernels.py`'s and `nn.Linear`'s up to
float rounding (tests/test_decode.py checks the log-probs against the trainer's forward, float32
and bfloat16; tests/test_cpu_kernels.py the layers).

Not covered: the GPU (Metal's and CUDA's fused attention and RoPE kernels), the training passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from . import active, kernels

TRANSPOSED_MAX_BYTES = 256 * 2**20  # block weights up to this are copied transposed (decoding)


def decode_attention(queries: mx.array, keys: mx.array, values: mx.array, cache: Any,
                     scale: float, mask: Any, sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention` for one query per row: queries [B, Hq, 1, D],
    keys/values [B, Hk, S, D], mask an array broadcastable to [B, 1, 1, S] (boolean, True:
    attend, or additive)."""
    per_row = isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[1] == 1 \
        and mask.shape[2] == 1
    if queries.shape[2] != 1 or sinks is not None or hasattr(cache, "bits") or not per_row:
        return kernels.scaled_dot_product_attention(queries, keys, values, cache, scale, mask,
                                                    sinks)
    B, Hq, _, D = queries.shape
    Hk = keys.shape[1]
    q = (queries * scale).reshape(B, Hk, Hq // Hk, D)
    s = (keys @ q.swapaxes(-1, -2)).swapaxes(-1, -2).astype(mx.float32)  # [B, Hk, rep, S]
    s = mx.where(mask, s, kernels._MASKED) if mask.dtype == mx.bool_ \
        else s + mask.astype(mx.float32)
    e = kernels.pow2(mx.maximum((s - s.max(axis=-1, keepdims=True)) * kernels.LOG2E,
                                kernels.FLOOR))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(values.dtype)
    return (p @ values).reshape(B, Hq, 1, values.shape[-1])


class DecodeLinear(nn.Module):
    """An `nn.Linear` computed as x @ W_t (+ bias), its weight stored transposed, [in, out]."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight_t = mx.contiguous(linear.weight.T)
        if "bias" in linear:
            self.bias = linear.bias

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return mx.addmm(self.bias, x, self.weight_t)
        return x @ self.weight_t


def block_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, layer) of every plain float32 `nn.Linear` inside the model's transformer blocks
    (`model.layers`): a fused layer, or an adapter's base layer (`...q_proj.linear`). Float32
    only: OpenBLAS runs those products; MLX's own bfloat16 product was level or slower
    transposed (0.97x at width 8)."""
    inside = {id(m) for block in getattr(model, "layers", []) for m in block.modules()}
    return [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear
            and id(m) in inside and m.weight.dtype == mx.float32]


def transposed_bytes(model: nn.Module) -> int:
    """Bytes of the copies `compiled_decode_kernels(model, transposed=True)` makes (0: none, the
    gate is off or the blocks' weights exceed `TRANSPOSED_MAX_BYTES`); the memory plan counts
    them with the decode step."""
    return _within_bound(block_linears(model)) if active() else 0


def _within_bound(linears: list[tuple[str, nn.Linear]]) -> int:
    size = sum(m.weight.nbytes for _, m in linears)
    return size if size <= TRANSPOSED_MAX_BYTES else 0


@contextlib.contextmanager
def _transposed_linears(model: nn.Module) -> Iterator[None]:
    """Within the block, `block_linears` are `DecodeLinear`s (where their bytes are within
    `TRANSPOSED_MAX_BYTES`); the layers are put back on exit."""
    linears = block_linears(model)
    if not _within_bound(linears):
        yield
        return
    model.update_modules(tree_unflatten([(n, DecodeLinear(m)) for n, m in linears]))
    try:
        yield
    finally:
        model.update_modules(tree_unflatten(linears))


@contextlib.contextmanager
def compiled_decode_kernels(model: nn.Module, transposed: bool = False) -> Iterator[None]:
    """Within the block, `model`'s architecture modules attend with `decode_attention`, its
    `DecodeRoPE`s share their tables and, with `transposed`, its blocks' linear layers are
    `DecodeLinear`s (CPU only; restored on exit)."""
    if not active():
        yield
        return
    with (_transposed_linears(model) if transposed else contextlib.nullcontext()), \
            _decode_attention_and_rope(model):
        yield


@contextlib.contextmanager
def _decode_attention_and_rope(model: nn.Module) -> Iterator[None]:
    swapped = [(mod, name, old) for mod in kernels._arch_modules(model)
               for name, old in vars(mod).copy().items()
               if old is kernels.scaled_dot_product_attention]
    for mod, name, _ in swapped:
        setattr(mod, name, decode_attention)
    tables: dict[tuple, tuple[mx.array, mx.array]] = {}
    ropes = [m for m in model.modules() if isinstance(m, kernels.DecodeRoPE)]
    for m in ropes:
        key = (m.rope.dims, m.rope.base, m.rope.scale)
        inv_freq, scale = tables.setdefault(key, (mx.array(m._inv_freq), mx.array(m._scale)))
        mx.eval(inv_freq, scale)  # constants of the compiled step: evaluated
        m.__dict__.update(_inv_freq=inv_freq, _scale=scale)  # shadows the module's entries
    try:
        yield
    finally:
        for mod, name, old in swapped:
            setattr(mod, name, old)
        for m in ropes:
            m.__dict__.pop("_inv_freq", None)
            m.__dict__.pop("_scale", None)
