"""CodeContests (`deepmind/code_contests`) records into stdin/stdout tasks.

Fields used: `name`, `description`, `public_tests` / `private_tests` / `generated_tests` (each
`{"input": [...], "output": [...]}`, run in that order), `difficulty` (an integer of the
dataset's enum: 0 UNKNOWN_DIFFICULTY, 1 EASY ... 6 EXTERNAL, 7 A ... 28 V, the Codeforces problem
letters; a name is accepted too), `source` (0 UNKNOWN_SOURCE, 1 CODECHEF, 2 CODEFORCES,
3 HACKEREARTH, 4 CODEJAM, 5 ATCODER, 6 AIZU), `solutions` (`{"language": [...], "solution":
[...]}`, language 1 PYTHON (2), 2 CPP, 3 PYTHON3, 4 JAVA), `cf_rating`, `cf_tags`,
`input_file` / `output_file`.

The task's language is `Options.language`; its reference `solution` is the first correct
solution in that language (Python 3 for python, C++ for cpp; none for rust). A problem that reads
or writes named files (`input_file` / `output_file`) is skipped: the tests feed stdin only.
Ids: `codecontests/<name>`. Not covered: the per-problem `time_limit` (the exec reward's
`reward.exec.timeout_s` applies), Java and Python 2 solutions.
"""

from __future__ import annotations

from typing import Any

from .common import Options, Skip, capped, program_prompt, stdio_tests, text_field

DIFFICULTIES = ("UNKNOWN_DIFFICULTY", "EASY", "MEDIUM", "HARD", "HARDER", "HARDEST", "EXTERNAL",
                *"ABCDEFGHIJKLMNOPQRSTUV")
SOURCES = ("UNKNOWN_SOURCE", "CODECHEF", "CODEFORCES", "HACKEREARTH", "CODEJAM", "ATCODER",
           "AIZU")
SOLUTION_LANGUAGES = {"python": (3, "PYTHON3"), "cpp": (2, "CPP"), "rust": ()}
TEST_FIELDS = ("public_tests", "private_tests", "generated_tests")


def codecontests(rec: dict, opts: Options) -> dict:
    name = text_field(rec, "name")
    if rec.get("input_file") or rec.get("output_file"):
        raise Skip("reads or writes named files (input_file/output_file), not stdin/stdout")
    inputs, outputs = [], []
    for field in TEST_FIELDS:
        block = rec.get(field) or {}
        inputs += list(block.get("input") or [])
        outputs += list(block.get("output") or [])
    tests = stdio_tests(capped(inputs, opts.max_tests), capped(outputs, opts.max_tests), 0)
    lang = opts.language
    out = {"prompt": program_prompt(text_field(rec, "description"), lang), "language": lang,
           "tests": tests, "difficulty": _enum(rec.get("difficulty"), DIFFICULTIES),
           "solution": _solution(rec.get("solutions"), lang), "source": "codecontests",
           "platform": _enum(rec.get("source"), SOURCES), "name": name}
    for key in ("cf_rating", "cf_tags"):
        if rec.get(key):
            out[key] = rec[key]
    return out


def _enum(value: Any, names: tuple[str, ...]) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return value if isinstance(value, str) and value else None


def _solution(solutions: Any, language: str) -> str | None:
    if not isinstance(solutions, dict):
        return None
    wanted = SOLUTION_LANGUAGES[language]
    pairs = zip(solutions.get("language") or [], solutions.get("solution") or [], strict=False)
    return next((s for lang, s in pairs if lang in wanted and s), None)
