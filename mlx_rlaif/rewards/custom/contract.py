"""What a reward function receives and what it may return (docs/rewards.md: the contract).

Per completion a function may take, by name: `prompt`, `completion`, `code` (the code
extracted from the completion), `task` (the Task), `record` (every field of the task's JSONL
record), `task_id`, `language`, `exec_result` (when the exec reward is a component: `passed`,
`total`, `value`, `reason` and `tests`, each test's name, passed and reason; else None), `step`,
any field of the record by its own name, and the component's `kwargs`. A function taking the
plural names (`completions`, `prompts`, `codes`, `tasks`, `records`, `task_ids`, `languages`,
`exec_results`, and OpenRLHF's `queries`, prompt + completion, and `labels`, the record's
`label`, `answer` or `solution`) gets lists: the batch, or one prompt's group; a list, an
array (`tolist()`) or OpenRLHF's `{"rewards": ...}` comes back.

It returns a number, None (not applicable: left out of the sum) or a dict of named numbers
(each logged; the value is its `score` key, else the sum of its numbers); a function of lists
returns a list of those, one per completion. Anything else (NaN, inf, a bool, an int too large
for a float, a number past +-MAX_REWARD, an empty dict, a string, a list of the wrong length)
is an error naming the function, the task and what came back (`check_value`). MAX_REWARD
(1e100) keeps every sum and square the trainer takes of a batch's rewards finite.
`plain_value` / `plain_list` turn what a function returned into plain data (float, None, dict of
str -> float) in the worker, so the trainer never unpickles an object of the function's.

Not covered: the completion's tokens (text only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...records import Reward, Task, extract_code
from .spec import PLURAL, PLURALS, SINGULAR, Loaded

MAX_REWARD = 1e100  # |value| past this is refused: a batch's sums and squares stay finite


class ValueProblem(ValueError):
    """A value a function returned that the contract does not allow (the message says what)."""


def record_of(task: Task) -> dict[str, Any]:
    """Every field of the task's record, as it was read (meta holds the fields we do not use)."""
    rec = {"id": task.id, "prompt": task.prompt, "language": task.language}
    for key in ("entry_point", "test", "difficulty"):
        if getattr(task, key) is not None:
            rec[key] = getattr(task, key)
    if task.tests:
        rec["tests"] = [dict(t) for t in task.tests]
    if task.preamble:
        rec["preamble"] = task.preamble
    return {**rec, **dict(task.meta)}


def record_fields(tasks: Sequence[Task]) -> set[str]:
    """Every field name of the tasks' records (what a function's parameters may name)."""
    return {k for t in tasks for k in record_of(t)}


def exec_summary(reward: Reward | None) -> dict[str, Any] | None:
    """The exec reward's result of one completion as a function sees it (None without one)."""
    if reward is None:
        return None
    d = reward.details
    tests = [{"name": t.get("name", ""), "passed": bool(t.get("passed")),
              "reason": t.get("reason", "")} for t in d.get("tests", [])]
    return {"value": reward.value, "passed": d.get("passed"), "total": d.get("total"),
            "reason": reward.reason, "tests": tests}


def units(tasks: Sequence[Task], completions: Sequence[str],
          exec_results: Sequence[dict | None]) -> list[dict[str, Any]]:
    """One argument set per completion (the singular names)."""
    out = []
    for t, c, e in zip(tasks, completions, exec_results, strict=True):
        record = record_of(t)
        out.append({"prompt": t.prompt, "completion": c, "code": extract_code(c, t.language),
                    "task": t, "record": record, "task_id": t.id, "language": t.language,
                    "exec_result": e, "query": t.prompt + c, "label": label_of(record)})
    return out


def label_of(record: Mapping[str, Any]) -> Any:
    """OpenRLHF's label of a record: its `label`, `answer` or `solution` field (None)."""
    return next((record[k] for k in ("label", "answer", "solution") if k in record), None)


