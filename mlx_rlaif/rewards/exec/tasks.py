"""Task formats and verdicts of the exec reward: pure functions, no processes.

Which format a task uses, the Python program to run for a completion (completion style or not),
HumanEval `check` split into test units, JSON-level value comparison, program output comparison,
and turning per-test results into a Reward. The processes and the sandbox are in exec.py.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

from ...config import ExecConfig
from ...errors import DataError
from ...records import Reward, Task, extract_code
from ...sandbox import RunResult
from .repo import is_repo_task, student_program

# Parsing student code must not print its SyntaxWarnings ("invalid decimal literal", invalid
# escapes) on the trainer's terminal: they are the student's, attributed to `<unknown>`.
warnings.filterwarnings("ignore", category=SyntaxWarning, module="<unknown>")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="<unknown>")


class Unscorable(Exception):
    """The task (not the student) cannot be scored: the reward is None."""


def task_format(task: Task) -> str:
    """humaneval | calls | stdio; raises Unscorable for anything else."""
    if task.test:
        if task.language != "python" or not task.entry_point:
            raise Unscorable("a `test` with check(candidate) needs language python and an "
                             "entry_point")
        return "humaneval"
    if not task.tests:
        raise Unscorable("the task has no tests (`test`, or `tests` with args/expected or "
                         "stdin/stdout items)")
    if all(isinstance(t, Mapping) and "args" in t and "expected" in t for t in task.tests):
        if task.language != "python" or not task.entry_point:
            raise Unscorable("args/expected tests need language python and an entry_point; "
                             "C++ and Rust tasks use stdin/stdout tests")
        return "calls"
    if all(isinstance(t, Mapping) and "stdout" in t for t in task.tests):
        return "stdio"
    raise Unscorable("tests must all be {args, expected} or all {stdin, stdout} items")


def check_formats(tasks: list[Task]) -> None:
    """A DataError naming the first task this reward cannot score (no tests, or tests of an
    unknown shape) and how many there are: caught when the run is set up, not as a None per
    completion for the whole run."""
    bad = []
    for task in tasks:
        try:
            task_format(task)
        except Unscorable as e:
            bad.append((task, str(e)))
    if bad:
        task, why = bad[0]
        raise DataError(f"task {task.id}: {why} ({len(bad)} of {len(tasks)} tasks like it): fix "
                        "the task file, or score them with reward.type teacher, mix or syntax")


def python_program(task: Task, completion: str) -> str:
    """The Python to run: the extracted code, completed with the prompt where needed, after the
    task's preamble."""
    code = extract_code(completion, "python")
    if is_repo_task(task.meta):  # the student's function put back into its module (repo.py)
        return student_program(task.meta["repo"], task.entry_point or "", code)
    ep = (task.entry_point or "").split(".")[0]  # `Solution.method`: the class
    prompt_code = _parse(task.prompt)
    if not ep or prompt_code is None or not _defines(prompt_code, ep):
        return with_preamble(task.preamble, code)
    tree = _parse(code)
    if tree is not None and _defines(tree, ep):
        imports = [ast.unparse(n) for n in prompt_code.body
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
        return with_preamble(task.preamble, "\n".join([*imports, code]) if imports else code)
    return with_preamble(task.preamble,
                         task.prompt + ("" if task.prompt.endswith("\n") else "\n") + code)


_FUTURE = re.compile(r"^from __future__ import [^\n]*\n?", re.M)


def with_preamble(preamble: str, code: str) -> str:
    """`preamble` put before `code`; the code's one-line `from __future__` imports, which must
    open a file, go first."""
    if not preamble:
        return code
    future = "".join(m.group(0).rstrip("\n") + "\n" for m in _FUTURE.finditer(code))
    body = _FUTURE.sub("", code) if future else code
    return future + preamble.rstrip("\n") + "\n" + body


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _defines(tree: ast.Module, name: str) -> bool:
    return any(name in _bound_names(node) for node in tree.body)


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds (def, class, assignment, import)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name for a in node.names}
    return set()


def syntax_error(code: str) -> str | None:
    """None when `code` parses as Python, else a one-line description."""
    try:
        ast.parse(code)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None if code.strip() else "empty program"


