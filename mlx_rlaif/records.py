"""The records that flow through a step: Task -> Rollout -> Reward.

`extract_code` pulls the code out of a completion's text (every reward and the dataset records
use it): the first fenced block of the task's language, else the first fence, else the whole
text. Not covered: several files in one answer.

Naming of ragged lists: a suffix `_P` is one entry per prompt, `_G` one per completion of a group,
`_PG` one per completion of the whole batch, flattened prompt-major (index p * G + g).

Not covered here: batching into arrays (backends/batch.py) and scoring (rewards/).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One prompt to train or evaluate on.

    `prompt` is the user message (or, for HumanEval-style records, the code to complete).
    Tests, all optional (see rewards/exec.py and docs/task-formats.md):
    - `test` + `entry_point`: HumanEval style, `test` defines `check(candidate)`;
    - `tests` with `{"args": [...], "expected": ...}` items: calls of `entry_point`;
    - `tests` with `{"stdin": "...", "stdout": "..."}` items: whole programs.
    `entry_point` may name a method as `Class.method` (LeetCode style: called on one `Class()`).
    `preamble` is Python put before the student's program (the imports a set's own checker
    provides, e.g. APPS's and LiveCodeBench's).
    """

    id: str
    prompt: str
    language: str = "python"
    entry_point: str | None = None
    test: str | None = None
    tests: tuple[Mapping[str, Any], ...] = ()
    difficulty: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    preamble: str = ""


@dataclass(frozen=True)
class Turn:
    """One answer of a multi-turn conversation and what followed it: the feedback the student
    was shown (empty after the last answer) and whether the visible tests passed."""

    text: str
    feedback: str = ""
    passed: bool | None = None


@dataclass(frozen=True)
class Rollout:
    """One sampled completion of one task (or, with several turns, one conversation).

    `logprobs[i]` is the sampler's log-probability of `tokens[i]` at temperature `temperature`
    (the full tempered distribution, before top-p/top-k truncation). In a conversation `tokens`
    holds every answer and the feedback turns between them; `mask[i]` is 1 for the student's
    tokens and 0 for feedback (whose log-probs are 0 and never trained on); `text` is the last
    answer, `turns` each answer with its feedback. `mask` None: every token is the student's.
    `behind`: the optimizer updates made since the weights that sampled it (0: sampled this
    step; a group carried by dynamic sampling: its age), so the sampler/trainer agreement is
    measured only where the sampler's weights are the trainer's.
    """

    task: Task
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str  # "stop" | "length"
    temperature: float
    mask: tuple[int, ...] | None = None
    turns: tuple[Turn, ...] = ()
    behind: int = 0

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def trained_tokens(self) -> int:
        """How many of `tokens` are the student's."""
        return len(self.tokens) if self.mask is None else int(sum(self.mask))


@dataclass(frozen=True)
class Reward:
    """The score of one completion.

    `value` is None when the completion could not be scored (our sandbox failed, the judge
    errored or answered out of range): it is left out of baselines and gets advantage 0.
    It is never silently turned into 0.0. `parts` holds the named components (each a number or
    None); `reason` is a short human-readable why; `details` holds structured extras (per-test
    breakdown, judge rationale, teacher code).
    """

    value: float | None
    parts: Mapping[str, float | None] = field(default_factory=dict)
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


def group_indices(task_ids_PG: Sequence[str]) -> dict[str, list[int]]:
    """Indices of each group, keyed by task id (never by position), in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, tid in enumerate(task_ids_PG):
        groups.setdefault(tid, []).append(i)
    return groups


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_ALIASES = {
    "python": {"python", "py", "python3"},
    "cpp": {"cpp", "c++", "cxx", "cc"},
    "rust": {"rust", "rs"},
}


def extract_code(completion: str, language: str) -> str:
    """The code in `completion`: the first fence tagged with `language`, else the first fence,
    else the whole text."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return completion.strip("\n")
    names = _ALIASES.get(language, {language})
    for tag, body in blocks:
        if tag.lower() in names:
            return body.strip("\n")
    return blocks[0][1].strip("\n")
