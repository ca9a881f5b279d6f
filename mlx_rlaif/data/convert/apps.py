"""APPS (`codeparrot/apps`) and TACO (`BAAI/TACO`) records into tasks. Both store
`input_output` as a JSON string `{"inputs": [...], "outputs": [...], "fn_name"?: str}` and
`solutions` as a JSON string list of Python programs.

- Without `fn_name`: stdin/stdout programs (`tests: [{stdin, stdout}]`; a list of lines is
  joined with newlines), in `Options.language`.
- With `fn_name`: call-based. Each input is the argument list; APPS's checker accepts the
  result when it equals the output, or the output's first item when the output is a non-empty
  list (most Codewars outputs are wrapped in a list, LeetCode ones are not), a tuple counting as
  a list. That rule is kept: a HumanEval-style `test` whose `check` asserts it once per test in
  the trusted checker. With `class Solution` in the starter code the entry point is
  `Solution.<fn_name>` (one instance answers every call, as in APPS). JSON object keys that are
  all integers become ints, as APPS restores them.

Python tasks get `preamble` (the imports APPS's checker provides). Ids: `apps/<problem_id>`;
TACO has no id field, so `taco/<row>` (1-based row in the file; pass `--id-prefix taco-test`
for its test split). Difficulty is kept as published (APPS: introductory / interview /
competition; TACO: EASY ... VERY_HARD). Not covered: APPS's lenient output comparison (numbers
within a tolerance, whitespace-split tokens): outputs compare as text line by line.
"""

from __future__ import annotations

from typing import Any

from .common import (
    PREAMBLE,
    Options,
    Skip,
    capped,
    check_function,
    first_solution,
    function_prompt,
    json_field,
    literal,
    program_prompt,
    stdio_tests,
    text_field,
)

# APPS's comparison of a call's result with the published output, run by the trusted checker.
APPS_EQUAL = '''def apps_equal(out, exp):
    if isinstance(out, tuple):
        out = list(out)
    if out == exp:
        return True
    if isinstance(exp, list) and exp:
        if out == exp[0]:
            return True
        if isinstance(out, list) and out and isinstance(out[0], tuple):
            return [list(x) for x in out] == exp[0]
    return False
'''


def apps(rec: dict, opts: Options) -> dict:
    base = {"source": "apps",
            "source_id": rec.get("problem_id"), "url": rec.get("url"),
            "difficulty": rec.get("difficulty")}
    return {**base, **_task(rec, opts)}


def taco(rec: dict, opts: Options) -> dict:
    base = {"source": "taco", "name": rec.get("name"),
            "url": rec.get("url"), "difficulty": rec.get("difficulty"),
            "tags": rec.get("tags"), "skill_types": rec.get("skill_types")}
    return {**{k: v for k, v in base.items() if v not in (None, "")}, **_task(rec, opts)}


def _task(rec: dict, opts: Options) -> dict:
    io = json_field(rec, "input_output", {})
    if not isinstance(io, dict) or not io.get("inputs"):
        raise Skip("no tests (input_output has no inputs)")
    question = text_field(rec, "question")
    starter = rec.get("starter_code") or ""
    solution = first_solution(json_field(rec, "solutions", []))
    fn = io.get("fn_name")
    if fn:
        return call_task(question, starter, str(fn), io["inputs"], io.get("outputs") or [],
                         solution, opts.max_tests)
    lang = opts.language
    return {"prompt": program_prompt(question, lang), "language": lang,
            "tests": stdio_tests(io["inputs"], io.get("outputs") or [], opts.max_tests),
            "preamble": PREAMBLE if lang == "python" else "",
            "solution": solution if lang == "python" else None}


def call_task(question: str, starter: str, fn: str, inputs: list, outputs: list,
              solution: str | None, max_tests: int) -> dict:
    if len(inputs) != len(outputs):
        raise Skip(f"{len(inputs)} test inputs but {len(outputs)} outputs")
    entry = f"Solution.{fn}" if "class Solution" in starter else fn
    pairs = capped(list(zip(inputs, outputs, strict=True)), max_tests)
    units = [_assert(args, exp) for args, exp in pairs]
    return {"prompt": function_prompt(question, starter, fn), "language": "python",
            "entry_point": entry, "test": check_function(units, APPS_EQUAL),
            "preamble": PREAMBLE, "solution": solution}


def _assert(args: Any, expected: Any) -> str:
    if not isinstance(args, list):
        raise Skip("a call-based test input is not an argument list")
    args = [int_keys(args[0]), *args[1:]] if args else args
    exp = int_keys(expected)
    if isinstance(exp, list) and exp:
        exp = [int_keys(exp[0]), *exp[1:]]
    return f"assert apps_equal(candidate(*{literal(args)}), {literal(exp)})"


def int_keys(x: Any) -> Any:
    """A dict whose keys all read as integers, with int keys (JSON turned them into strings)."""
    if isinstance(x, dict) and x:
        try:
            return {int(k): v for k, v in x.items()}
        except (TypeError, ValueError):
            return x
    return x
