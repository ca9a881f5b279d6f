"""Faster attention, SwiGLU and decoding RoPE on MLX's CPU backend, for the duration of a phase.

On MLX's CPU build the transcendental element-wise ops are slow: `mx.exp`, `mx.sigmoid` (so
`nn.silu` and mlx-lm's `swiglu`) and the softmax inside `mx.fast.scaled_dot_product_attention`
run 2.5-4x slower than `mx.power(2, x)`. `fast_cpu_kernels(model)` swaps, for the duration of a
`with` block, the `swiglu` and `scaled_dot_product_attention` that the model's mlx-lm architecture
modules call for versions written with 2**(x log2 e), and restores them on exit. The attention
stacks the query heads that share a key head as rows of one matrix product (mx.fast's CPU
fallback broadcasts the keys instead). Their custom backward passes recompute the sigmoid and the
attention probabilities from the inputs instead of keeping them (under `mx.compile` too, which
would otherwise merge the recomputation with the forward's: `_after`). They equal mlx-lm's,
values and gradients, up to float32 rounding (tests/test_cpu_kernels.py). They compute in float32
and return their inputs' dtype, forward and backward: a custom VJP must give each primal's dtype
back, or a bfloat16 or float16 model's `value_and_grad` fails (tests/test_low_precision.py).
On the Qwen2.5-0.5B shape the update ran 27 -> 20 s and its peak memory fell 5.07 -> 4.43 GB
(BENCHMARKS.md).

`pow2` goes further where a kernel is compiled per shape (SwiGLU's sigmoid; the sampler in
decode.py): 2**y from exponent bits and a polynomial, plain multiplies and adds that the
compiled loop vectorizes, 2.4x faster than `mx.power` here. The attention keeps `mx.power`: its
shapeless kernel serves every key length of a decode, and the bit view has no shapeless form.

`decode_rope(model)` wraps the attention layers' `nn.RoPE` while decoding: the rotation of one
position per row is one compiled kernel instead of `mx.fast.rope`'s ~15-op CPU fallback.

`power_exp` and `sampler_exp` are the exponentials of the loss's log-softmax and of the
sampler, for the same reason.

Every context manager here is a no-op unless the gate (`cpu.active()`) is on; mlx-lm's modules
are looked up only then, so a rename in mlx-lm cannot break an import on Apple silicon.

Covered: mlx-lm architectures that import these two functions (llama.py, qwen2.py, qwen3.py,
phi3.py and most others), boolean, additive, per-head and "causal" masks, grouped-query
attention; plain `nn.RoPE` (not the scaled variants, not the interleaved layout). Not covered
(mlx-lm's own functions run): the GPU (Metal's fused kernels are fast), attention sinks,
quantized KV caches. Opt out with MLX_RLAIF_CPU_KERNELS=0.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from functools import partial
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import active
from .blas import blas_threads
from .quantized import dequantized_matmuls

LOG2E = 1.4426950408889634
_MASKED = -1e30  # not -inf: a row with every key masked stays finite (uniform), as a pad row
# Exponents of 2 are kept >= this: below about -126 the C library's powf leaves its fast path for
# the underflow one, about 3x slower, which masked attention scores (-1e30) hit on every call
# (and `pow2` needs y >= -126). 2**-125.5 (3e-38) is a normal float that vanishes next to a
# softmax sum (>= 1).
FLOOR = -125.5
_ROUND = 12582912.0  # 1.5 * 2**23: (y + _ROUND) - _ROUND is y rounded to the nearest integer
_POW2_POLY = tuple(math.log(2) ** k / math.factorial(k) for k in range(8))  # 2**f = e**(f ln 2)


def pow2(y: mx.array) -> mx.array:
    """2**y for float32 y in [-126, 127] (the caller clamps): 2**round(y) made
    from its exponent bits, times a degree-7 polynomial of the rest f, |f| <= 1/2 (truncation
    error below 1e-8 relative). Only multiplies, adds and integer ops, which `mx.compile` fuses
    into loops the C++ compiler vectorizes, where `mx.power` calls the C library's scalar powf
    per element: 2.4x faster here (BENCHMARKS.md). Only under a shape-specialized `mx.compile`
    (the bit view has no shapeless form) and without gradients (nor a vjp)."""
    n = (y + _ROUND) - _ROUND
    f = y - n
    p = _POW2_POLY[-1]
    for c in reversed(_POW2_POLY[:-1]):
        p = p * f + c
    return p * mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)


def power_exp(x: mx.array) -> mx.array:
    """e**x as 2**(x log2 e): same float32 accuracy, ~3x faster than `mx.exp` on the CPU (the
    loss's log-softmax; not `exp2e`: its floor would keep one more vocabulary-sized array for the
    backward pass, +0.5 GB at the 0.5B shape)."""
    return mx.power(2.0, x * LOG2E)


def sampler_exp(z: mx.array) -> mx.array:
    """e**z for z <= 0 under a shape-specialized `mx.compile` (the sampler): `pow2`, floored."""
    return pow2(mx.maximum(z * LOG2E, FLOOR))


@partial(mx.compile, shapeless=True)
def exp2e(x: mx.array) -> mx.array:
    """e**x as 2**(x log2 e), one fused pass; e**x below 2**-125.5 reads as 2**-125.5. (The C
    library's powf: shapeless, for the attention, whose key length grows every decoding step.)"""
    return mx.power(2.0, mx.maximum(x * LOG2E, FLOOR))


def _sigmoid(x: mx.array) -> mx.array:
    """1 / (1 + e**-x) in float32 (pow2's rounding needs float32's mantissa). The exponent is
    capped so that very negative inputs give 0, not a nan from inf / inf in a gradient (and
    floored, as in `exp2e`)."""
    return 1.0 / (1.0 + pow2(mx.clip(x.astype(mx.float32) * -LOG2E, FLOOR, 126.0)))


@mx.compile  # one trace per shape: a decoding step's is the same at every step
def _swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """In float32 (`pow2` reads float32 bits), the result in the inputs' dtype, as mlx-lm's."""
    g = gate.astype(mx.float32)
    return (g * _sigmoid(g) * x.astype(mx.float32)).astype(mx.result_type(gate, x))


@mx.compile
def _swiglu_vjp(gate: mx.array, x: mx.array, cotangent: mx.array) -> tuple[mx.array, mx.array]:
    """In float32; each gradient in its input's dtype (a custom VJP must return its primals')."""
    g, c = gate.astype(mx.float32), cotangent.astype(mx.float32)
    s = _sigmoid(g)
    silu = g * s
    return ((c * x.astype(mx.float32) * (s + silu * (1.0 - s))).astype(gate.dtype),
            (c * silu).astype(x.dtype))


@mx.custom_function
def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x. The backward recomputes the sigmoid from the inputs, so the forward keeps
    no intermediate of its own for it (less memory than differentiating the formula)."""
    return _swiglu(gate, x)


@swiglu.vjp
def _swiglu_grad(primals: tuple[mx.array, mx.array], cotangent: mx.array,
                 output: mx.array) -> tuple[mx.array, mx.array]:
    gate, x = _after(list(primals), cotangent)
    return _swiglu_vjp(gate, x, cotangent)


def _after(inputs: list[mx.array], cotangent: mx.array) -> list[mx.array]:
    """`inputs`, made to depend on the cotangent, so that what a backward pass recomputes from
    them is computed in the backward pass. Without it `mx.compile` sees the recomputation as the
    same expression as the forward's and merges the two, keeping every layer's attention
    probabilities (or SwiGLU's sigmoid) from the forward to the backward: at the Qwen2.5-0.5B
    shape, 1,024 tokens, ~80 MB a layer (tests/test_cpu_kernels.py)."""
    return mx.depends(inputs, [cotangent])


def _mask_array(mask: Any, q_len: int, k_len: int, heads: int, kv_heads: int) -> mx.array:
    """mlx-lm's mask argument (None, "causal", or an array broadcastable to [B, Hq, L, S];
    boolean, True: attend, or additive) as a 5-D array [b, h, r, l, S] broadcastable to
    [B, Hk, rep, L, S], with l = 1 or L, and l = L wherever r = rep > 1."""
    if mask is None:
        return mx.array(True).reshape(1, 1, 1, 1, 1)
    if isinstance(mask, str):  # "causal", aligned to the last keys as mx.fast's is
        mask = mx.arange(k_len)[None] <= (mx.arange(q_len) + (k_len - q_len))[:, None]
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if m.shape[1] == 1:
        return m[:, :, None]
    m = mx.broadcast_to(m, (m.shape[0], heads, q_len, k_len))  # one mask per query head
    return m.reshape(m.shape[0], kv_heads, heads // kv_heads, q_len, k_len)


def _probs(q: mx.array, k: mx.array, mask: mx.array) -> mx.array:
    """softmax(q k^T + mask) in float32, q already scaled. q [B, Hk, rep * L, D] (the query heads
    that share a key head stacked as rows: one matrix product per key head, no copy of the
    keys), k [B, Hk, S, D], mask as `_mask_array` gives it -> [B, Hk, rep * L, S]."""
    s = (q @ k.swapaxes(-1, -2)).astype(mx.float32)
    B, Hk, RL, S = s.shape
    s = s.reshape(B, Hk, RL // mask.shape[3], mask.shape[3], S)
    s = mx.where(mask, s, _MASKED) if mask.dtype == mx.bool_ else s + mask.astype(s.dtype)
    e = exp2e(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).reshape(B, Hk, RL, S)


@mx.custom_function
def _attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array) -> mx.array:
    """q [B, Hk, rep * L, D] (scaled), k/v [B, Hk, S, D] -> [B, Hk, rep * L, D]."""
    return _probs(q, k, mask).astype(v.dtype) @ v


@_attention.vjp
def _attention_grad(primals: tuple, cotangent: mx.array, output: mx.array) -> tuple:
    """The probabilities are recomputed from q and k, so the forward keeps nothing of its own."""
    q, k, v, mask = primals
    q, k = _after([q, k], cotangent)
    p = _probs(q, k, mask)
    dv = p.astype(v.dtype).swapaxes(-1, -2) @ cotangent
    dp = (cotangent @ v.swapaxes(-1, -2)).astype(mx.float32)
    ds = (p * (dp - (dp * p).sum(axis=-1, keepdims=True))).astype(q.dtype)
    return ((ds @ k).astype(q.dtype), (ds.swapaxes(-1, -2) @ q).astype(k.dtype),
            dv.astype(v.dtype), mx.zeros_like(mask))  # each in its primal's dtype


def scaled_dot_product_attention(queries: mx.array, keys: mx.array, values: mx.array,
                                 cache: Any, scale: float, mask: Any,
                                 sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's `base.scaled_dot_product_attention`, with the softmax computed as 2**x and a
    backward that recomputes it.

    queries [B, Hq, L, D], keys/values [B, Hk, S, D] with Hq a multiple of Hk."""
    if sinks is not None or hasattr(cache, "bits"):
        from mlx_lm.models import base as mlx_lm_base

        return mlx_lm_base.scaled_dot_product_attention(queries, keys, values, cache, scale,
                                                        mask, sinks)
    B, Hq, L, D = queries.shape
    Hk, S = keys.shape[1], keys.shape[2]
    m = _mask_array(mask, L, S, Hq, Hk)
    q = (queries * scale).reshape(B, Hk, (Hq // Hk) * L, D)
    out = _attention(q, keys, values, m)
    return out.reshape(B, Hq, L, values.shape[-1])


@mx.compile
def _rope_step(x: mx.array, offset: mx.array, scale: mx.array, inv_freq: mx.array) -> mx.array:
    """Rotary embedding of one position per row: x [B, H, 1, D] at positions `offset` [B]
    (the default, non-interleaved layout: dimension i pairs with i + D/2). The angles as
    `mx.fast.rope` computes them, the rotation in x's dtype as it does (equal results, bfloat16
    included: tests/test_cpu_kernels.py)."""
    theta = (offset.astype(mx.float32) * scale)[:, None, None, None] * inv_freq
    cos, sin = mx.cos(theta).astype(x.dtype), mx.sin(theta).astype(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class DecodeRoPE(nn.Module):
    """Stands in for an `nn.RoPE` while decoding: one-token queries at per-row positions (a batch
    cache's offsets, one per row) take `_rope_step`, one compiled kernel where `mx.fast.rope`'s
    CPU fallback runs about fifteen ops; anything else goes to the wrapped RoPE."""

    def __init__(self, rope: nn.RoPE) -> None:
        super().__init__()
        self.rope = rope
        half = rope.dims // 2  # private names below: not parameters of the model
        self._inv_freq = mx.exp(-mx.arange(half, dtype=mx.float32) * (math.log(rope.base) / half))
        self._scale = mx.array(rope.scale, dtype=mx.float32)

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        per_row = isinstance(offset, mx.array) and offset.ndim == 1 \
            and offset.shape[0] == x.shape[0]
        if not per_row or x.shape[2] != 1 or x.shape[-1] != self.rope.dims:
            return self.rope(x, offset=offset)
        return _rope_step(x, offset, self._scale, self._inv_freq)


def _swaps() -> tuple[tuple[Any, Any], ...]:
    """(mlx-lm's function, ours) for each swapped kernel, looked up when first needed."""
    from mlx_lm.models import activations
    from mlx_lm.models import base as mlx_lm_base

    return ((activations.swiglu, swiglu),
            (mlx_lm_base.scaled_dot_product_attention, scaled_dot_product_attention))


def _arch_modules(model: nn.Module) -> list[ModuleType]:
    names = {type(m).__module__ for _, m in model.named_modules()}
    return [sys.modules[n] for n in sorted(names)
            if n.startswith("mlx_lm.models.") and n in sys.modules]


@contextlib.contextmanager
def fast_cpu_kernels(model: nn.Module) -> Iterator[None]:
    """Within the block, `model`'s architecture modules use this module's kernels, and its
    quantized layers BLAS's products (`quantized.dequantized_matmuls`) (CPU only)."""
    if not active():
        yield
        return
    swaps = _swaps()
    swapped = [(mod, name, old) for mod in _arch_modules(model)
               for name, old in vars(mod).copy().items()
               for orig, _ in swaps if old is orig]
    new = {id(orig): fast for orig, fast in swaps}
    for mod, name, old in swapped:
        setattr(mod, name, new[id(old)])
    try:
        with dequantized_matmuls(model):
            yield
    finally:
        for mod, name, old in swapped:
            setattr(mod, name, old)


@contextlib.contextmanager
def decode_rope(model: nn.Module) -> Iterator[None]:
    """Within the block, the attention layers' `nn.RoPE` (the plain kind; not the scaled
    variants, not the interleaved layout) are wrapped in `DecodeRoPE` (CPU only)."""
    mods = [m for m in model.modules() if type(getattr(m, "rope", None)) is nn.RoPE
            and not m.rope.traditional] if active() else []
    for m in mods:
        m.rope = DecodeRoPE(m.rope)
    try:
        yield
    finally:
        for m in mods:
            m.rope = m.rope.rope


@contextlib.contextmanager
def training_fast_paths(model: nn.Module) -> Iterator[None]:
    """The training phases' CPU fast paths (reference pass, update, SFT): these kernels and
    OpenBLAS on every core (`blas.blas_threads`). Both are no-ops where they do not apply."""
    with fast_cpu_kernels(model), blas_threads():
        yield
