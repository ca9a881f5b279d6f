"""The speed-only swaps give the same numbers: the CPU attention softmax and SwiGLU
(cpu_kernels.py) against mlx-lm's, the fused-LoRA decode layers (backends.mlx.lora_fused) against
the adapters, and the per-phase OpenBLAS thread count (blas.blas_threads) is set and restored."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.models.qwen2 as qwen2
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import activations
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.tuner.lora import LoRALinear

from mlx_rlaif import cpu
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.mlx.policy import fused_lora_bytes, load_policy, lora_fused
from mlx_rlaif.cpu import blas
from mlx_rlaif.cpu import kernels as cpu_kernels
from mlx_rlaif.cpu.kernels import fast_cpu_kernels, scaled_dot_product_attention, swiglu


def _close(a: mx.array, b: mx.array, tol: float = 2e-5) -> None:
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=tol, atol=tol)


def test_swiglu_values_and_gradient() -> None:
    g = mx.array([-300.0, -90.0, -20.0, -1.5, -1e-3, 0.0, 0.7, 3.0, 40.0, 300.0])
    x = mx.linspace(-2.0, 2.0, g.size)
    _close(swiglu(g, x), activations.swiglu(g, x))
    fast = mx.grad(lambda a, b: swiglu(a, b).sum(), argnums=(0, 1))(g, x)
    ref = mx.grad(lambda a, b: (nn.silu(a) * b).sum(), argnums=(0, 1))(g, x)
    for f, r in zip(fast, ref, strict=True):
        assert bool(mx.isfinite(f).all())  # no nan from an overflowing exponent
        _close(f, r)


def test_swiglu_keeps_bfloat16() -> None:
    """In bfloat16 the output and gradients keep the inputs' dtype, as mlx-lm's swiglu's do (the
    float32 sigmoid made them float32, and a bfloat16 model's update failed with '[astype] Type
    of cotangents does not match primal output type')."""
    g, x = (mx.linspace(-3.0, 3.0, 16).astype(mx.bfloat16) * s for s in (1.0, 0.5))
    assert swiglu(g, x).dtype == mx.bfloat16
    _close(swiglu(g, x).astype(mx.float32), activations.swiglu(g, x).astype(mx.float32), 2e-2)
    grads = mx.grad(lambda a, b: (swiglu(a, b).astype(mx.float32) * 2).sum(), argnums=(0, 1))(g, x)
    ref = mx.grad(lambda a, b: (activations.swiglu(a, b).astype(mx.float32) * 2).sum(),
                  argnums=(0, 1))(g, x)
    for f, r in zip(grads, ref, strict=True):
        assert f.dtype == mx.bfloat16
        _close(f.astype(mx.float32), r.astype(mx.float32), 2e-2)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive", "per_head"])
@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 7), (1, 9)])
def test_attention_matches_mlx_fast(mask_kind: str, L: int, S: int) -> None:
    mx.random.seed(0)
    B, Hq, Hk, D = 2, 4, 2, 8  # grouped-query: 2 query heads per key head
    q, k, v = (mx.random.normal((B, h, n, D)) for h, n in ((Hq, L), (Hk, S), (Hk, S)))
    mask: object = {"none": None, "causal": "causal",
                    "bool": mx.random.uniform(shape=(B, 1, L, S)) > 0.3,
                    "additive": mx.random.normal((L, S)),
                    "per_head": mx.random.uniform(shape=(B, Hq, L, S)) > 0.3}[mask_kind]
    if mask_kind in ("bool", "per_head"):
        mask = mask | (mx.arange(S) == S - 1)  # every query sees at least one key

    def f(fn: object, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        return fn(q, k, v, None, 0.35, mask)

    ours = f(scaled_dot_product_attention, q, k, v)
    ref = f(mlx_lm_base.scaled_dot_product_attention, q, k, v)
    _close(ours, ref)
    gv = mx.random.normal(ref.shape)
    g_ours = mx.grad(lambda *a: (f(scaled_dot_product_attention, *a) * gv).sum(),
                     argnums=(0, 1, 2))(q, k, v)
    g_ref = mx.grad(lambda *a: (f(mlx_lm_base.scaled_dot_product_attention, *a) * gv).sum(),
                    argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref, strict=True):
        _close(a, b, 1e-4)



def _compiled_peak_per_layer(layer: Any) -> float:
    """MLX's peak memory of a compiled value_and_grad through a stack of `layer` calls, per
    layer (10 layers against 2, each run warm), in bytes."""

    def peak(n: int) -> int:
        mx.random.seed(0)
        x0, k, v = (mx.random.normal((1, h, 512, 32)) for h in (8, 2, 2))
        ws = [mx.random.normal((32, 32)) * 0.1 for _ in range(n)]

        def f(ws: list[mx.array], x: mx.array) -> mx.array:
            for w in ws:
                x = x + layer(x @ w, k, v)
            return x.sum()

        step = mx.compile(mx.value_and_grad(f))
        mx.eval(step(ws, x0))  # traced and compiled
        gc.collect()
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        mx.eval(step(ws, x0))
        return mx.get_peak_memory()

    return (peak(10) - peak(2)) / 8


def test_compiled_backward_recomputes_instead_of_keeping() -> None:
    """Under `mx.compile` the backward's recomputation of the attention probabilities (and of
    SwiGLU's sigmoid) must not be merged with the forward's: merged, every layer's [8, 512, 512]
    float32 probabilities (8.4 MB) stay from the forward to the backward (measured 16.6 MB a
    layer against 4.7 MB recomputed)."""
    probs = 8 * 512 * 512 * 4
    attention = _compiled_peak_per_layer(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, None, 0.2, "causal"))
    assert attention < probs, attention

    def swiglu_layer(x: mx.array, k: mx.array, v: mx.array) -> mx.array:
        h = mx.concatenate([x] * 16, axis=-1)  # [1, 8, 512, 512]: the same size as `probs`
        return swiglu(h, h * 0.5).reshape(*x.shape[:-1], 16, 32).mean(axis=-2)

    # kept: the two inputs (2 x 8.4 MB); merged, also the sigmoid (measured 27.7 MB a layer
    # against 16.5 MB)
    assert _compiled_peak_per_layer(swiglu_layer) < 2.5 * probs

