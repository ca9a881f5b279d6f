"""MBPP, MBPP+ (EvalPlus) and HumanEval records into HumanEval-style tasks (`test` defines
`check(candidate)`, `entry_point` the function).

- MBPP (`google-research-datasets/mbpp`): configs `full` (task_id, text, code, test_list,
  test_setup_code, challenge_test_list) and `sanitized` (task_id, prompt, code, test_imports,
  test_list). Each assert of `test_list` is one test (partial credit), after `test_setup_code`
  and `test_imports`; `challenge_test_list` is kept as a field, not run (MBPP's own scoring
  leaves it out). The prompt is the description and the first assert (as EvalPlus shows it),
  which names the function and its signature.
- MBPP+ (`evalplus/mbppplus`: task_id, prompt, code, source_file, test_imports, test_list,
  test): `test` is EvalPlus's program (helpers, `inputs`, `results`, a loop of `assertion`
  calls). Its imports and definitions stay at module level, the rest becomes the body of
  `check`, so the whole program is one test, all or nothing, as EvalPlus scores it. Its
  `import numpy as np` becomes a standard-library stand-in (NUMPY_STANDIN below): the checker
  runs without site-packages.
- HumanEval (`openai/openai_humaneval`: task_id, prompt, canonical_solution, test,
  entry_point): kept as it is; the shipped `suite:humaneval` goes through this converter.

The reference solution is kept as `solution`. Not covered: MBPP's few-shot prompt, EvalPlus's
per-task tolerances beyond what its `test` program does.
"""

from __future__ import annotations

import ast
import builtins

from .common import Options, Skip, check_function, text_field


def mbpp(rec: dict, opts: Options) -> dict:
    asserts = [t for t in rec.get("test_list") or [] if isinstance(t, str) and t.strip()]
    if not asserts:
        raise Skip("no test_list asserts")
    code = _code(rec)
    entry = entry_point(code, asserts)
    units = asserts[: opts.max_tests] if opts.max_tests else asserts
    setup = "\n".join([*(rec.get("test_imports") or []), rec.get("test_setup_code") or ""])
    out = {"prompt": _prompt(text_field(rec, "text", "prompt"), asserts[0]),
           "language": "python", "entry_point": entry,
           "test": _parsed(check_function(units, setup)), "solution": code,
           "source": "mbpp", "source_id": rec.get("task_id")}
    if rec.get("challenge_test_list"):
        out["challenge_test_list"] = list(rec["challenge_test_list"])
    return out


def mbpp_plus(rec: dict, opts: Options) -> dict:
    program = rec.get("test")
    if not isinstance(program, str) or not program.strip():
        raise Skip("no EvalPlus test program (field test)")
    asserts = [t for t in rec.get("test_list") or [] if isinstance(t, str) and t.strip()]
    code = _code(rec)
    entry = entry_point(code, asserts or [program])
    test = program_check(program, list(rec.get("test_imports") or []))
    return {"prompt": _prompt(text_field(rec, "prompt", "text"), asserts[0] if asserts else ""),
            "language": "python", "entry_point": entry,
            "test": test, "solution": code, "source": "mbpp-plus", "source_id": rec.get("task_id")}


