"""Groups of scored completions kept from one step for the next (dynamic sampling), and their
JSON form in a checkpoint (`carry.json`), so a resumed run uses the same groups.

Not covered: anything but the records themselves (tasks are referred to by id and looked up in
the run's tasks on resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..records import Reward, Rollout, Task, Turn


@dataclass(frozen=True)
class Group:
    """The G scored completions of one prompt, and the policy version they were sampled from."""

    rollouts: list[Rollout]
    rewards: list[Reward]
    version: int

    @property
    def has_signal(self) -> bool:
        values = [r.value for r in self.rewards if r.value is not None]
        return len(values) >= 2 and max(values) > min(values)


def carry_state(groups: list[Group]) -> list[dict[str, Any]]:
    """The carried groups as JSON (tasks by id)."""
    return [{"version": g.version, "rollouts": [_rollout_json(r) for r in g.rollouts],
             "rewards": [{"value": w.value, "parts": dict(w.parts), "reason": w.reason,
                          "details": _jsonable(w.details)} for w in g.rewards]}
            for g in groups]


def restore_carry(state: list[dict[str, Any]], tasks: dict[str, Task]) -> list[Group]:
    """Carried groups back from `carry_state`; groups whose task is gone are dropped."""
    out = []
    for g in state:
        rollouts = [_rollout(r, tasks) for r in g["rollouts"]]
        if any(r is None for r in rollouts):
            continue
        rewards = [Reward(w["value"], w["parts"], w["reason"], w["details"])
                   for w in g["rewards"]]
        out.append(Group(rollouts, rewards, int(g["version"])))
    return out


def _rollout_json(r: Rollout) -> dict[str, Any]:
    return {"task": r.task.id, "prompt": list(r.prompt_tokens), "tokens": list(r.tokens),
            "logprobs": list(r.logprobs), "text": r.text, "finish": r.finish_reason,
            "temperature": r.temperature, "mask": list(r.mask) if r.mask else None,
            "turns": [[t.text, t.feedback, t.passed] for t in r.turns]}


def _rollout(d: dict[str, Any], tasks: dict[str, Task]) -> Rollout | None:
    task = tasks.get(d["task"])
    if task is None:
        return None
    return Rollout(task, tuple(d["prompt"]), tuple(d["tokens"]), tuple(d["logprobs"]), d["text"],
                   d["finish"], d["temperature"], tuple(d["mask"]) if d["mask"] else None,
                   tuple(Turn(*t) for t in d["turns"]))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x if isinstance(x, (str, int, float, bool)) or x is None else str(x)
