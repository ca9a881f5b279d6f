"""JSON Lines files: the run's source of truth (`batches.jsonl`, `epochs.jsonl`, `samples.jsonl`,
`health.jsonl`, `eval.jsonl`), written one flushed line per record and read back tolerantly.

Covered: strict JSON out (NaN and infinities become null, so any JSON reader accepts the file),
append on resume, reading that skips a torn last line left by a crash, its repair when a resumed
run appends (`repair_tail`: the torn part is cut off, so the next record starts on a line of its
own), de-duplication of steps a resumed run did again (the later record wins) and trimming a
file back to a resumed step. Lines are split on "\n" alone: U+2028, U+2029 and U+0085 (which
`str.splitlines` also splits on, and JSON leaves raw) are written escaped (`\u2028`) and, raw in a
file another tool wrote, stay inside their record.
Not covered: rotation or compression.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError
from ..faults import fault


def clean(value: Any) -> Any:
    """`value` with non-finite floats replaced by None, recursively (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


# characters JSON leaves raw that line readers (str.splitlines, some editors) take as line ends
_SEPARATORS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def dumps(record: Mapping[str, Any]) -> str:
    """One JSON line (no newline), strict, keys in insertion order; U+0085, U+2028 and U+2029
    escaped, so no reader splits the line."""
    text = json.dumps(clean(record), ensure_ascii=False, allow_nan=False, default=str)
    return text.translate(_SEPARATORS)


def lines_of(text: str) -> list[str]:
    """`text`'s lines, split on "\\n" alone (not on U+2028 and the others str.splitlines takes);
    a "\\r" before it is dropped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


class JsonlWriter:
    """Appends records to one JSONL file; each line is flushed as it is written. The file is
    created at the first record (so its existence means something was logged); without
    `append` an older file of that name is removed at once."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._closed = False
        if not append:
            path.unlink(missing_ok=True)
        else:
            repair_tail(path)

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        text = "".join(dumps(r) + "\n" for r in records)
        if not text or self._closed:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        f = self._file
        fault("jsonl", lambda: (f.write(text[: len(text) // 2]), f.flush()))
        f.write(text)

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


def repair_tail(path: Path) -> int:
    """Cut a torn last line (text after the last newline: a crash mid-write) off the file;
    returns the number of bytes cut."""
    try:
        f = open(path, "rb+")  # noqa: SIM115
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        keep = size
        while keep > 0:
            start = max(0, keep - (1 << 16))
            f.seek(start)
            chunk = f.read(keep - start)
            if start + len(chunk) == size and chunk.endswith(b"\n"):
                return 0
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            keep = start
        f.truncate(keep)
    return size - keep


def complete_lines(data: bytes) -> bytes:
    """`data` up to its last newline: a JSONL file without a torn last line."""
    return data[: data.rfind(b"\n") + 1]


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a whole file so that readers see the old or the new content, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict]:
    """All records of a JSONL file. A torn last line (a crash mid-write) is skipped; a broken line
    elsewhere is an error naming file:line."""
    if not path.is_file():
        return []
    lines = lines_of(path.read_text(encoding="utf-8"))
    out: list[dict] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise UsageError(
                f"{path}:{i}: not valid JSON ({e.msg}): fix or delete that line"
            ) from None
        if isinstance(record, dict):
            out.append(record)
    return out


def trim_after(path: Path, key: str, last: int) -> int:
    """Rewrite `path` (atomically) without the records whose `key` is above `last`, e.g. the
    evaluations of steps a resumed run does again; returns how many were dropped."""
    records = read_jsonl(path)
    keep = [r for r in records if not (isinstance(r.get(key), int) and r[key] > last)]
    if len(keep) < len(records):
        atomic_write(path, "".join(dumps(r) + "\n" for r in keep))
    return len(records) - len(keep)


def last_per_key(records: Iterable[dict], key: str) -> list[dict]:
    """Keep the last record for each value of `key` (a resumed run repeats steps), in key order;
    records without the key are kept in place."""
    keyed: dict[Any, dict] = {}
    loose: list[dict] = []
    for r in records:
        if r.get(key) is None:
            loose.append(r)
        else:
            keyed[r[key]] = r
    return sorted(keyed.values(), key=lambda r: r[key]) + loose
