"""The device MLX computes on, as MLX reports it: Metal (Apple silicon), CUDA (MLX's CUDA build
on an NVIDIA GPU) or the CPU, its name, and its own memory where it has one.

`current()` reads `mx.device_info()` once (its keys differ by backend: Metal gives
`max_recommended_working_set_size` and `memory_size`; CUDA gives `total_memory`, `free_memory`
and the compute capability; the CPU build only the processor's name) and `describe` turns it
into the words `mlx-rlaif doctor` prints. `memory.device_budget` takes the budget from it: on a
GPU with its own memory, that memory bounds a run, not the host's RAM. `quantized_problem`
names the MLX builds whose quantized kernels are known to fault on a device.

Not covered: several GPUs (MLX uses the first), MIG slices (reported as the whole card).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

GB = 2**30


@dataclass(frozen=True)
class Device:
    """kind: metal, cuda or cpu; `memory` the device's own memory in bytes (CUDA: its total;
    Metal: MLX's recommended working set of the unified memory; None on the CPU), `free` what
    CUDA reports free now (None elsewhere)."""

    kind: str
    name: str
    memory: int | None = None
    free: int | None = None
    capability: str = ""


def kind_of(default: Any = None) -> str:
    """metal, cuda or cpu: the backend of MLX's default device."""
    default = mx.default_device() if default is None else default
    if default.type == mx.cpu:
        return "cpu"
    return "metal" if mx.metal.is_available() else "cuda"


def current(info: dict[str, Any] | None = None, kind: str | None = None, own: int | None = None
            ) -> Device:
    """The default device from `mx.device_info()` (`info`, `kind` given in tests). CUDA's free
    memory counts what this process's MLX already holds (`own`: its active and cached bytes,
    e.g. the loaded model) as free to it, so a budget taken after loading is not short by the
    weights the plan counts anyway."""
    if info is None:
        info = mx.device_info()
        own = mx.get_active_memory() + mx.get_cache_memory() if own is None else own
    kind = kind_of() if kind is None else kind
    name = str(info.get("device_name") or info.get("architecture") or "?")
    if kind == "cuda":
        cc = (f"{info['compute_capability_major']}.{info['compute_capability_minor']}"
              if "compute_capability_major" in info else "")
        total = info.get("total_memory") or info.get("memory_size")
        free = int(info["free_memory"]) + (own or 0) if "free_memory" in info else None
        return Device("cuda", name, int(total) if total else None,
                      min(free, int(total)) if free is not None and total else free, cc)
    if kind == "metal":
        ws = info.get("max_recommended_working_set_size")
        return Device("metal", name, int(ws) if ws else None)
    return Device("cpu", name)


def describe(d: Device) -> str:
    """One line for doctor: e.g. `CUDA: NVIDIA H200 (compute capability 9.0), 139.8 GB (139.2
    GB free)`, `Metal: Apple M2 Max, recommended working set 21.3 GB`, `CPU: AMD EPYC`."""
    if d.kind == "cuda":
        cc = f" (compute capability {d.capability})" if d.capability else ""
        mem = f", {d.memory / GB:.1f} GB" if d.memory else ""
        free = f" ({d.free / GB:.1f} GB free)" if d.free is not None else ""
        return f"CUDA: {d.name}{cc}{mem}{free}"
    if d.kind == "metal":
        ws = f", recommended working set {d.memory / GB:.1f} GB" if d.memory else ""
        return f"Metal: {d.name}{ws}"
    return f"CPU: {d.name}"


def budget_base(d: Device) -> tuple[int, str] | None:
    """(bytes, what they are) of the device memory a run's budget is a share of: CUDA's free
    memory (its total where free is unknown), Metal's recommended working set; None on the CPU
    (the host's available RAM then)."""
    if d.kind == "cuda" and (d.free or d.memory):
        return (d.free, f"the free memory of {d.name}") if d.free else \
            (d.memory, f"the memory of {d.name}")
    if d.kind == "metal" and d.memory:
        return d.memory, "MLX's recommended working set"
    return None


# MLX's CUDA quantized matmul (qmm_naive) read scales and biases past the end of a partly filled
# tile (ml-explore/mlx#3487: an illegal memory access for a quantized model, e.g. at the 0.5B
# shape's 151,936-row head); fixed by ml-explore/mlx#3509, first released in mlx 0.32.0.
QMM_FIXED = (0, 32, 0)


def quantized_problem(kind: str, version: str) -> str | None:
    """Why a quantized model cannot run on this backend and MLX version (None: it can)."""
    try:
        have = tuple(int(x) for x in version.split(".")[:3])
    except ValueError:  # a development build: assume the fix is in
        return None
    if kind != "cuda" or have >= QMM_FIXED:
        return None
    need = ".".join(map(str, QMM_FIXED))
    return (f"quantized models on MLX's CUDA build need mlx >= {need} (mlx {version} faults in "
            f"its quantized matmul: ml-explore/mlx#3487, fixed by #3509); run pip install -U "
            f"'mlx[cuda13]' (or cuda12), or set model.quantize: 0 with an unquantized model")
