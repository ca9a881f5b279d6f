"""Multi-turn rollouts with execution feedback (`generation.max_turns > 1`): the student answers,
the exec reward runs the task's visible tests, a failure report goes back as the next user turn,
the student answers again, until the visible tests pass or max_turns answers; the last answer is
scored on the hidden tests.

The backend decodes every open conversation of a step together, each continuing its own KV
cache (`backends.mlx.rollout.sample_conversations`); this module gives it the next turns
(`responder`): the tests split into visible and hidden ones (`split_tests`; feedback that shows
the values the final score checks would teach `if x == 3: return 7`), the trusted feedback text
(`rewards/exec/feedback.py`) through the chat template, and the credit of a conversation
(`shape`: a per-turn discount, a bonus for passing early).

Not covered: tool calls other than running the tests, feedback from a teacher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..backends.sampling import Reply, feedback_tokens
from ..records import Reward, Rollout, Task
from ..rewards.exec.feedback import feedback_text


def split_tests(task: Task, visible: float) -> tuple[Task, Task]:
    """(the task with its visible tests, the task with its hidden ones): the first
    round(visible * n) tests, at least one, and at least one left hidden. A task with one test,
    or HumanEval-style checks, is the same task on both sides."""
    n = len(task.tests)
    if n < 2:
        return task, task
    k = min(n - 1, max(1, round(visible * n)))
    return replace(task, tests=task.tests[:k]), replace(task, tests=task.tests[k:])


def exec_scorer(reward_fn: Any) -> Any:
    """The exec reward inside `reward_fn` (itself, or the `exec` part of a mix)."""
    if getattr(reward_fn, "name", "") == "exec":
        return reward_fn
    for fn, _ in getattr(reward_fn, "parts", ()):
        if getattr(fn, "name", "") == "exec":
            return fn
    raise ValueError("multi-turn feedback needs the exec reward (reward.type exec or mix)")


def all_passed(reward: Reward) -> bool:
    tests = reward.details.get("tests")
    return bool(tests) and all(t.get("passed") for t in tests)


def responder(reward_fn: Any, tokenizer: Any, gen: Any, chat_template: bool
              ) -> Callable[[int, list[Rollout]], list[Reply]]:
    """The backend's `respond(turn, rollouts)`: each open conversation's last answer run on the
    visible tests; a pass (or an unscorable answer) ends it, a failure gets the report."""
    scorer = exec_scorer(reward_fn)
    eos = getattr(tokenizer, "eos_token_id", None)

    def respond(turn: int, rollouts: list[Rollout]) -> list[Reply]:
        visible = [split_tests(r.task, gen.visible_tests)[0] for r in rollouts]
        # every visible test's report, even where tests_credit: all stops at the first failure
        verdicts = scorer.score(visible, [r.text for r in rollouts], every_test=True)
        replies = []
        for task, v in zip(visible, verdicts, strict=True):
            passed = v.value is not None and all_passed(v)
            if passed or v.value is None:
                replies.append(Reply(None, "", passed if v.value is not None else None))
                continue
            text = feedback_text(task, v, gen.feedback_chars)
            replies.append(Reply(feedback_tokens(tokenizer, text, eos, chat_template), text,
                                 False))
        return replies

    return respond


def hidden_tasks(rollouts: list[Rollout], visible: float) -> list[Task]:
    """The tasks the last answers are scored on: their hidden tests."""
    return [split_tests(r.task, visible)[1] for r in rollouts]


def shape(rewards: list[Reward], rollouts: list[Rollout], max_turns: int, discount: float,
          bonus: float) -> list[Reward]:
    """The conversation's reward: the last answer's, times discount ** (answers - 1), plus
    `bonus` times the share of turns left unused when it passed."""
    out = []
    for rw, r in zip(rewards, rollouts, strict=True):
        if rw.value is None:
            out.append(rw)
            continue
        used = max(len(r.turns), 1)
        value = rw.value * discount ** (used - 1)
        if bonus and all_passed(rw) and max_turns > 1:
            value += bonus * (max_turns - used) / (max_turns - 1)
        out.append(replace(rw, value=value))
    return out


def turn_metrics(rollouts: list[Rollout], rewards: list[Reward]) -> dict[str, float]:
    """`turns/mean` answers per conversation; `turns/pass_at_K`: the share of conversations
    passing after answer K (the visible tests for answers that got feedback, the hidden ones for
    the last)."""
    n = len(rollouts)
    longest = max((len(r.turns) for r in rollouts), default=1)
    out = {"turns/mean": sum(len(r.turns) for r in rollouts) / max(n, 1)}
    for k in range(1, longest + 1):
        ok = 0
        for r, rw in zip(rollouts, rewards, strict=True):
            done = len(r.turns) <= k  # answered by turn k: its last answer is the final one
            ok += all_passed(rw) if done else bool(r.turns[k - 1].passed)
        out[f"turns/pass_at_{k}"] = ok / max(n, 1)
    return out
