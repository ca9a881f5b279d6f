"""The CPU build's SwiGLU (cpu.kernels.swiglu) in bfloat16, the dtype real checkpoints ship in:
mlx-lm's numbers within bfloat16's rounding, its output and gradients in the inputs' dtype (a
float32 result broke the update of a bfloat16 model: "Type of cotangents does not match
primal output type", found by tests/test_combinations.py)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_rlaif.cpu import kernels


def test_swiglu_in_bfloat16_matches_mlx_lm_and_keeps_the_dtype():
    gate = (mx.random.normal((4, 257), key=mx.random.key(0)) * 4).astype(mx.bfloat16)
    x = mx.random.normal((4, 257), key=mx.random.key(1)).astype(mx.bfloat16)
    ours, ref = kernels.swiglu(gate, x), nn.silu(gate) * x
    assert ours.dtype == mx.bfloat16
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)),
                               np.array(ref.astype(mx.float32)), rtol=2e-2, atol=2e-2)

    def loss(g, v, fn):
        return fn(g, v).astype(mx.float32).sum()

    grads = mx.grad(loss, argnums=(0, 1))(gate, x, kernels.swiglu)
    want = mx.grad(loss, argnums=(0, 1))(gate, x, lambda g, v: nn.silu(g) * v)
    for a, b in zip(grads, want, strict=True):
        assert a.dtype == mx.bfloat16
        np.testing.assert_allclose(np.array(a.astype(mx.float32)),
                                   np.array(b.astype(mx.float32)), rtol=3e-2, atol=3e-2)