def as_lists(items: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per-completion argument sets as one set of lists (the plural names)."""
    return {PLURALS[name]: [it[name] for it in items] for name in SINGULAR}


def arguments(fn: Loaded, unit: Mapping[str, Any], kwargs: Mapping[str, Any], step: int,
              trusted: bool = True) -> dict[str, Any]:
    """The keyword arguments of one call: the names its signature asks for (all of them with
    `**kwargs`); a record field it names that the record lacks and that has no default raises
    ValueProblem. An untrusted record (a request to `serve-reward`) fills only parameters
    without a default: a function's defaults (which model, which path) stay its operator's."""
    given = {**unit, "step": step, **kwargs}
    record = {} if fn.batched else unit.get("record", {})
    if fn.var_kw:
        extra = {k: v for k, v in record.items() if k not in given} if trusted else {}
        return {**extra, **given}
    out = {}
    for name in fn.params:
        if name in given:
            out[name] = given[name]
        elif name in record and (trusted or name not in fn.optional):
            out[name] = record[name]
        elif name not in fn.optional:
            raise ValueProblem(f"the task's record has no field {name!r} (a parameter of the "
                               "function without a default)")
    return out


def check_value(x: Any) -> tuple[float | None, dict[str, float | None]]:
    """(value, named parts) of what a function returned for one completion."""
    if x is None:
        return None, {}
    if isinstance(x, Mapping):
        if not x:
            raise ValueProblem("returned an empty dict: return a number, None or a dict of "
                               "named numbers")
        parts: dict[str, float | None] = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise ValueProblem(f"a dict with key {shown(k)}: keys are names (strings)")
            parts[str.__str__(k)] = None if v is None else _number(v, f"[{k!r}]")
        if "score" in parts:
            return parts["score"], {k: v for k, v in parts.items() if k != "score"}
        nums = [v for v in parts.values() if v is not None]
        return (_bounded(math.fsum(nums), "'s sum of its numbers") if nums else None), parts
    return _number(x, ""), {}


def _number(x: Any, where: str) -> float:
    if isinstance(x, bool):
        pass  # True / False are no reward (a bug's value read as 1.0 / 0.0)
    elif isinstance(x, (int, float)):
        try:
            v = float.__float__(x) if isinstance(x, float) else float(int.__index__(x))
        except OverflowError:
            v = math.inf
        if math.isfinite(v):
            return _bounded(v, where)
    elif type(x).__name__ in ("float16", "float32", "float64", "int8", "int16", "int32",
                              "int64", "uint8", "uint16", "uint32", "uint64") \
            and hasattr(x, "item"):
        return _number(x.item(), where)
    raise ValueProblem(f"returned{where} {shown(x)}: return a finite number, None or a dict "
                       "of numbers")


def _bounded(v: float, where: str) -> float:
    if abs(v) > MAX_REWARD:
        raise ValueProblem(f"returned{where} {v:g}, above {MAX_REWARD:g} in size: rewards this "
                           "large overflow the advantages (scale it down)")
    return v


def plain_value(x: Any) -> float | dict[str, float | None] | None:
    """What a function returned for one completion as plain data (ValueProblem if the contract
    refuses it): run in the worker, under its timeout."""
    if x is None:
        return None
    if isinstance(x, Mapping):
        check_value(x)
        return {str.__str__(k): None if v is None else _number(v, f"[{k!r}]")
                for k, v in x.items()}
    return _number(x, "")


def plain_list(x: Any, n: int) -> list[Any]:
    """What a function of lists returned, as a list of n plain values (ValueProblem)."""
    return [plain_value(v) for v in check_list(x, n)]


def shown(x: Any) -> str:
    """A returned value as an error line shows it (short)."""
    try:
        text = repr(x) if not isinstance(x, int) or x.bit_length() < 200 else \
            f"of {int(x.bit_length() * 0.30103) + 1} digits"
    except Exception:  # noqa: BLE001 - a repr that raises is shown by its type
        text = "<repr failed>"
    return f"{type(x).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check_list(x: Any, n: int) -> list[Any]:
    """What a function of lists returned: a list (or tuple, or an array's `tolist()`) of n
    values; OpenRLHF's `{"rewards": ..., ...}` is read as its rewards."""
    if isinstance(x, Mapping) and "rewards" in x:
        x = x["rewards"]
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise ValueProblem(f"returned {shown(x)}: a function of lists returns a list, one value "
                           f"per completion ({n})")
    if len(x) != n:
        raise ValueProblem(f"returned {len(x)} values for {n} completions")
    return list(x)


__all__ = ["PLURAL", "ValueProblem", "arguments", "as_lists", "check_list", "check_value",
           "exec_summary", "plain_list", "plain_value", "record_fields", "record_of", "shown",
           "units", "MAX_REWARD"]
