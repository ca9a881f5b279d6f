"""Task records from a repository's recorded calls: pure functions over the module's source.

One task per module-level function with recorded calls or calling test functions:
- `prompt`: the function's module with that function's body removed (signature, decorators and
  docstring kept, `...` in place of the rest), other definitions kept, the file cut to
  `context_lines` around the function when it is longer, fenced, after one sentence saying what
  to write;
- `solution`: the original definition (without its decorators: the module keeps them);
- `test`: the checker's `check(candidate)` (rewards/exec/repo.py): the recorded calls (at most
  `max_tests` of them, in the recorded order) and the repository's test functions that called it;
- `repo`: the repository's path and commit, the file, the module and its import root, the
  function's name and line, the module's source and its sha256, the interpreter's import path;
- `calls`, `repo_tests`: the checks, as data; `gate`: the quality gate's measures (gate.py).

What is found also lists what cannot become a task (methods, nested functions), for the summary.
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...rewards.exec.repo import check_source, find_def, source_lines
from .checked import Unreadable, inside, read_bytes, read_source


def defined_functions(repo: Path, files: Sequence[Path], is_test) -> tuple[int, int]:
    """(module-level functions, methods and nested functions) defined outside the tests."""
    top = inner = 0
    for f in files:
        if is_test(os.path.realpath(f)):  # never raises on a symlink loop
            continue
        try:
            tree = ast.parse(read_source(repo, str(f)))
        except (SyntaxError, ValueError, Unreadable, RecursionError, MemoryError):
            continue
        tops = {id(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top += id(n) in tops
                inner += id(n) not in tops
    return top, inner


def git_commit(repo: Path) -> str | None:
    """HEAD's commit read from .git's files (no git process: a repository's config can make
    git run commands)."""
    def text(path: str) -> str:  # inside the repository, a regular file, bounded
        return read_bytes(inside(repo, path)).decode("utf-8", "replace")

    try:
        head = text(".git/HEAD").strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[5:]
        try:
            return text(f".git/{ref}").strip() or None
        except Unreadable:
            pass
        for line in text(".git/packed-refs").splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except Unreadable:
        return None
    return None


def definition(source: str, name: str) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]:
    node = find_def(ast.parse(source), name)
    if node is None:
        raise LookupError(f"{name} is not a top-level function of its module")
    lines = source_lines(source)
    return node, "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"


def stub(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], int]:
    """The module's lines with the function's body removed, and the function's first line."""
    lines = source_lines(source)
    body = node.body
    has_doc = ast.get_docstring(node, clean=False) is not None
    first = body[1] if has_doc and len(body) > 1 else (None if has_doc else body[0])
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    head_end = (first.lineno - 1) if first is not None else node.end_lineno
    if first is not None and first.lineno == node.lineno:  # `def f(x): return x`
        head = [lines[node.lineno - 1][:first.col_offset].rstrip()]
        head_lines = [*lines[start - 1:node.lineno - 1], *head]
    else:
        head_lines = lines[start - 1:head_end]
    indent = " " * (body[0].col_offset if body[0].lineno != node.lineno else node.col_offset + 4)
    out = [*lines[:start - 1], *head_lines, f"{indent}...", *lines[node.end_lineno:]]
    return out, start


def cut(lines: list[str], at: int, context: int) -> str:
    """`lines` cut to `context` lines around line `at` (1-based) when longer."""
    if context <= 0 or len(lines) <= context:
        return "\n".join(lines)
    lo = max(0, min(at - 1 - context // 3, len(lines) - context))
    hi = lo + context
    parts = ([f"# ... ({lo} lines above cut)"] if lo else []) + lines[lo:hi]
    if hi < len(lines):
        parts.append(f"# ... ({len(lines) - hi} lines below cut)")
    return "\n".join(parts)


def prompt_text(file: str, module: str, name: str, code: str) -> str:
    return (f"Write the function `{name}` of the module `{module}` ({file}). Its body was "
            "removed below (`...`); the rest of the module stays as it is. Answer with the whole "
            "function definition in one ```python block.\n\n```python\n" + code.rstrip("\n")
            + "\n```\n")


def make_task(fn: Mapping[str, Any], repo: Path, source: str, *, commit: str | None,
              sys_path: Sequence[str], context_lines: int, max_tests: int,
              id_prefix: str) -> dict[str, Any]:
    """The task record of one recorded function (its tests not yet gated)."""
    name, file = str(fn["name"]), str(fn["file"])
    node, solution = definition(source, name)
    lines, start = stub(source, node)
    info = {"path": str(repo), "commit": commit, "file": file, "module": fn["module"],
            "root": fn["root"], "qualname": name, "line": node.lineno, "source": source,
            "sha256": hashlib.sha256(source.encode()).hexdigest(), "sys_path": list(sys_path)}
    calls = [c for c in fn.get("calls", []) if literal_call(c)]
    calls = calls[:max_tests] if max_tests > 0 else calls
    tests = [{"nodeid": f"{t[3]}::{t[2]}", "module": t[0], "root": t[1], "name": t[2]}
             for t in fn.get("tests", []) if len(t) >= 4 and t[1]]
    rec = {"id": f"{id_prefix}{file}::{name}",
           "prompt": prompt_text(file, str(fn["module"]), name, cut(lines, start, context_lines)),
           "language": "python", "entry_point": name, "solution": solution, "repo": info,
           "calls": calls, "repo_tests": tests}
    return with_checks(rec, calls, tests)


def literal_call(call: Mapping[str, Any]) -> bool:
    """Whether a recorded call is what recorder.py writes: Python literals only (the record
    comes from the repository's test process; its text becomes the checker's code)."""
    try:
        args, kwargs = ast.literal_eval(call["args"]), ast.literal_eval(call["kwargs"])
        if "raises" in call:
            return str(call["raises"]).isidentifier() and "returns" not in call
        ast.literal_eval(call["returns"])
    except (KeyError, TypeError, ValueError, SyntaxError, RecursionError, MemoryError):
        return False
    return type(args) is tuple and type(kwargs) is dict and all(
        isinstance(k, str) and k.isidentifier() for k in kwargs)


def with_checks(rec: dict[str, Any], calls: Sequence[Mapping], tests: Sequence[Mapping]) -> dict:
    """`rec` with these calls and tests as its checks (`test` regenerated)."""
    rec = {**rec, "calls": list(calls), "repo_tests": list(tests)}
    rec["test"] = check_source(rec["repo"], rec["entry_point"], calls,
                               [(t["module"], t["root"], t["name"]) for t in tests])
    return rec


def split_by_module(records: list[dict], eval_frac: float) -> tuple[list[dict], list[dict]]:
    """(train, eval): whole modules held out, in an order fixed by their names' hashes, while
    the held-out tasks stay within `eval_frac` of all (at least one module when eval_frac > 0
    and there are two modules or more; one module always trains)."""
    if eval_frac <= 0:
        return records, []
    modules: dict[str, list[dict]] = {}
    for r in records:
        modules.setdefault(r["repo"]["module"], []).append(r)
    if len(modules) < 2:
        return records, []
    order = sorted(modules, key=lambda m: hashlib.sha256(m.encode()).hexdigest())
    held: list[str] = []
    n = 0
    for m in order[:-1]:  # one module always trains
        if n and n + len(modules[m]) > eval_frac * len(records):
            continue
        held.append(m)
        n += len(modules[m])
    return ([r for r in records if r["repo"]["module"] not in held],
            [r for r in records if r["repo"]["module"] in held])
