"""Reading records from local files in the layouts Hugging Face `datasets` exports: JSON Lines
(`Dataset.to_json`), Parquet (`Dataset.to_parquet`) and a `Dataset.save_to_disk` directory.

`read_records(path)` yields `(where, record)` pairs, where = `file:line` or `file#row`. JSONL
needs nothing beyond the standard library; Parquet needs `pyarrow` and a `save_to_disk`
directory needs `datasets`, both imported only when such a file is read (a missing one is a
one-line error naming `pip install ...`).

Not covered: downloading (use `datasets` on a machine with network, see docs/data.md, "Training
on MBPP"), files larger than memory, a `DatasetDict` directory (pass one of its split folders).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError


def read_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Every record of a JSONL file, a Parquet file or a `save_to_disk` directory."""
    p = Path(path)
    if p.is_dir():
        return _dataset_dir(p)
    if not p.is_file():
        raise DataError(f"{p} not found: pass a JSONL or Parquet file or a datasets.save_to_disk "
                        "directory")
    if p.suffix == ".parquet":
        return _parquet(p)
    return list(jsonl_records(p))


def is_dataset_dir(path: str | Path) -> bool:
    """Whether `path` looks like a `Dataset.save_to_disk` (or `DatasetDict`) directory."""
    p = Path(path)
    return p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "state.json").is_file()
                           or (p / "dataset_dict.json").is_file())


def jsonl_records(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for each non-blank line of a JSONL file; where = 'file:line'. Bad UTF-8,
    bad JSON and a line that is not an object are one DataError naming the line; a byte-order
    mark (editors on Windows) is allowed at the start."""
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{p}:{n}"
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not valid UTF-8 (byte {raw[e.start]:#04x} at column "
                                f"{e.start + 1}): save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg}): one JSON object per line"
                                ) from None
            if not isinstance(rec, dict):
                raise DataError(f"{where}: expected a JSON object per line")
            yield where, rec


def _parquet(p: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {p} needs pyarrow: pip install pyarrow (or export the set "
                        "with Dataset.to_json)") from None
    rows = pq.read_table(p).to_pylist()
    return [(f"{p}#{i + 1}", r) for i, r in enumerate(rows)]


def _dataset_dir(p: Path) -> list[tuple[str, dict[str, Any]]]:
    if (p / "dataset_dict.json").is_file():
        splits = sorted(q.name for q in p.iterdir() if q.is_dir())
        raise DataError(f"{p} holds several splits ({', '.join(splits)}): pass one of them, "
                        f"e.g. {p / (splits[0] if splits else 'test')}")
    if not is_dataset_dir(p):
        raise DataError(f"{p} is a directory but not a datasets.save_to_disk folder (no "
                        "dataset_info.json): pass a JSONL or Parquet file or such a folder")
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading the datasets folder {p} needs the datasets package: pip "
                        "install datasets (or export the set with Dataset.to_json)") from None
    ds = datasets.load_from_disk(str(p))
    return [(f"{p}#{i + 1}", dict(r)) for i, r in enumerate(ds)]
