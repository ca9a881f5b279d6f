"""What a student is told after a failed answer, in a multi-turn rollout: built by trusted code
from the verdict's data and the task's own (visible) tests.

For each failing test: the call and the value it should return (function tests) or the input and
the expected output (programs), the reason (wrong answer, crash, timeout, build error) and, for
a wrong function result, the value the function returned as the trusted harness rendered it
(plain data, truncated). Nothing the student printed, and no exception message it wrote, is ever
copied in: output and tracebacks are the student's free text, where a forged "all tests passed"
could live; a crash names only the exception's type. The text is cut to `max_chars`.

Not covered: HumanEval-style `check` tests beyond naming the failing assertion's index (their
expected values live inside the check's code).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...records import Reward, Task
from .tasks import short

_TYPE = re.compile(r"[^A-Za-z0-9_.]")


def feedback_text(task: Task, reward: Reward, max_chars: int = 600) -> str:
    """The next user turn for an answer that failed `task`'s (visible) tests."""
    tests = list(reward.details.get("tests") or [])
    failed = [(i, r) for i, r in enumerate(tests) if not r.get("passed")]
    if reward.details.get("build_log") is not None or any(
            r.get("reason") == "build_error" for _, r in failed):
        head = "Your code does not build (a syntax or compile error)."
    else:
        head = f"Your code failed {len(failed)} of {len(tests)} tests:"
    lines = [head] + [_line(task, i, r) for i, r in failed if r.get("reason") != "build_error"]
    lines.append("Fix the code and answer with the whole corrected solution.")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _line(task: Task, i: int, verdict: Mapping[str, Any]) -> str:
    test = task.tests[i] if i < len(task.tests) else None
    why = _reason(verdict)
    if isinstance(test, Mapping) and "args" in test:
        args = test["args"] if isinstance(test["args"], list) else [test["args"]]
        call = f"{task.entry_point}({', '.join(short(a) for a in args)})"
        got = f", got {verdict['got']}" if verdict.get("got") else ""
        return f"- {call} should return {short(test['expected'])}{got}{why}"
    if isinstance(test, Mapping) and "stdin" in test:
        return (f"- with input {short(test['stdin'])} the output should be "
                f"{short(test.get('stdout', ''))}{why}")
    return f"- assertion {i + 1} of the tests failed{why}"


def _reason(verdict: Mapping[str, Any]) -> str:
    reason = verdict.get("reason")
    if reason == "crash":
        raised = _TYPE.sub("", str(verdict.get("raised") or ""))[:40]
        return f" (it raised {raised})" if raised else " (it crashed)"
    if reason == "timeout":
        return " (it timed out)"
    return ""
