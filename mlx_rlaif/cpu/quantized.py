"""4-bit (and 8-bit) layers on MLX's CPU build at the speed of the optimized BLAS.

MLX's CPU `quantized_matmul` is a kernel of its own, not a BLAS call: with OpenBLAS preloaded
(`blas.py`) a QLoRA run (`model.quantize: 4`) decoded and trained about 6x slower than the same
model in float32 here (tests/test_qlora.py's run: 214.6 s against 35.7 s, 65.9 s with this;
`tools/bench_qlora_cpu.py`, BENCHMARKS.md). `dequantized_matmuls(model)`
makes, for the duration of a `with` block, the model's affine-quantized linear layers
(`nn.QuantizedLinear`, and `nn.QuantizedEmbedding.as_linear`, a tied output head) compute
`x @ dequantize(W).T`: the dequantization is one pass over the packed weight, the product is
BLAS's. The backward pass dequantizes again instead of keeping the float weight from the forward
(made to depend on the cotangent, as kernels.py's `_after` does, or `mx.compile` would merge the
two), so a step holds a few layers' float weights at a time whatever the depth, not the model's; and a weight whose float copy would exceed
`MAX_FLOAT_BYTES` is dequantized a block of rows at a time (a large vocabulary's head: 0.5B's
tied head in float32 would be 545 MB at once, a spike the memory plan does not count). Values
equal `quantized_matmul`'s up to float rounding, gradients too (tests/test_cpu_quantized.py).

Covered: affine quantization (mlx-lm's `convert -q`, `model.quantize`), any bits and group size,
float32, bfloat16 and float16 activations. Not covered (MLX's kernel runs): other quantization
modes (mxfp4, nvfp4), quantized experts (`QuantizedSwitchLinear`: gather_qmm), the GPU (Metal's
and CUDA's kernels read the packed weight directly). Off with the rest of the gate:
MLX_RLAIF_CPU_KERNELS=0.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn

from . import active

MAX_FLOAT_BYTES = 64 << 20  # the float copy of a weight (or a block of its rows) made at once


@functools.cache
def _product(group_size: int, bits: int, block: int):  # noqa: ANN202 (an mx.custom_function)
    """x @ dequantize(w, scales, biases).T for one quantization's parameters, `block` output
    rows of the weight dequantized at a time; its backward dequantizes again, once the
    cotangent exists."""

    def weight(w: mx.array, scales: mx.array, biases: mx.array, i: int,
               after: mx.array) -> mx.array:
        """Rows i to i + block in float, dequantized once `after` is computed: MLX would
        otherwise dequantize every block before the first product and hold them all, or (under
        `mx.compile`) reuse the forward's in the backward."""
        rows = mx.depends([w[i:i + block], scales[i:i + block], biases[i:i + block]], [after])
        return mx.dequantize(*rows, group_size=group_size, bits=bits)

    @mx.custom_function
    def product(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
        parts = [x]
        for i in range(0, w.shape[0], block):
            parts.append(x @ weight(w, scales, biases, i, parts[-1]).T)
        return parts[1] if len(parts) == 2 else mx.concatenate(parts[1:], axis=-1)

    @product.vjp
    def _grad(primals: tuple, cotangent: mx.array, output: mx.array) -> tuple:
        x, w, scales, biases = primals
        dx = None
        for i in range(0, w.shape[0], block):
            part = cotangent[..., i:i + block] @ weight(
                w, scales, biases, i, cotangent if dx is None else dx)
            dx = part if dx is None else dx + part
        # the quantized weights are frozen: nothing asks for these, and lazily they cost nothing
        return dx.astype(x.dtype), mx.zeros_like(w), mx.zeros_like(scales), mx.zeros_like(biases)

    return product


def quantized_product(layer: nn.Module, x: mx.array) -> mx.array:
    """`layer`'s quantized weight times x, as `mx.quantized_matmul(..., transpose=True)`."""
    w, scales = layer["weight"], layer["scales"]
    row_bytes = w.shape[-1] * (32 // layer.bits) * scales.itemsize
    block = max(1, MAX_FLOAT_BYTES // row_bytes)
    return _product(layer.group_size, layer.bits, block)(x, w, scales, layer["biases"])


class _Linear(nn.QuantizedLinear):
    """An `nn.QuantizedLinear` whose product is `quantized_product` (its class, in the block)."""

    def __call__(self, x: mx.array) -> mx.array:
        y = quantized_product(self, x)
        return y + self["bias"] if "bias" in self else y


class _Embedding(nn.QuantizedEmbedding):
    """An `nn.QuantizedEmbedding` whose `as_linear` is `quantized_product` (lookups unchanged)."""

    def as_linear(self, x: mx.array) -> mx.array:
        return quantized_product(self, x)


SWAPS = ((nn.QuantizedLinear, _Linear), (nn.QuantizedEmbedding, _Embedding))


def eligible(layer: nn.Module) -> bool:
    """Affine quantization of a 2-D weight (not experts' 3-D ones)."""
    return (getattr(layer, "mode", "affine") == "affine" and "biases" in layer
            and layer["weight"].ndim == 2)


@contextlib.contextmanager
def dequantized_matmuls(model: nn.Module) -> Iterator[None]:
    """Within the block, `model`'s eligible quantized layers multiply through BLAS (CPU only)."""
    swapped = []
    if active():
        for _, m in model.named_modules():
            new = next((ours for theirs, ours in SWAPS if type(m) is theirs), None)
            if new is not None and eligible(m):
                swapped.append((m, type(m)))
                m.__class__ = new
    try:
        yield
    finally:
        for m, cls in swapped:
            m.__class__ = cls
