"""The first run on a fresh machine compiles MLX's kernels: said once, with where they are kept.

MLX's CPU build compiles each fused (`mx.compile`d) kernel to C++ with the system compiler the
first time it meets it and keeps the library in `<temp dir>/mlx/<version>/cpu`; its CUDA build
compiles with NVRTC and keeps the result in `$MLX_PTX_CACHE_DIR`, else
`<temp dir>/mlx/<version>/ptx`. A run that finds that folder empty spends its first steps
compiling (BENCHMARKS.md has the cold and warm times of the quickstart), and `first_run_line`
says so before the first step, so a slow first step is not taken for a hang. Metal's kernels
ship compiled: nothing to say there.

Not covered: how many kernels are left to compile (a warm cache may still miss a new shape).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def cache_dir(kind: str, version: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Where MLX keeps compiled kernels for a device kind (cpu, cuda, metal); None: nowhere."""
    env = os.environ if env is None else env
    base = Path(tempfile.gettempdir()) / "mlx" / version
    if kind == "cpu":
        return base / "cpu"
    if kind == "cuda":
        return Path(env["MLX_PTX_CACHE_DIR"]) if env.get("MLX_PTX_CACHE_DIR") else base / "ptx"
    return None


def is_cold(path: Path | None) -> bool:
    """No compiled kernel kept yet."""
    return path is not None and not (path.is_dir() and any(path.iterdir()))


def first_run_line(kind: str, version: str, env: Mapping[str, str] | None = None) -> str | None:
    """One line for a run whose kernel cache is empty, None otherwise."""
    path = cache_dir(kind, version, env)
    if not is_cold(path):
        return None
    how = "CPU kernels with the system C++ compiler" if kind == "cpu" else "CUDA kernels (NVRTC)"
    where = "" if kind == "cpu" else "; set MLX_PTX_CACHE_DIR to keep them elsewhere"
    return (f"first run of MLX {version} here: the first steps compile its {how} once, kept in "
            f"{path} (later runs start warm{where})")
