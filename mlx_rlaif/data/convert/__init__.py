"""Public code sets, in the record layout of their Hugging Face datasets, into our task format
(docs/task-formats.md), keeping each set's tests in the format that runs them, its difficulty
tags and its ids.

`convert(name, records, options)` maps every `(where, record)` (from `data.sources`) with the
set's converter (one small pure function per set, in mbpp.py, apps.py, codecontests.py,
livecodebench.py) and returns the tasks and the records it could not convert, each with its id
and the reason: a record is never dropped silently. A task's id is `<prefix>/<the set's own
id>` (`Options.id_prefix`, default the set's name; HumanEval keeps `HumanEval/N`).

Not covered: downloading (see docs/data.md, "Training on MBPP"), deduplication across sets (that is
`data overlap`), checking that the reference solutions pass (`mlx-rlaif data convert --check`
does, with the exec reward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...errors import DataError
from ..tasks import task_from_record
from .apps import apps, taco
from .codecontests import codecontests
from .common import LANGUAGES, Options, Skip
from .livecodebench import livecodebench
from .mbpp import humaneval, mbpp, mbpp_plus

Converter = Callable[[dict, Options], dict]

# set name -> (converter, the record field holding its own id; None: the row number)
SETS: dict[str, tuple[Converter, str | None]] = {
    "mbpp": (mbpp, "task_id"),
    "mbpp-plus": (mbpp_plus, "task_id"),
    "apps": (apps, "problem_id"),
    "taco": (taco, None),
    "codecontests": (codecontests, "name"),
    "livecodebench": (livecodebench, "question_id"),
    "humaneval": (humaneval, "task_id"),
}

__all__ = ["LANGUAGES", "SETS", "Converted", "Options", "Skip", "convert", "record_id"]


@dataclass
class Converted:
    """The tasks (our JSONL records) and the skipped records ({id, where, reason})."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def reasons(self) -> dict[str, int]:
        """How many records were skipped for each reason, most frequent first."""
        counts: dict[str, int] = {}
        for s in self.skipped:
            counts[s["reason"]] = counts.get(s["reason"], 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def record_id(name: str, rec: dict, row: int, opts: Options) -> str:
    """The task id of the record in row `row` (1-based) of set `name`."""
    key = SETS[name][1]
    native = rec.get(key) if key else row
    default = "" if name == "humaneval" else name
    prefix = default if opts.id_prefix is None else opts.id_prefix
    return f"{prefix}/{native}" if prefix else str(native)


def convert(name: str, records: Iterable[tuple[str, dict]], opts: Options) -> Converted:
    if name not in SETS:
        raise DataError(f"unknown set {name!r}: use one of {', '.join(SETS)}")
    if opts.language not in LANGUAGES:
        raise DataError(f"language {opts.language!r} is not one of {', '.join(LANGUAGES)}")
    fn, out = SETS[name][0], Converted()
    seen: set[str] = set()
    for row, (where, rec) in enumerate(records, 1):
        tid = record_id(name, rec, row, opts)
        try:
            if tid in seen:
                raise Skip("duplicate id (an earlier record has it)")
            task = {"id": tid, **_clean(fn(rec, opts))}
            task_from_record(task, where)  # what we write, `load_tasks` reads
        except (Skip, DataError) as e:
            out.skipped.append({"id": tid, "where": where, "reason": str(e)})
            continue
        seen.add(tid)
        out.tasks.append(task)
    return out


def _clean(task: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in task.items() if v is not None and v != ""}
