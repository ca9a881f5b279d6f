"""LiveCodeBench (`livecodebench/code_generation_lite`) records into tasks.

Fields used: `question_id`, `question_title`, `question_content`, `platform` (leetcode /
codeforces / atcoder), `contest_id`, `contest_date`, `starter_code`, `difficulty` (easy / medium
/ hard), `public_test_cases` (a JSON string: a list of `{input, output, testtype}`),
`private_test_cases` (the same JSON string, or that string pickled, zlib-compressed and base64
encoded) and `metadata` (a JSON string; `func_name` for functional tests).

- `testtype: stdin`: stdin/stdout programs in `Options.language`.
- `testtype: functional` (LeetCode): each input is one JSON value per line, the arguments of
  `func_name`; the output one JSON value. They become function-call tests `{args, expected}`
  (compared as JSON values, a tuple equal to a list, as LiveCodeBench compares them); the entry
  point is `Solution.<func_name>` when the starter code defines `class Solution`.

Python tasks get `preamble` (the imports LiveCodeBench's checker provides). The pickled private
tests are read with an unpickler that refuses every class and function: a pickle of anything
but the plain string is an error, never executed. Ids: `livecodebench/<question_id>`. Not covered:
LiveCodeBench's decimal comparison of program output (we compare text), its release-version
filters (export the version you want).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from typing import Any

from .common import (
    PREAMBLE,
    Options,
    Skip,
    capped,
    function_prompt,
    json_field,
    program_prompt,
    stdio_tests,
    text_field,
)


class _StringOnly(pickle.Unpickler):
    """Loads a pickled str (no class or function is ever looked up)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only a pickled string loads")


def private_tests(value: Any) -> list:
    """LiveCodeBench's private_test_cases: plain JSON, or base64(zlib(pickle(JSON string)))."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str) or not value.strip():
        return []
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(value.encode("ascii"), validate=True))
        text = _StringOnly(io.BytesIO(raw)).load()
    except (binascii.Error, zlib.error, pickle.UnpicklingError, UnicodeEncodeError, EOFError,
            ValueError) as e:
        raise Skip(f"private_test_cases are neither JSON nor encoded JSON ({e})") from None
    if not isinstance(text, str):
        raise Skip("private_test_cases decode to something other than a JSON string")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise Skip("private_test_cases decode to a string that is not JSON") from None


def livecodebench(rec: dict, opts: Options) -> dict:
    cases = list(json_field(rec, "public_test_cases", [])) + private_tests(
        rec.get("private_test_cases"))
    if not cases or not all(isinstance(c, dict) for c in cases):
        raise Skip("no test cases")
    kinds = {c.get("testtype") for c in cases}
    question = text_field(rec, "question_content")
    base = {"difficulty": rec.get("difficulty"), "source": "livecodebench",
            **{k: rec[k] for k in ("platform", "contest_id", "contest_date", "question_title")
               if rec.get(k)}}
    if kinds == {"stdin"}:
        lang = opts.language
        tests = stdio_tests([c.get("input", "") for c in cases], [c.get("output") for c in cases],
                            opts.max_tests)
        return {**base, "prompt": program_prompt(question, lang), "language": lang,
                "tests": tests, "preamble": PREAMBLE if lang == "python" else ""}
    if kinds == {"functional"}:
        return {**base, **_functional(rec, question, cases, opts.max_tests)}
    raise Skip(f"test types {sorted(map(str, kinds))}: expected all stdin or all functional")


def _functional(rec: dict, question: str, cases: list[dict], max_tests: int) -> dict:
    meta = json_field(rec, "metadata", {})
    fn = meta.get("func_name") if isinstance(meta, dict) else None
    if not fn:
        raise Skip("functional tests but no metadata.func_name")
    starter = rec.get("starter_code") or ""
    tests = [{"args": _json_lines(c.get("input", "")), "expected": _json(c.get("output"))}
             for c in capped(cases, max_tests)]
    entry = f"Solution.{fn}" if "class Solution" in starter else fn
    return {"prompt": function_prompt(question, starter, fn), "language": "python",
            "entry_point": entry, "tests": tests, "preamble": PREAMBLE}


def _json_lines(text: Any) -> list:
    if not isinstance(text, str):
        raise Skip("a functional test input is not text")
    return [_json(line) for line in text.split("\n")]


def _json(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError, RecursionError):
        raise Skip(f"a functional test value is not JSON: {str(text)[:60]}") from None
