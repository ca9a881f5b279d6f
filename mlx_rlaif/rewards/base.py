"""The reward interface, and the one reward that needs neither sandbox nor teacher.

A reward function scores a batch at once (so it can run sandboxes or API calls in parallel) and
returns one Reward per pair, in order. It may keep counters (calls, cost, cache hits) that
`metrics()` reports as plain numbers under its own namespace.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..records import Reward, Task, extract_code


@runtime_checkable
class RewardFn(Protocol):
    name: str

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class SyntaxReward:
    """1.0 when the extracted code parses as Python, 0.0 when it does not.

    Non-Python tasks are unscorable here (None): use the exec reward for C++ and Rust.
    """

    name = "syntax"

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]:
        return [self._one(t, c) for t, c in zip(tasks, completions, strict=True)]

    def _one(self, task: Task, completion: str) -> Reward:
        if task.language != "python":
            return Reward(None, {"parses": None}, f"syntax reward is Python-only, got {task.language}")
        code = extract_code(completion, task.language)
        try:
            ast.parse(code)
        except (SyntaxError, ValueError) as e:
            return Reward(0.0, {"parses": 0.0}, f"syntax error: {e.__class__.__name__}")
        if not code.strip():
            return Reward(0.0, {"parses": 0.0}, "empty completion")
        return Reward(1.0, {"parses": 1.0}, "parses")

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
