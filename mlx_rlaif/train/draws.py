"""A step's groups are its draws: the G completions sampled for one prompt drawn, never every
completion of a task. A task drawn twice in one step (a small curriculum bucket, an epoch
boundary, a dynamic-sampling round that draws it again, a carried group of it) is two groups:
two baselines, two entries in dynamic sampling's group count, two chances of a reference answer
(rl.guidance), and a teacher that judges a group's completions together sees each draw alone.

Every backend returns a batch prompt-major, a draw's completions one after the other
(`backends.ops`: sample and converse), so `draw_indices` reads the draws off a batch as it comes
from the sampler; from there on a group travels as a `carry.Group` (dynamic sampling, the
carry) or under its key (`keys`: the advantages). Preventing repeated draws instead would change
the task order (a redraw) and is impossible with fewer tasks than prompts a step.

Not covered: sharing the prompt's forward pass in the update (backends/mlx/update.py keys it
by prompt tokens: a computation shared, exact whichever draw a row belongs to).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..records import Reward, Rollout, Task
from .carry import Group

T = TypeVar("T")


def draw_indices(task_ids: Sequence[str], size: int) -> list[list[int]]:
    """Indices of each draw in a prompt-major batch: a new draw where the task changes or where
    `size` (G) completions of the current one are in."""
    out: list[list[int]] = []
    for i, tid in enumerate(task_ids):
        if not out or task_ids[out[-1][0]] != tid or len(out[-1]) == size:
            out.append([])
        out[-1].append(i)
    return out


def groups_of(rollouts: list[Rollout], rewards: list[Reward], version: int, size: int
              ) -> list[Group]:
    """The draws of a prompt-major batch as groups, sampled at policy version `version`."""
    return [Group([rollouts[i] for i in ix], [rewards[i] for i in ix], version)
            for ix in draw_indices([r.task.id for r in rollouts], size)]


def flatten(groups: Sequence[Group]) -> tuple[list[Rollout], list[Reward], list[str]]:
    """The groups' rollouts and rewards in order, and each one's group key (one per draw)."""
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = [w for g in groups for w in g.rewards]
    keys = [f"{g.rollouts[0].task.id}#{k}" for k, g in enumerate(groups) for _ in g.rollouts]
    return rollouts, rewards, keys


def apart(tasks: Sequence[Task], items: Sequence[T], size: int,
          score: Callable[[list[Task], list[T]], list[Reward]]) -> list[Reward]:
    """`score(tasks, items)` of a prompt-major batch, called once per layer of its draws such that
    no task has two draws in one call (a judge that ranks a task's completions together sees
    each draw alone); one call when no task is drawn twice."""
    layers: list[list[int]] = []
    seen: list[set[str]] = []
    for ix in draw_indices([t.id for t in tasks], size):
        tid = tasks[ix[0]].id
        k = next((k for k, s in enumerate(seen) if tid not in s), len(seen))
        if k == len(seen):
            seen.append(set())
            layers.append([])
        seen[k].add(tid)
        layers[k] += ix
    out: list[Reward | None] = [None] * len(tasks)
    for layer in layers:
        for i, w in zip(layer, score([tasks[i] for i in layer], [items[i] for i in layer]),
                        strict=True):
            out[i] = w
    return out  # type: ignore[return-value]