def humaneval(rec: dict, opts: Options) -> dict:
    for key in ("task_id", "prompt", "test", "entry_point"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise Skip(f"no {key}")
    canonical = rec.get("canonical_solution") or ""
    return {"prompt": rec["prompt"],
            "entry_point": rec["entry_point"], "test": rec["test"], "language": "python",
            "solution": rec["prompt"] + canonical if canonical else None, "source": "humaneval"}


# --- helpers ------------------------------------------------------------------------------------


def _prompt(text: str, first_assert: str) -> str:
    shown = f"\n\nYour code should pass this test:\n{first_assert.strip()}" if first_assert else ""
    return f"{text.strip()}{shown}"


def _code(rec: dict) -> str:
    code = rec.get("code")
    if not isinstance(code, str) or not code.strip():
        raise Skip("no reference code (field code)")
    return code.replace("\r\n", "\n")


def entry_point(code: str, tests: list[str]) -> str:
    """The function under test: a top-level def of the reference code the tests call, else the
    first non-builtin name the tests call."""
    called = _called(tests)
    try:
        defs = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    except SyntaxError:
        defs = []
    found = next((d for d in defs if d in called), None)
    found = found or next((c for c in called if not hasattr(builtins, c)), None)
    if found is None:
        raise Skip("cannot tell which function the tests call")
    return found


def _called(tests: list[str]) -> list[str]:
    names: list[str] = []
    for t in tests:
        try:
            tree = ast.parse(t)
        except SyntaxError:
            raise Skip(f"a test does not parse: {t[:60]}") from None
        names += [n.func.id for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return list(dict.fromkeys(names))


def program_check(program: str, imports: list[str]) -> str:
    """EvalPlus's test program as a HumanEval-style test: `imports`, the program's imports and
    definitions at module level, its other top-level statements the body of `check`."""
    try:
        tree = ast.parse("\n".join([*imports, program]))
    except SyntaxError as e:
        raise Skip(f"the test program does not parse: {e.msg}") from None
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)
    helpers = [m for n in tree.body if isinstance(n, keep) for m in _without_numpy(n)]
    body = [n for n in tree.body if not isinstance(n, keep)]
    if not body:
        raise Skip("the test program runs no test")
    check = ast.FunctionDef(name="check", args=ast.arguments(
        posonlyargs=[], args=[ast.arg("candidate")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, type_params=[])
    return ast.unparse(ast.fix_missing_locations(ast.Module([*helpers, check], []))) + "\n"


# EvalPlus's helpers use numpy for two names: `np.ndarray` (in is_floats) and
# `np.testing.assert_allclose` (floats within a tolerance). The checker's sandbox runs Python
# without site-packages, and every value from the student's process is plain data, so this
# stand-in replaces `import numpy as np`: no value is an ndarray, and assert_allclose compares
# numbers (nested lists and tuples elementwise, a scalar against each element) as numpy does,
# |actual - desired| <= atol + rtol * |desired|.
NUMPY_STANDIN = '''class np:
    class ndarray:
        pass

    float64 = float32 = float

    class testing:
        @staticmethod
        def assert_allclose(actual, desired, rtol=1e-07, atol=0, equal_nan=True, err_msg=""):
            def flat(x):
                if isinstance(x, (list, tuple)):
                    return [y for v in x for y in flat(v)]
                return [x]

            a, d = flat(actual), flat(desired)
            if len(a) != len(d):
                if len(a) == 1:
                    a = a * len(d)
                elif len(d) == 1:
                    d = d * len(a)
                else:
                    raise AssertionError(f"shapes differ: {actual!r} vs {desired!r}")
            for x, y in zip(a, d):
                if not all(isinstance(v, (int, float)) for v in (x, y)):
                    raise AssertionError(f"not numbers: {x!r} vs {y!r} {err_msg}")
                if x != x and y != y and equal_nan:
                    continue
                if not abs(x - y) <= atol + rtol * abs(y):
                    raise AssertionError(f"not close: {x!r} vs {y!r} {err_msg}")
'''


def _without_numpy(node: ast.stmt) -> list[ast.stmt]:
    """`import numpy as np` becomes the stand-in above; other statements stay."""
    if isinstance(node, ast.Import) and any(a.name == "numpy" for a in node.names):
        if [(a.name, a.asname) for a in node.names] != [("numpy", "np")]:
            raise Skip("the test program imports numpy other than as np")
        return ast.parse(NUMPY_STANDIN).body
    return [node]


def _parsed(test: str) -> str:
    try:
        ast.parse(test)
    except SyntaxError as e:
        raise Skip(f"the converted test does not parse ({e.msg})") from None
    return test
