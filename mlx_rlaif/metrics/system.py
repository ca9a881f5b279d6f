"""Process and machine readings for the metrics: RSS, MLX peak memory, CPU and memory use.

Covered: `snapshot()` returns plain floats under `memory/` and `system/` (about 60 us, cheap enough
for every step). MLX's peak memory is read only when `mlx.core` is already imported, so reading
metrics files never imports MLX. Not covered: GPU utilisation (no portable reading exists for
Metal; on Apple silicon MLX's peak memory is the GPU memory) and macOS's physical footprint.
"""

from __future__ import annotations

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
    return out
