"""A model's weight files read before the model is built: the safetensors headers (every
tensor inside its file at its declared size), config.json against them, and the bytes the
weights will take once loaded (quantized at load included) against a memory budget.

mlx-lm builds a model from config.json before it reads a weight, so a config of 10**9 layers
grows the process until it is killed, and a weight file that is a FIFO blocks its reader for
ever: `preflight` refuses both, and broken headers, in one line before mlx-lm is called (the
policy's `load_model` and the teacher's `load_teacher` call it for a model on this machine).

Not covered: weights not named as mlx-lm names them (`model.layers.N.`, `embed_tokens`) are
checked for their bytes only; weights with more layers than the config (extra prediction
layers) are left to mlx-lm's strict load; weight formats other than safetensors; hub ids not
yet on this machine (mlx-lm fetches them, then they are checked).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ...errors import UsageError
from .memory import gb

HEADER_MAX = 100 * 2**20  # bytes of a safetensors header (the safetensors library's own cap)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
LAYER = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.")  # a text model's blocks, as mlx-lm names them


def preflight(who: str, noun: str, local: Path, room: int | None, quantize: int = 0) -> int:
    """A model's weight bytes planned from its files in `local` before they are loaded
    (quantized to `quantize` bits at load: `planned_bytes`): UsageError in one line starting
    with `who` (the setting and path) and naming the `noun`'s fix where a weight file is not a
    regular file (a FIFO would block the reader), a safetensors header is broken, config.json
    disagrees with the weights (10**9 layers in config.json would grow the process until it is
    killed), or the load's peak is over `room` bytes (None: unchecked); returns the loaded
    bytes (0: no safetensors found, left to the loader)."""
    odd = odd_weight_file(str(local))
    if odd is not None:
        raise UsageError(f"{who}: its weight file {odd} is not a regular file (a directory, a "
                         f"pipe or a broken link): check the {noun}'s files")
    files = sorted(local.glob("model*.safetensors"))
    tensors: dict[str, tuple[str, tuple[int, ...], int]] = {}
    try:
        for f in files:
            tensors.update(safetensors_tensors(f))
    except (OSError, ValueError) as e:
        raise UsageError(f"{who}: its weight files are broken ({str(e).splitlines()[0]}): "
                         f"pick a {noun} saved whole") from e
    why = config_problem(read_config(local), tensors)
    if why is not None:
        raise UsageError(f"{who}: its config.json disagrees with its weight files ({why}): fix "
                         f"the {noun}'s config.json or pick another {noun}")
    size, peak = planned_bytes(tensors, quantize)
    if room is not None and peak > room:
        at = f" ({gb(peak)} GB while quantized to {quantize} bits at load)" \
            if quantize and peak != size else ""
        raise UsageError(f"{who}: its weights are {gb(size)} GB{at}, over the "
                         f"{gb(max(room, 0))} GB the memory budget leaves beside the student: "
                         f"pick a smaller or pre-quantized {noun} (mlx_lm.convert -q), or raise "
                         "training.max_memory_gb")
    return size


FLOATS = {"F32": 4, "F16": 2, "BF16": 2}
GROUP = 64  # mlx-lm's default group size (quantize_model with group_size None)


def planned_bytes(tensors: dict[str, tuple[str, tuple[int, ...], int]], quantize: int
                  ) -> tuple[int, int]:
    """(bytes once loaded, bytes at the load's peak) of safetensors `tensors` (name -> dtype,
    shape, bytes). Quantized to `quantize` bits at load, as `policy.load_model` does it: every
    float matrix `*weight` whose rows split into groups of GROUP (the layers mlx-lm quantizes:
    linear and embedding) becomes `quantize` bits a value plus a scale and a bias a group in
    its dtype, and one float tensor at a time is held beside the quantized ones (the largest
    is the peak's)."""
    if not quantize:
        size = sum(b for _, _, b in tensors.values())
        return size, size
    size, largest = 0, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        if dtype in FLOATS and name.endswith("weight") and len(shape) >= 2 \
                and shape[-1] % GROUP == 0:
            n = math.prod(shape)
            size += n * quantize // 8 + 2 * (n // GROUP) * FLOATS[dtype]
            largest = max(largest, nbytes)
        else:
            size += nbytes
    return size, size + largest


def safetensors_tensors(file: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """name -> (dtype, shape, bytes) from a safetensors file's header; ValueError where it is
    no header or a tensor does not lie inside the file at its declared size."""
    size = file.stat().st_size
    with file.open("rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < n <= min(HEADER_MAX, size - 8):
            raise ValueError(f"{file.name} has no safetensors header")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError(f"{file.name} has no safetensors header")
    data, out = size - 8 - n, {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(v["dtype"]), tuple(int(d) for d in v["shape"])
            start, end = (int(x) for x in v["data_offsets"])
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{file.name}: tensor {name[:60]!r} has no valid entry") from e
        want = math.prod(shape) * DTYPE_BYTES.get(dtype, 1)
        if not 0 <= start <= end <= data or (dtype in DTYPE_BYTES and end - start != want):
            raise ValueError(f"{file.name}: tensor {name[:60]!r} of shape {list(shape)[:4]} "
                             "does not lie inside the file")
        out[name] = (dtype, shape, end - start)
    return out


def config_problem(config: dict[str, Any], tensors: dict[str, tuple[str, tuple[int, ...], int]]
                   ) -> str | None:
    """Where config.json's shapes disagree with the weight files' tensors (None: they agree
    where both say)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers, hidden, vocab = (text.get(k) for k in ("num_hidden_layers", "hidden_size",
                                                   "vocab_size"))
    found = {int(m.group(1)) for k in tensors if (m := LAYER.search(k))}
    if found and not (isinstance(layers, int) and 0 < layers <= len(found)):  # more: MTP
        return f"num_hidden_layers {layers!r} in config.json, {len(found)} layers in its weights"
    embed = next(((d, s) for k, (d, s, _) in tensors.items()
                  if k.endswith("embed_tokens.weight")), None)
    if embed is not None and len(embed[1]) == 2:
        if vocab != embed[1][0]:
            return f"vocab_size {vocab!r} in config.json, {embed[1][0]} embedding rows"
        if embed[0] != "U32" and hidden != embed[1][1]:  # U32: quantized, packed columns
            return f"hidden_size {hidden!r} in config.json, embeddings {embed[1][1]} wide"
    elems = sum(math.prod(s) * (8 if d == "U32" else 1) for d, s, _ in tensors.values())
    if isinstance(layers, int) and isinstance(hidden, int) and layers * hidden > elems:
        return (f"num_hidden_layers {layers} x hidden_size {hidden} is more parameters than "
                f"the {elems} its weights hold")
    return None


def read_config(local: Path) -> dict[str, Any]:
    try:
        config = json.loads((local / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def odd_weight_file(source: str) -> str | None:
    """The first of a local model's weight files as mlx-lm finds them (`model*.safetensors`)
    that is not a regular file (a symlink to one is); None where all are or `source` is a hub
    id."""
    local = Path(source)
    if not local.is_dir():
        return None
    return next((f.name for f in sorted(local.glob("model*.safetensors")) if not f.is_file()),
                None)
