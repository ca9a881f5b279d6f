"""Dynamic sampling (DAPO's; the rollout infrastructure's over-sampling with filters and
leftovers): a step needs P groups whose rewards vary, since a group whose completions all score
the same carries no signal. With `rl.dynamic_sampling` a step samples more prompts than it
needs (`rl.oversample` times the shortfall), keeps the groups with signal, samples again (at
most `rl.max_extra_rounds` more rounds) while it has fewer than P, trains on P of them and
carries the rest, finished and scored, to the next step. A carried group is marked with the
policy version (step) it was sampled from and is used only while at most `rl.carry_max_age`
optimizer updates old (by default `rl.num_iterations`: one step) when its step begins (`age`: each step makes `rl.num_iterations`
updates, so a group carried one step is that many updates old), so its recorded log-probs
still make a valid clipped importance ratio; older ones are dropped and counted. The updates
are what move the policy away from the sampler's log-probs: counting steps would let a group
carried with num_iterations 4 be four times as stale as the setting says.

Works with any reward (exec, teacher, mix): a group's signal is read from its scores. A group
is one draw (draws.py): a task drawn in two rounds, or again while a group of it is carried, is
two groups, each counted and kept on its own.

With several ranks (data parallel) every rank draws the same tasks, samples its share of them,
and the groups are exchanged (`every_rank`), so every rank holds the same pool and the same
carried groups, makes the same decisions and trains on its share of the groups used.

Not covered: asynchronous sampling (the rounds run inside the step), sample reuse across more
than `carry_max_age` updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ..records import Reward, Rollout, Task
from .carry import Group, carry_state, restore_carry
from .distributed import World
from .draws import groups_of
from .run import Run


def collect(run: Run, need: int, draw: Callable[[int], list[Task]],
            sample: Callable[[list[Task], bool], tuple[list[Rollout], list[Reward], dict]]
            ) -> tuple[list[Group], dict[str, float], dict[str, float]]:
    """`need` groups with signal for this step: carried ones first, then rounds of
    `sample(tasks, first_round)`; the rest carried in `run.carry`. Returns (groups, generation
    stats, dynamic-sampling metrics)."""
    rl, version, world = run.cfg.rl, run.state.step, run.world
    size = run.cfg.generation.num_samples_per_prompt
    oldest = rl.num_iterations if rl.carry_max_age is None else rl.carry_max_age
    fresh = [g for g in run.carry if age(g, version, rl.num_iterations) <= oldest]
    pool, stale = [g for g in fresh if g.has_signal], len(run.carry) - len(fresh)
    gen: dict[str, float] = {}
    rounds = generated = zero = 0
    while len(pool) < need and rounds <= rl.max_extra_rounds:
        tasks = draw(math.ceil((need - len(pool)) * rl.oversample))
        if not tasks:
            break
        rollouts, rewards, stats = sample(world.share(tasks), rounds == 0)
        gen = (stats if not gen else _add(gen, stats)) if stats else gen
        fresh_groups = every_rank(world, groups_of(rollouts, rewards, version, size), tasks)
        pool += [g for g in fresh_groups if g.has_signal]
        zero += sum(not g.has_signal for g in fresh_groups)
        rounds, generated = rounds + 1, generated + sum(len(g.rollouts) for g in fresh_groups)
    used, run.carry = pool[:need], pool[need:]
    metrics = {"sample/rounds": float(rounds), "sample/generations": float(generated),
               "sample/groups_kept": float(len(used)), "sample/groups_zero_std": float(zero),
               "sample/carried_used": float(sum(g.version < version for g in used)),
               "sample/carried_dropped": float(stale),
               "sample/generations_per_kept_group": generated / max(len(used), 1)}
    return [stamped(g, version, rl.num_iterations) for g in world.share(used)], gen, metrics


def stamped(group: Group, step: int, num_iterations: int) -> Group:
    """`group` with each rollout's `behind` (records.Rollout) set to its age at step `step`."""
    n = age(group, step, num_iterations)
    return group if n == 0 else replace(group, rollouts=[replace(r, behind=n)
                                                         for r in group.rollouts])


def age(group: Group, step: int, num_iterations: int) -> int:
    """The optimizer updates made since `group` was sampled, at the start of step `step`."""
    return (step - group.version) * num_iterations


def every_rank(world: World, groups: list[Group], tasks: list[Task]) -> list[Group]:
    """Every rank's groups of one round, in rank order (this rank's: `groups`); one process:
    `groups`."""
    if world.size == 1:
        return groups
    by_id = {t.id: t for t in tasks}
    parts = world.gather(carry_state(groups), "exchange of sampled groups")
    return [g for r, part in enumerate(parts)
            for g in (groups if r == world.rank else restore_carry(part, by_id))]


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    tokens, seconds = a["gen/tokens"] + b["gen/tokens"], a["gen/seconds"] + b["gen/seconds"]
    return {**a, "gen/tokens": tokens, "gen/seconds": seconds,
            "gen/tokens_per_sec": tokens / seconds if seconds > 0 else 0.0,
            "gen/decode_width": max(a["gen/decode_width"], b["gen/decode_width"])}
