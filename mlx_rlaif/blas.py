"""Fast BLAS for MLX's Linux CPU build.

The `mlx[cpu]` Linux wheel bundles the reference BLAS (netlib, unblocked: about 2-5 GFLOP/s for a
large fp32 matmul). MLX resolves `cblas_sgemm` & co. dynamically, so preloading an optimized BLAS
with the same ABI (Debian's `libopenblas0-pthread`) makes the same matmul 10-20x faster on 2 cores
(BENCHMARKS.md has the figures, and tests/test_blas.py checks the results agree). `LD_PRELOAD`
only acts when a process starts, so the CLI (and the test suite's conftest) re-executes itself
once with it set; `fast_blas_env()` gives the same environment to any other child process.

Covered: Linux, an OpenBLAS found at a known path or in $MLX_RLAIF_BLAS. Not covered: macOS
(MLX uses Metal and Accelerate there: nothing to do), other BLAS vendors. Opt out with
MLX_RLAIF_FAST_BLAS=0.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
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


def fast_blas_active(env: Mapping[str, str] | None = None) -> bool:
    preload = (os.environ if env is None else env).get("LD_PRELOAD", "").lower()
    return "openblas" in preload or "mkl" in preload


def fast_blas_env(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """A copy of `env` (default: os.environ) with the optimized BLAS preloaded, or None where
    there is nothing to do (not Linux, opted out, no OpenBLAS found)."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux") or env.get("MLX_RLAIF_FAST_BLAS") == "0":
        return None
    if fast_blas_active(env):
        return env
    lib = find_fast_blas()
    if lib is None:
        return None
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    env.setdefault("OPENBLAS_NUM_THREADS", str(default_threads()))
    return env


def without_fast_blas(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: os.environ) with any BLAS preload and thread setting removed:
    MLX's bundled BLAS, for comparisons."""
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = ":".join(p for p in env.get("LD_PRELOAD", "").split(":")
                                 if p and "blas" not in p.lower())
    env.pop("OPENBLAS_NUM_THREADS", None)
    return env


def default_threads(cpus: int | None = None) -> int:
    """OpenBLAS threads: half the cores, at least 1. Python drives the decode loop and MLX's
    stream thread calls BLAS, so a pool as wide as the machine oversubscribes it: on 2 shared
    cores 1 thread was as fast or faster than 2 for every matmul, forward/backward and RL step
    measured (BENCHMARKS.md). Wider machines are untested: set OPENBLAS_NUM_THREADS to override."""
    return max(1, (cpus or os.cpu_count() or 2) // 2)


def maybe_reexec_with_fast_blas(argv: list[str] | None = None) -> None:
    """On Linux, re-exec the current command once with an optimized BLAS preloaded.

    `argv` is the full command line to run again (default: `python -m mlx_rlaif.cli ARGS`)."""
    if fast_blas_active() or os.environ.get(_GUARD):
        return
    env = fast_blas_env()
    if env is None:
        return
    env[_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    argv = argv or [sys.executable, "-m", "mlx_rlaif.cli", *sys.argv[1:]]
    os.execve(sys.executable, argv, env)
