"""Mixture-of-experts layers held in float32 on MLX's CPU build, where GatherMM (the experts'
product) only runs in float32 (mlx 0.32: `[GatherMM::eval] Currently only supports float32`).

`float32_experts(model)` replaces every unquantized `SwitchLinear` (mlx-lm's stacked experts)
whose weights are in bfloat16 or float16 by `Float32SwitchLinear`: the same layer with its
weights in float32, which computes the product in float32 and hands its output back in the
input's dtype, so the rest of the model keeps its dtype. LoRA wraps it like any SwitchLinear
(it is one). The experts' memory doubles (float32 instead of 16 bits); the memory plan counts
it, as it reads the weights as loaded (`backends/mlx/memory.shape_of`). Quantized experts
(`QuantizedSwitchLinear`, `model.quantize: 4`) run GatherQMM, which the CPU build supports in
16-bit, and are left alone.

Unlike the rest of this folder this is not a speed path: it is what makes a 16-bit MoE model
run at all on the CPU, so it follows `on_cpu()` (where MLX computes), not the kernels' opt-out
(`active()`); on Metal and CUDA nothing changes.

Not covered: GatherMM in other layers than mlx-lm's `SwitchLinear` (a model of its own
elsewhere fails at load with the one-line message of backends/mlx/probe.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models.switch_layers import SwitchLinear


class Float32SwitchLinear(SwitchLinear):
    """A SwitchLinear with float32 weights: the product in float32, the output in x's dtype."""

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False
                 ) -> mx.array:
        y = super().__call__(x.astype(mx.float32), indices, sorted_indices=sorted_indices)
        return y.astype(x.dtype)


def as_float32(layer: SwitchLinear) -> Float32SwitchLinear:
    """`layer` as a Float32SwitchLinear (its weights cast; the constructor's random weights are
    never evaluated: MLX is lazy)."""
    experts, out_dims, in_dims = layer.weight.shape
    new = Float32SwitchLinear(in_dims, out_dims, experts, bias="bias" in layer)
    new.weight = layer.weight.astype(mx.float32)
    if "bias" in layer:
        new.bias = layer.bias.astype(mx.float32)
    return new


def needs_float32(m: nn.Module) -> bool:
    return (type(m) is SwitchLinear and m.weight.dtype != mx.float32
            and mx.issubdtype(m.weight.dtype, mx.floating))


def float32_experts(model: nn.Module) -> int:
    """Every 16-bit SwitchLinear of `model` replaced by its float32 twin; returns how many."""
    found = [(name, as_float32(m)) for name, m in model.named_modules() if needs_float32(m)]
    if found:
        model.update_modules(tree_unflatten(found))
    return len(found)