@functools.lru_cache(maxsize=256)  # the G completions of a group share their task's test
def instrument_check(test: str) -> tuple[str, tuple[str, ...]]:
    """The test code with each top-level assert-carrying statement of `check` reporting its own
    verdict through `__unit__(k, exception_or_None)`, and the units' names (none when no
    top-level statement asserts: then the whole call is the one unit)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError) as e:
        raise Unscorable(f"the task's test does not parse: {e}") from None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if fn is None:
        raise Unscorable("the task's test does not define check(candidate)")
    names: list[str] = []
    body: list[ast.stmt] = []
    for stmt in fn.body:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            body.append(stmt)
            continue
        k = len(names)
        src = (ast.get_source_segment(test, stmt) or "").splitlines()[0][:100]
        names.append(f"check line {stmt.lineno}: {src.strip()}")
        body.append(_wrap_unit(stmt, k))
    fn.body = body
    return ast.unparse(ast.fix_missing_locations(tree)), tuple(names)


def _wrap_unit(stmt: ast.stmt, k: int) -> ast.stmt:
    def report(arg: ast.expr) -> ast.stmt:
        return ast.Expr(ast.Call(ast.Name("__unit__", ast.Load()), [ast.Constant(k), arg], []))

    handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), "__e",
                                [report(ast.Name("__e", ast.Load()))])
    return ast.Try([stmt], [handler], [report(ast.Constant(None))], [])


def same_value(got: Any, want: Any) -> bool:
    """JSON-level equality: tuples are lists, dict keys compare as strings, a set equals a list
    of the same items in any order, floats within 1e-6 relative (1e-9 absolute), bools only
    equal bools."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        if isinstance(want, float) or isinstance(got, float):
            return (math.isnan(want) and math.isnan(got)) or math.isclose(
                got, want, rel_tol=1e-6, abs_tol=1e-9)
        return got == want
    if isinstance(want, list) and isinstance(got, (set, frozenset)):
        return len(got) == len(want) and same_value(_sorted(got), _sorted(want))
    if isinstance(want, list) and isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(map(same_value, got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        g = {str(k): v for k, v in got.items()}
        return g.keys() == want.keys() and all(same_value(g[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def _sorted(items: Any) -> list:
    return sorted(items, key=repr)


def normalize_output(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def make_reward(results: list[dict], builds: bool, cfg: ExecConfig, details: dict) -> Reward:
    n = len(results)
    passed = sum(r["passed"] for r in results)
    frac = passed / n if n else 0.0
    credit = frac if cfg.tests_credit == "fraction" else float(n > 0 and passed == n)
    value = cfg.build_weight * float(builds) + cfg.tests_weight * credit
    if not builds:
        reason = f"build error: {key_line(details.get('build_log', ''), 'error')[:160]}"
    elif passed == n:
        reason = f"all {n} tests passed"
    else:
        bad = next(r for r in results if not r["passed"])
        reason = (f"{passed}/{n} tests passed; first failure: {bad['name'][:60]}: {bad['reason']}"
                  + (f" ({bad['message'][:120]})" if bad["message"] else ""))
    return Reward(value, {"builds": float(builds), "tests": frac}, reason,
                  {**details, "passed": passed, "total": n, "tests": results})


def result(name: str, passed: bool, reason: str, message: str, **facts: str) -> dict:
    """One test's verdict. `facts`: what feedback may show of it (`got`: our rendering of the
    value a function returned; `raised`: the exception's type name), never free text the
    student printed."""
    return {"name": name, "passed": passed, "reason": reason, "message": message, **facts}


def judge_output(name: str, r: RunResult, want: str) -> dict:
    if r.timed_out:
        return result(name, False, "timeout", r.describe())
    if not r.ok:
        why = key_line(r.stderr.decode(errors="replace"), "panicked", "Error", "error")
        return result(name, False, "crash", f"{r.describe()}: {why[:200]}".rstrip(": "))
    if r.truncated:
        return result(name, False, "wrong_answer", "output longer than max_output_kb")
    got = normalize_output(r.stdout.decode(errors="replace"))
    expected = normalize_output(want)
    if got == expected:
        return result(name, True, "passed", "")
    k = next((j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
             min(len(got), len(expected)))
    g = got[k] if k < len(got) else "<end of output>"
    w = expected[k] if k < len(expected) else "<end of output>"
    return result(name, False, "wrong_answer", f"line {k + 1}: expected {w[:80]!r}, got {g[:80]!r}")


def key_line(text: str, *keys: str) -> str:
    """The first line of a log holding one of `keys`, else its last line (or "")."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for key in keys:
        hit = next((ln for ln in lines if key in ln), None)
        if hit:
            return hit
    return lines[-1] if lines else ""


def unit_results(names: list[str], lines: list[str], checked: RunResult) -> list[dict]:
    """Per-unit results from the checker's verdict lines; a unit it never reported failed by
    the checker's timeout (or a crash). Raises Unscorable when the task's own code failed."""
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    if not any(e.get("event") == "ready" for e in events) and not checked.timed_out:
        tail = checked.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise Unscorable(f"the task's prompt or test failed to run: {tail[0][:200]}")
    verdicts = {e["unit"]: e for e in events if "unit" in e}
    out = []
    for k, name in enumerate(names):
        v = verdicts.get(k)
        if v is None:
            reason = "timeout" if checked.timed_out else "crash"
            out.append(result(name, False, reason, f"not reached: {checked.describe()}"))
        elif v["reason"] == "unsupported":
            raise Unscorable(f"{name}: {v['message']}")
        else:
            out.append(result(name, bool(v["passed"]), str(v["reason"]), str(v["message"])))
    return out


def prompt_code(prompt: str) -> str:
    """The prompt's code (its helpers, e.g. HumanEval's `poly`), or nothing if it is not code."""
    return prompt if _parse(prompt) is not None else ""


def short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
