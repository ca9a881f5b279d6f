"""Everything that exists only for MLX's Linux CPU build, behind one gate.

On Apple silicon MLX computes on Metal and none of this runs. On MLX's CPU build two things make
RL steps several times faster (BENCHMARKS.md): an optimized BLAS preloaded into the process
(`blas.py`: the preload, and OpenBLAS's thread count per phase), element-wise kernels written
for the CPU (`kernels.py`: attention softmax, SwiGLU, decoding RoPE, the sampler's and the loss's
exponentials), and quantized layers multiplying through that BLAS (`quantized.py`: a 4-bit run
3.3x faster). The backends ask `active()` before using any of them; every call site goes through
it, so a user on a GPU, or one who sets MLX_RLAIF_CPU_KERNELS=0, runs mlx-lm's own code.

The preload itself (`blas.maybe_reexec_with_fast_blas`) happens before MLX is imported and has its
own opt-out, MLX_RLAIF_FAST_BLAS=0: it swaps a library, not an algorithm.

Not covered: the design. Nothing outside this folder may depend on a CPU path being taken.
"""

from __future__ import annotations

import os

OPT_OUT = "MLX_RLAIF_CPU_KERNELS"


def on_cpu() -> bool:
    """Whether MLX computes on the CPU (its default device). MLX is imported here, not above:
    the CLI imports `blas` before it re-executes itself."""
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def active() -> bool:
    """The gate of every CPU-only path: MLX computes on the CPU and MLX_RLAIF_CPU_KERNELS is not
    0."""
    return os.environ.get(OPT_OUT) != "0" and on_cpu()
