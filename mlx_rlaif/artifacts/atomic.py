"""Output files and directories that appear whole or not at all: written beside their place under
a temporary name, then renamed into it (`os.replace`, atomic on one filesystem).

A place that cannot hold the output (under a regular file, a name too long for the filesystem,
/proc) is refused in one line before any work (`check_out_dir` creates and removes the temporary
directory there); a temporary directory a killed export left (`.OUT.tmp-PID` of a process that
is gone) is removed by the next export to the same place.

Not covered: durability across a power cut (no fsync of the parent directory); a temporary
directory whose process id was reused by a live process (kept).
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
    """An output directory that does not exist yet or is empty, and a place where one can be
    made (its temporary directory is created there and removed); never overwritten."""
    p = Path(out)
    try:
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise UsageError(f"{flag} {p} already exists and is not empty: pass a new directory "
                             "or delete it first")
        p.parent.mkdir(parents=True, exist_ok=True)
        _temp_of(p).mkdir()
        _temp_of(p).rmdir()
    except OSError as e:
        raise unwritable(p, e, flag) from None
    return p


def unwritable(out: Path, e: OSError, flag: str = "--out") -> UsageError:
    """One line: the output place and why it cannot hold the output."""
    return UsageError(f"{flag} {out}: cannot write there ({e.strerror or e}"
                      f"{f': {e.filename}' if e.filename else ''}): pass a directory you can "
                      "create")


def _temp_of(out: Path) -> Path:
    return out.parent / f".{out.name}.tmp-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary directories exports to `out` left when killed (their process is
    gone); returns them."""
    gone = []
    prefix = f".{out.name}.tmp-"
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return gone
    for p in entries:
        pid = p.name[len(prefix):]
        if p.name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() \
                and not _alive(int(pid)) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Write into a temporary sibling of `out`; rename it into place only when all went well."""
    out = Path(out)
    tmp = _temp_of(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise unwritable(out, e) from None
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
