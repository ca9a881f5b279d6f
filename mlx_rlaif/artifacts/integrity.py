"""Whether a checkpoint directory is whole: its manifest, and the checks that find a damaged one.

A checkpoint's last file, `manifest.json`, lists every file written before it with its size.
`problem(ckpt)` names what is wrong, or returns None: a file of the manifest missing or of
another size, a JSON file that does not parse, a safetensors file whose header and size disagree
(truncated), and for a checkpoint from before manifests, a missing adapters, adapter config or
state file. All of it reads headers and sizes only, never the tensors.

Not covered: a bit flipped inside a tensor (no checksums), files added after the rename (the
fused `mlx_model/` of `training.save_mlx_model_bits`).
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = "manifest.json"
REQUIRED = ("adapters.safetensors", "adapter_config.json", "state.json")


def write_manifest(folder: Path) -> None:
    """List every file under `folder` (relative path -> size) in its manifest."""
    files = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")


def problem(ckpt: Path) -> str | None:
    """What makes the checkpoint `ckpt` unusable, in a few words; None when it is whole."""
    ckpt = Path(ckpt)
    try:
        expected = _manifest(ckpt)
    except ValueError as e:
        return str(e)
    for name in expected or REQUIRED:
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if expected and size != expected[name]:
            return f"{name} has {size} bytes, the manifest says {expected[name]}"
        why = _content_problem(path)
        if why:
            return f"{name} {why}"
    return None


def _manifest(ckpt: Path) -> dict[str, int] | None:
    path = ckpt / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        return {str(k): int(v) for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{MANIFEST} is not valid") from None


def _content_problem(path: Path) -> str | None:
    if path.suffix == ".json":
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            return "is not valid JSON"
    elif path.suffix == ".safetensors":
        return safetensors_problem(path)
    return None


def safetensors_problem(path: Path) -> str | None:
    """None when the header parses and the file is as long as its tensors say, else why not."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            return f"is truncated ({size} bytes, no complete header)"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items()
                       if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "has an unreadable header"
    if 8 + n + end != size:
        return f"is truncated ({size} bytes, its header says {8 + n + end})"
    return None
