"""Output files and directories that appear whole or not at all: written beside their place under
a temporary name, then renamed into it (`os.replace`, atomic on one filesystem).

Not covered: durability across a power cut (no fsync of the parent directory).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import UsageError


def check_out_dir(out: str | Path, flag: str = "--out") -> Path:
    """An output directory that does not exist yet or is empty; never overwritten."""
    p = Path(out)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise UsageError(f"{flag} {p} already exists and is not empty: pass a new directory or "
                         "delete it first")
    return p


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Write into a temporary sibling of `out`; rename it into place only when all went well."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    os.replace(tmp, out)


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write `text` beside `path`, then rename it into place (the temporary file is removed
    when the write fails, e.g. on a full disk).

    Only a regular file (or a new one) is replaced: `--out /dev/null` or `/dev/stdout` (a
    device, a pipe) is written into as it is, never renamed over (as root, a rename in /dev
    replaced the machine's /dev/null with a regular file); a directory is refused."""
    path = Path(path)
    if path.exists() and not path.is_file():
        if path.is_dir():
            raise UsageError(f"{path} is a directory: pass a file path")
        with path.open("w", encoding="utf-8") as f:  # a device or a pipe: nothing to replace
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON next to `path`, then rename it into place: readers see the old or the new."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")
