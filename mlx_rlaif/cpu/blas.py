"""Fast BLAS for MLX's Linux CPU build.

The `mlx[cpu]` Linux wheel bundles the reference BLAS (netlib, unblocked: about 2-5 GFLOP/s for a
large fp32 matmul). MLX resolves `cblas_sgemm` & co. dynamically, so preloading an optimized BLAS
with the same ABI (Debian's `libopenblas0-pthread`) makes the same matmul 10-20x faster on 2 cores
(BENCHMARKS.md has the figures, and tests/test_blas.py checks the results agree). `LD_PRELOAD`
only acts when a process starts, so the CLI (and the test suite's conftest) re-executes itself
once with it set; `fast_blas_env()` gives the same environment to any other child process.

The thread count is set per phase: decoding (matrix products a few rows tall) runs fastest on
`default_threads()`; the reference pass and the update (hundreds of rows) use every core within
`blas_threads()` (BENCHMARKS.md has the A/B).

Covered: Linux, an OpenBLAS found at a known path or in $MLX_RLAIF_BLAS. Not covered: macOS
(MLX uses Metal and Accelerate there: nothing to do), other BLAS vendors. Opt out of the preload
with MLX_RLAIF_FAST_BLAS=0, of the per-phase thread counts with MLX_RLAIF_CPU_KERNELS=0 (the
gate of `cpu/`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

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
    """OpenBLAS threads outside `blas_threads()`: half the cores, at least 1. Decoding multiplies
    a few rows at a time, where a second thread only adds hand-off cost: on 2 cores 1 thread
    decoded as fast or faster, while the training phases' products (hundreds of rows) ran 1.8x
    faster on 2 (BENCHMARKS.md). Set OPENBLAS_NUM_THREADS to override."""
    return max(1, (cpus or os.cpu_count() or 2) // 2)


def train_threads() -> int:
    """OpenBLAS threads for the reference pass and the update: $MLX_RLAIF_TRAIN_THREADS, else
    every core (0 leaves the count as it is)."""
    v = os.environ.get("MLX_RLAIF_TRAIN_THREADS", "")
    return int(v) if v.isdigit() else (os.cpu_count() or 1)


@functools.cache
def openblas_thread_fns() -> tuple[Any, Any] | None:
    """OpenBLAS's thread count (get, set) functions, where this process has OpenBLAS loaded."""
    try:
        lib = ctypes.CDLL(None)
        return lib.openblas_get_num_threads, lib.openblas_set_num_threads
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def blas_threads(n: int | None = None) -> Iterator[None]:
    """Within the block, OpenBLAS uses `n` threads (default `train_threads()`); restored after.
    A no-op where the CPU gate is off (`cpu.active()`), without OpenBLAS (macOS, MLX's bundled
    BLAS) or for n = 0."""
    from . import active

    n = train_threads() if n is None else n
    fns = openblas_thread_fns() if n > 0 and active() else None
    if fns is None:
        yield
        return
    get, set_ = fns
    before = get()
    set_(n)
    try:
        yield
    finally:
        set_(before)


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
