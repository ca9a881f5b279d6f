"""What the set converters share: their options, the `Skip` a record raises when its tests cannot
run here, the prompts, stdin/stdout and function-call test builders, and the field parsers.

A converter is a pure function `(record, Options) -> task record` (our JSONL format, see
docs/task-formats.md). It raises `Skip(reason)` for a record whose tests we cannot run; the
caller counts and lists those, it never drops one silently.

Not covered: running anything (the exec reward does), the sets' own layouts (one module each).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LANGUAGES = ("python", "cpp", "rust")
LANGUAGE_NAMES = {"python": "Python 3", "cpp": "C++17", "rust": "Rust"}

# The standard-library names the APPS/TACO and LiveCodeBench checkers import before a solution
# runs (LeetCode-style code uses List, deque, ... without importing them); our own list.
PREAMBLE = ("import sys, math, re, string, heapq, bisect, itertools, functools, collections\n"
            "from typing import *\n"
            "from collections import *\n"
            "from itertools import *\n"
            "from functools import *\n"
            "from heapq import *\n"
            "from bisect import *\n"
            "from math import *\n")


class Skip(Exception):
    """This record's tests cannot be run by the exec reward; the message says why."""


@dataclass(frozen=True)
class Options:
    """`language`: the language of stdin/stdout tasks (function tasks are Python);
    `id_prefix`: put before each set's own id (None: the set's name); `max_tests`: keep at most
    this many tests per task, in the set's order (0: all)."""

    language: str = "python"
    id_prefix: str | None = None
    max_tests: int = 0


def capped(items: Sequence, max_tests: int) -> list:
    return list(items[:max_tests] if max_tests else items)


# --- prompts ------------------------------------------------------------------------------------


def program_prompt(question: str, language: str) -> str:
    name = LANGUAGE_NAMES[language]
    return (f"{question.strip()}\n\nWrite a complete {name} program that reads the input from "
            "standard input and writes the answer to standard output. Answer with the program "
            f"in one ```{language} code block.")


def function_prompt(question: str, starter: str, entry_point: str) -> str:
    head = question.strip()
    if starter.strip():
        return (f"{head}\n\nComplete this Python code; `{entry_point}` is called with each "
                "test's arguments and its return value is checked:\n```python\n"
                f"{starter.rstrip()}\n```\nAnswer with the complete code in one ```python code "
                "block.")
    return (f"{head}\n\nWrite a Python function `{entry_point}`; it is called with each test's "
            "arguments and its return value is checked. Answer with the code in one ```python "
            "code block.")


# --- tests --------------------------------------------------------------------------------------


def stdio_tests(inputs: Sequence[Any], outputs: Sequence[Any], max_tests: int) -> list[dict]:
    """[{stdin, stdout}] from parallel lists; a list of lines is joined with newlines."""
    if len(inputs) != len(outputs):
        raise Skip(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    tests = [{"stdin": _text(i), "stdout": _text(o)} for i, o in zip(inputs, outputs, strict=True)]
    if not tests:
        raise Skip("no tests")
    return capped(tests, max_tests)


def _text(x: Any) -> str:
    if isinstance(x, list) and all(isinstance(v, str) for v in x):
        return "\n".join(x)
    if isinstance(x, str):
        return x
    raise Skip(f"a stdin/stdout test value is a {type(x).__name__}, not text")


def literal(value: Any) -> str:
    """Python source for a JSON value (raises Skip when it has none, e.g. infinity)."""
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        raise Skip(f"test value {text[:60]} has no Python literal") from None
    return text


def check_function(units: Sequence[str], helpers: str = "") -> str:
    """A HumanEval-style `test`: `helpers` at module level, then `check(candidate)` with one
    top-level statement per unit (each an assert: one test of the exec reward)."""
    if not units:
        raise Skip("no tests")
    body = "".join(f"    {u}\n" for u in units)
    return f"{helpers.rstrip()}\n\n\ndef check(candidate):\n{body}".lstrip("\n")


# --- fields -------------------------------------------------------------------------------------


def json_field(rec: dict, key: str, default: Any) -> Any:
    """A field the set stores as a JSON string (already decoded is accepted too)."""
    value = rec.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise Skip(f"{key} is not valid JSON") from None


def text_field(rec: dict, *keys: str) -> str:
    """The first of `keys` that holds a non-empty string."""
    for key in keys:
        value = rec.get(key)
        if isinstance(value, str) and value.strip():
            return value
    raise Skip(f"no {' or '.join(keys)} text")


def first_solution(solutions: Any) -> str | None:
    if isinstance(solutions, list):
        return next((s for s in solutions if isinstance(s, str) and s.strip()), None)
    return None
