"""Fast BLAS for MLX's Linux CPU build.

The `mlx[cpu]` Linux wheel bundles the reference BLAS (netlib, unblocked: about 2-5 GFLOP/s for a
large fp32 matmul). MLX resolves `cblas_sgemm` & co. dynamically, so preloading an optimized BLAS
with the same ABI (Debian's `libopenblas0-pthread`) makes the same matmul 40-50x faster.
`LD_PRELOAD` only acts when a process starts, so the CLI re-executes itself once with it set.

Covered: Linux, an OpenBLAS found at a known path or in $MLX_RLAIF_BLAS. Not covered: macOS
(MLX uses Metal and Accelerate there: nothing to do), other BLAS vendors. Opt out with
MLX_RLAIF_FAST_BLAS=0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
_GUARD = "MLX_RLAIF_BLAS_REEXEC"


def find_fast_blas() -> str | None:
    """Path of an optimized BLAS to preload, or None."""
    env = os.environ.get("MLX_RLAIF_BLAS")
    if env:
        return env if Path(env).is_file() else None
    return next((c for c in CANDIDATES if Path(c).is_file()), None)


def fast_blas_active() -> bool:
    preload = os.environ.get("LD_PRELOAD", "")
    return "openblas" in preload.lower() or "mkl" in preload.lower()


def maybe_reexec_with_fast_blas(argv: list[str] | None = None) -> None:
    """On Linux, re-exec the current command once with an optimized BLAS preloaded.

    `argv` is the full command line to run again (default: `python -m mlx_rlaif.cli ARGS`)."""
    if not sys.platform.startswith("linux") or os.environ.get("MLX_RLAIF_FAST_BLAS") == "0":
        return
    if fast_blas_active() or os.environ.get(_GUARD):
        return
    lib = find_fast_blas()
    if lib is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    env[_GUARD] = "1"
    # OpenBLAS's own threads would fight MLX's; one pool is enough on a laptop-sized CPU.
    env.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
    sys.stdout.flush()
    sys.stderr.flush()
    argv = argv or [sys.executable, "-m", "mlx_rlaif.cli", *sys.argv[1:]]
    os.execve(sys.executable, argv, env)