def test_swap_is_scoped_and_model_output_unchanged(micro_model: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    policy = load_policy(str(micro_model))
    model = policy.model
    tokens = mx.array([[5, 9, 13, 2, 7, 30]])
    ref = model(tokens)
    assert qwen2.swiglu is activations.swiglu
    with fast_cpu_kernels(model):
        if mx.default_device() == mx.cpu:
            assert qwen2.swiglu is swiglu
            assert qwen2.scaled_dot_product_attention is scaled_dot_product_attention
        with fast_cpu_kernels(model):  # nested: the inner block leaves the outer swap alone
            pass
        if mx.default_device() == mx.cpu:
            assert qwen2.swiglu is swiglu
        ours = model(tokens)
    assert qwen2.swiglu is activations.swiglu
    assert qwen2.scaled_dot_product_attention is mlx_lm_base.scaled_dot_product_attention
    _close(ours, ref, 1e-4)
    monkeypatch.setenv("MLX_RLAIF_CPU_KERNELS", "0")
    assert not cpu.active()
    with fast_cpu_kernels(model):
        assert qwen2.swiglu is activations.swiglu


def test_lora_fused_decodes_the_same_and_restores(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    model = policy.model
    mx.random.seed(3)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    before = dict(tree_flatten(model.trainable_parameters()))
    tokens = mx.array([[5, 9, 13, 2, 7, 30], [8, 8, 1, 4, 2, 3]])
    ref = model(tokens)
    size = fused_lora_bytes(model)
    assert size is not None and size > 0
    with lora_fused(model, size) as fused:
        assert fused
        assert not [m for _, m in lora_layers(model)]  # plain layers while fused
        out = model(tokens)
    _close(out, ref, 1e-4)
    assert len([m for _, m in lora_layers(model)]) == len(before) // 2  # the adapters are back, untouched
    after = dict(tree_flatten(model.trainable_parameters()))
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)
    with lora_fused(model, size - 1) as fused:  # over the threshold: left alone
        assert not fused and [m for _, m in lora_layers(model)]


def test_lora_fused_never_for_quantized(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    nn.quantize(policy.model, group_size=32, bits=8,
                class_predicate=lambda _, m: isinstance(m, nn.Linear)
                and m.weight.shape[-1] % 32 == 0)
    if not any(isinstance(m.linear, nn.QuantizedLinear) for m in [m for _, m in lora_layers(policy.model)]
               if isinstance(m, LoRALinear)):
        pytest.skip("no adapted layer could be quantized in this model")
    assert fused_lora_bytes(policy.model) is None
    with lora_fused(policy.model, 2**40) as fused:
        assert not fused


@pytest.mark.skipif(not sys.platform.startswith("linux") or blas.openblas_thread_fns() is None,
                    reason="OpenBLAS is not loaded in this process")
def test_blas_threads_set_and_restored() -> None:
    get = blas.openblas_thread_fns()[0]
    before = get()
    with blas.blas_threads(2):
        assert get() == 2
        with blas.blas_threads(0):  # 0: leave it
            assert get() == 2
    assert get() == before


def test_decode_rope_matches_mx_fast_and_is_scoped(micro_model: Path) -> None:
    offset = mx.array([0, 7, 1000, 131000])  # per-row positions, as a batch cache gives them
    for rope in (nn.RoPE(16, base=10000.0, scale=0.5), nn.RoPE(64, base=1e6)):
        for dtype in (mx.float32, mx.bfloat16):  # the same numbers as training's RoPE, exactly
            x = mx.random.normal((4, 2, 1, rope.dims)).astype(dtype)
            fast = cpu_kernels.DecodeRoPE(rope)(x, offset=offset)
            assert fast.dtype == dtype and mx.array_equal(fast, rope(x, offset=offset))
    rope, x5 = nn.RoPE(16), mx.random.normal((3, 4, 5, 16))
    for x_, off in ((x5, 2), (x5[:, :, :1], mx.array(3))):  # several positions, or one offset
        # for every row: the wrapped RoPE itself
        assert mx.array_equal(cpu_kernels.DecodeRoPE(rope)(x_, offset=off), rope(x_, offset=off))
    model = load_policy(str(micro_model)).model
    attn = [m for m in model.modules() if hasattr(m, "rope")]
    with cpu_kernels.decode_rope(model):
        if mx.default_device() == mx.cpu:
            assert all(type(m.rope) is cpu_kernels.DecodeRoPE for m in attn)
        assert not any("_inv_freq" in k for k, _ in tree_flatten(model.parameters()))
    assert all(type(m.rope) is nn.RoPE for m in attn)


def test_transposed_decode_linears_match_and_restore(micro_model: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`compiled_decode_kernels(model, transposed=True)` makes the blocks' linear layers (an
    adapter's base layer, or a fused copy) `DecodeLinear`s, not the head; the outputs are the
    same, and the layers are put back on exit. Over the byte bound, without `transposed`, or in
    bfloat16, nothing changes."""
    from mlx_rlaif.cpu import decode_kernels

    model = load_policy(str(micro_model)).model
    mx.random.seed(4)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    tokens = mx.array([[5, 9, 13, 2, 7, 30], [8, 8, 1, 4, 2, 3]])
    ref = model(tokens)

    def kinds() -> dict[str, type]:
        return {n: type(m) for n, m in model.named_modules()
                if isinstance(m, nn.Linear | decode_kernels.DecodeLinear)}

    before = dict(model.named_modules())
    plain = kinds()
    assert decode_kernels.block_linears(model)  # the adapters' base layers
    for fuse in (False, True):
        with lora_fused(model, 2**40 if fuse else 0), \
                decode_kernels.compiled_decode_kernels(model, transposed=True):
            now = kinds()
            if mx.default_device() == mx.cpu:
                assert not decode_kernels.block_linears(model)
                assert any(t is decode_kernels.DecodeLinear for t in now.values())
                assert all(t is decode_kernels.DecodeLinear for n, t in now.items()
                           if n.startswith("model.layers."))
            _close(model(tokens), ref, 1e-4)
    assert kinds() == plain and all(m is before[n] for n, m in model.named_modules())
    with decode_kernels.compiled_decode_kernels(model, transposed=False):
        assert kinds() == plain
    monkeypatch.setattr(decode_kernels, "TRANSPOSED_MAX_BYTES", 0)
    with decode_kernels.compiled_decode_kernels(model, transposed=True):
        assert kinds() == plain
    monkeypatch.undo()
    model.set_dtype(mx.bfloat16)  # MLX's own product, not OpenBLAS's: left as it is
    assert not decode_kernels.block_linears(model) and not decode_kernels.transposed_bytes(model)
    with decode_kernels.compiled_decode_kernels(model, transposed=True):
        assert kinds() == plain


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_decode_linear_is_the_linear(dtype: mx.Dtype) -> None:
    from mlx_rlaif.cpu.decode_kernels import DecodeLinear

    x = mx.random.normal((5, 3, 16), key=mx.random.key(1)).astype(dtype)
    for bias in (True, False):
        lin = nn.Linear(16, 24, bias=bias)
        lin.set_dtype(dtype)
        out = DecodeLinear(lin)(x)
        assert out.dtype == dtype and out.shape == (5, 3, 24)
        _close(out.astype(mx.float32), lin(x).astype(mx.float32),
               1e-5 if dtype == mx.float32 else 2e-2)
