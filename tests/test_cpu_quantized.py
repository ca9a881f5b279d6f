"""cpu/quantized.py: on MLX's CPU build, quantized layers multiply as `x @ dequantize(W).T`
within `fast_cpu_kernels`. The same values and gradients as `mx.quantized_matmul` (float32,
bfloat16; a linear layer with a bias, a LoRA on it, a tied head; a weight past the size cap in
blocks of rows), the layers' classes restored after the block, nothing swapped with the gate off
or in another quantization mode, and a backward pass that holds one layer's float weight at a time, not the model's: its
peak does not grow with depth (eager and compiled).

Not covered: speed (BENCHMARKS.md and tests/test_qlora.py's run), the GPU (nothing is swapped
there: the gate).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.tuner.lora import LoRALinear

from mlx_rlaif.cpu import quantized
from mlx_rlaif.cpu.kernels import fast_cpu_kernels
from mlx_rlaif.cpu.quantized import dequantized_matmuls


class Net(nn.Module):
    """A LoRA on a quantized linear layer with a bias, then a tied quantized head."""

    def __init__(self, dtype: mx.Dtype, bits: int = 4) -> None:
        super().__init__()
        lin = nn.Linear(128, 192, bias=True)
        emb = nn.Embedding(320, 192)
        lin.set_dtype(dtype)
        emb.set_dtype(dtype)
        self.proj = LoRALinear.from_base(nn.QuantizedLinear.from_linear(lin, 64, bits), r=4)
        self.proj.lora_b = mx.random.normal(self.proj.lora_b.shape).astype(dtype) * 0.1
        self.embed = nn.QuantizedEmbedding.from_embedding(emb, 64, bits)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embed.as_linear(self.proj(x))


def _loss(model: Net, x: mx.array) -> mx.array:
    return (model(x).astype(mx.float32) ** 2).mean()


def _values_and_grads(model: Net, x: mx.array) -> tuple:
    out = model(x)
    dx = mx.grad(lambda x: _loss(model, x))(x)
    _, g = nn.value_and_grad(model, lambda x: _loss(model, x))(x)
    return out, dx, g["proj"]["lora_a"], g["proj"]["lora_b"]


@pytest.mark.parametrize(("dtype", "bits", "tol"), [(mx.float32, 4, 2e-5), (mx.float32, 8, 2e-5),
                                                     (mx.bfloat16, 4, 2e-2)])
def test_same_values_and_gradients_as_quantized_matmul(dtype: mx.Dtype, bits: int,
                                                       tol: float) -> None:
    mx.random.seed(3)
    model = Net(dtype, bits)
    model.freeze(keys=["weight", "scales", "biases", "bias"])
    x = mx.random.normal((2, 5, 128)).astype(dtype)
    theirs = _values_and_grads(model, x)
    with fast_cpu_kernels(model):
        assert type(model.proj.linear) is quantized._Linear
        assert type(model.embed) is quantized._Embedding
        ours = _values_and_grads(model, x)
    assert type(model.proj.linear) is nn.QuantizedLinear and type(model.embed) is nn.QuantizedEmbedding
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype
        scale = float(mx.abs(b.astype(mx.float32)).max())
        np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                                   atol=tol * scale, rtol=tol)


def test_nothing_is_swapped_off_the_gate_or_in_another_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = Net(mx.float32)
    monkeypatch.setenv("MLX_RLAIF_CPU_KERNELS", "0")
    with dequantized_matmuls(model):
        assert type(model.proj.linear) is nn.QuantizedLinear
    fp4 = nn.QuantizedLinear(64, 64, bias=False, group_size=32, bits=4, mode="mxfp4")
    assert not quantized.eligible(fp4)


def test_a_weight_past_the_cap_is_dequantized_in_blocks_with_the_same_numbers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's 320 rows in blocks of 96 (the last one 32): the same values and gradients."""
    mx.random.seed(4)
    model = Net(mx.float32)
    model.freeze(keys=["weight", "scales", "biases", "bias"])
    x = mx.random.normal((2, 5, 128))
    theirs = _values_and_grads(model, x)
    monkeypatch.setattr(quantized, "MAX_FLOAT_BYTES", 96 * 192 * 4 + 100)
    blocks = []
    product = quantized._product
    monkeypatch.setattr(quantized, "_product", lambda g, b, block: blocks.append(block) or
                        product(g, b, block))
    with dequantized_matmuls(model):
        ours = _values_and_grads(model, x)
    assert 96 in blocks
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=2e-5 * float(mx.abs(b).max()),
                                   rtol=2e-5)


class Stack(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = [nn.QuantizedLinear.from_linear(nn.Linear(1024, 1024, bias=False), 64, 4)
                       for _ in range(depth)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


def _backward_peak_mb(model: Stack, compiled: bool) -> float:
    x = mx.random.normal((4, 1024))
    grad = mx.grad(lambda x: model(x).sum())
    grad = mx.compile(grad) if compiled else grad
    mx.eval(x, grad(x))
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    mx.eval(grad(x))
    return (mx.get_peak_memory() - base) / 2**20


@pytest.mark.parametrize("compiled", [False, True])
def test_a_backward_pass_holds_a_few_float_weights_whatever_the_depth(compiled: bool) -> None:
    """Each layer's float copy is 4 MB: 16 layers' would be 64 MB if the forward's were kept."""
    peaks = {}
    for depth in (4, 16):
        model = Stack(depth)
        mx.eval(model.parameters())
        with dequantized_matmuls(model):
            peaks[depth] = _backward_peak_mb(model, compiled)
    assert peaks[16] <= peaks[4] + 4.5, peaks  # at most one layer's copy more
    assert peaks[16] < 40, peaks


def test_a_large_head_holds_blocks_not_its_float_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4096 x 1024 head is 16 MB in float32: dequantized 1 MB at a time, its forward and
    backward stay under a few blocks."""
    head = Stack(0)
    head.layers = [nn.QuantizedLinear.from_linear(nn.Linear(1024, 4096, bias=False), 64, 4)]
    mx.eval(head.parameters())
    monkeypatch.setattr(quantized, "MAX_FLOAT_BYTES", 1 << 20)
    with dequantized_matmuls(head):
        peak = _backward_peak_mb(head, compiled=False)
    assert peak < 8, peak  # 32 MB at once
