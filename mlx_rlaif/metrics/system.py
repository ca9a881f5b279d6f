"""Process and machine readings for the metrics: RSS, MLX peak memory, CPU and memory use.

Covered: `snapshot()` returns plain floats under `memory/` and `system/` (about 60 us, cheap enough
for every step). MLX's memory is read only when `mlx.core` is already imported, so reading
metrics files never imports MLX. On Apple silicon (Metal) also MLX's active and cache memory
(`mx.get_active_memory`, `mx.get_cache_memory`: the seed trainer's System/GPU_Memory_Used_GB and
Batch/Metal/MLX_Cache_GB) and, on macOS, the process's physical footprint (Activity Monitor's
"Memory" column, `proc_pid_rusage`); elsewhere those keys are left out. Not covered: GPU
utilisation (no portable reading exists for Metal).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

import psutil

GB = 1024**3
_PROCESS = psutil.Process()


def rss_gb() -> float:
    """Resident set size of this process, in GiB."""
    return _PROCESS.memory_info().rss / GB


def mlx_peak_gb() -> float | None:
    """MLX's peak allocated memory in GiB, or None when MLX is not loaded in this process."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return None
    return float(mx.get_peak_memory()) / GB


def on_metal() -> bool:
    """Whether this process computes with MLX on Metal (MLX loaded, its default device a GPU)."""
    mx = sys.modules.get("mlx.core")
    return mx is not None and mx.default_device() == mx.gpu and mx.metal.is_available()


def metal_memory() -> dict[str, float]:
    """MLX's active and cache memory in GiB, on Metal only (else empty)."""
    if not on_metal():
        return {}
    mx = sys.modules["mlx.core"]
    return {"memory/mlx_active_gb": mx.get_active_memory() / GB,
            "memory/mlx_cache_gb": mx.get_cache_memory() / GB}


_RUSAGE_INFO_V0 = 0
_PHYS_FOOTPRINT = 72  # offset in rusage_info_v0: uuid[16], then 7 uint64 before phys_footprint


def footprint_from(buffer: bytes) -> float:
    """The physical footprint in GiB from a `rusage_info_v0` buffer."""
    return struct.unpack_from("<Q", buffer, _PHYS_FOOTPRINT)[0] / GB


def footprint_gb() -> float | None:
    """macOS's physical footprint of this process in GiB (None elsewhere, or when the call
    fails)."""
    if sys.platform != "darwin":
        return None
    buf = ctypes.create_string_buffer(96)
    libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    if libc.proc_pid_rusage(os.getpid(), _RUSAGE_INFO_V0, buf) != 0:
        return None
    return footprint_from(buf.raw)


def snapshot() -> dict[str, float]:
    """Memory and CPU readings as namespaced plain floats.

    `system/cpu_percent` is the machine's CPU use since the previous call (psutil's non-blocking
    reading; the first call of a process reads 0).
    """
    vm = psutil.virtual_memory()
    out = {
        "memory/rss_gb": rss_gb(),
        "system/cpu_percent": float(psutil.cpu_percent(interval=None)),
        "system/memory_percent": float(vm.percent),
        "system/memory_used_gb": (vm.total - vm.available) / GB,
        "system/memory_available_gb": vm.available / GB,
    }
    peak = mlx_peak_gb()
    if peak is not None:
        out["memory/mlx_peak_gb"] = peak
    out.update(metal_memory())
    footprint = footprint_gb()
    if footprint is not None:
        out["memory/footprint_gb"] = footprint
    return out
