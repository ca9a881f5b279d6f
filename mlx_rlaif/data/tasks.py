"""Tasks: JSONL files or shipped suites, and a deterministic, resumable order.

A task line is a JSON object with `prompt` (required), `language` (default python), and optional
`id`, `entry_point`, `test`, `tests`, `difficulty`, `preamble`; other fields are kept in
`Task.meta`. The seed trainer's `{"prompt", "language"}` lines load unchanged. A malformed line is
reported as file:line. `suite:NAME` names a suite shipped with the package (see
mlx_rlaif/data/suites); a Parquet file or a `datasets.save_to_disk` folder of such records loads
too (sources.py).

Order: epoch e visits the tasks in `permutation(seed, e)`; a cursor counts the tasks consumed in
the current epoch, so a checkpoint's (epoch, cursor) continues the exact sequence.

Not covered: streaming files larger than memory, weighting or curriculum between tasks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..records import Task
from .sources import jsonl_records, read_records

LANGUAGES = ("python", "cpp", "rust")
_LANG_ALIASES = {"py": "python", "python3": "python", "c++": "cpp", "cxx": "cpp", "rs": "rust"}
_FIELDS = ("id", "prompt", "language", "entry_point", "test", "tests", "difficulty", "preamble")


def read_jsonl(path: str | Path) -> list[tuple[str, dict]]:
    """(where, record) for each non-blank line; where = 'file:line'."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"task file {p} not found: pass an existing JSONL file or suite:NAME")
    return list(jsonl_records(p))


def task_from_record(rec: dict[str, Any], where: str) -> Task:
    prompt = rec.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: missing or empty 'prompt' (a string)")
    lang = str(rec.get("language", "python")).lower()
    lang = _LANG_ALIASES.get(lang, lang)
    if lang not in LANGUAGES:
        raise DataError(f"{where}: language {lang!r} is not one of {', '.join(LANGUAGES)}")
    tests = rec.get("tests") or ()
    if not isinstance(tests, (list, tuple)) or not all(isinstance(t, dict) for t in tests):
        raise DataError(f"{where}: 'tests' must be a list of objects")
    for key in ("entry_point", "test", "difficulty", "preamble"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            raise DataError(f"{where}: '{key}' must be a string")
    tid = rec.get("id", rec.get("task_id"))
    if tid is not None and (isinstance(tid, bool) or not isinstance(tid, (str, int))):
        raise DataError(f"{where}: 'id' must be a string or an integer")
    return Task(
        id=str(tid) if tid is not None else where.rsplit("/", 1)[-1],
        prompt=prompt, language=lang, entry_point=rec.get("entry_point"),
        test=rec.get("test"), tests=tuple(tests), difficulty=rec.get("difficulty"),
        preamble=rec.get("preamble") or "",
        meta={k: v for k, v in rec.items() if k not in _FIELDS and k != "task_id"},
    )


def load_tasks(spec: str, languages: Iterable[str] = (), max_tasks: int = 0,
               difficulties: Iterable[str] = ()) -> list[Task]:
    """Tasks from a JSONL path or `suite:NAME`, filtered by language and difficulty, at most
    `max_tasks`."""
    if spec.startswith("suite:"):
        from .suites import load_suite

        name = spec.split(":", 1)[1]
        records = [(f"{spec}#{i + 1}", r) for i, r in enumerate(load_suite(name))]
    elif Path(spec).is_dir() or spec.endswith(".parquet"):
        records = read_records(spec)
    else:
        records = read_jsonl(spec)
    tasks = [task_from_record(r, w) for w, r in records]
    langs = set(languages)
    if langs:
        tasks = [t for t in tasks if t.language in langs]
    levels = set(difficulties)
    if levels:
        tasks = [t for t in tasks if t.difficulty in levels]
    if max_tasks:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise DataError(f"{spec}: no tasks (after the language and difficulty filters): check "
                        "the file, data.languages and data.difficulties")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"{spec}: task id {dup!r} appears twice: ids key the groups, make them "
                        "unique")
    return tasks


@dataclass(frozen=True)
class TaskOrder:
    """Deterministic per-epoch order of `n` tasks."""

    n: int
    seed: int
    shuffle: bool = True

    def permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return np.random.default_rng([self.seed, epoch]).permutation(self.n).tolist()

    def batch(self, epoch: int, cursor: int, size: int) -> list[int]:
        """Task indices of the batch starting at `cursor` in `epoch` (shorter at the end)."""
        return self.permutation(epoch)[cursor: cursor + size]

    def batches_per_epoch(self, size: int) -> int:
        return -(-self.n // size)
