"""Dynamic sampling's limits: a group of one (refused: DAPO's filter is defined on a group's
reward variance) and the age of a carried group counted in optimizer updates, as
`rl.carry_max_age` is documented, not in steps (each step makes `rl.num_iterations`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.train.carry import Group
from mlx_rlaif.train.distributed import World
from mlx_rlaif.train.dynamic import collect


def test_dynamic_sampling_with_groups_of_one_is_refused():
    """With a critic a group of one is allowed, but a singleton's rewards never vary, so
    dynamic sampling would discard every group (train/sequences 0, reward/mean NaN)."""
    with pytest.raises(ConfigError, match="rl.dynamic_sampling") as e:
        check(load(None, ["rl.advantage=gae", "generation.num_samples_per_prompt=1",
                          "rl.dynamic_sampling=true"]))
    assert "num_samples_per_prompt" in str(e.value) and "\n" not in str(e.value)
    check(load(None, ["rl.advantage=gae", "generation.num_samples_per_prompt=1"]))
    check(load(None, ["rl.advantage=gae", "generation.num_samples_per_prompt=2",
                      "rl.dynamic_sampling=true"]))


def _group(task_id: str, values: list[float], version: int) -> Group:
    task = Task(task_id, f"p {task_id}")
    rs = [Rollout(task, (1,), (2,), (0.0,), "x", "stop", 1.0) for _ in values]
    return Group(rs, [Reward(v) for v in values], version)


def _collect(num_iterations: int, carry_max_age: int, carried: Group):
    """One step (step 5) that needs one group, with `carried` in the carry and fresh groups
    with signal from the sampler."""
    cfg = load(None, ["rl.dynamic_sampling=true", f"rl.num_iterations={num_iterations}",
                      f"rl.carry_max_age={carry_max_age}"])
    run = SimpleNamespace(cfg=cfg, state=SimpleNamespace(step=5), carry=[carried],
                          world=World())
    fresh = iter(range(100))

    def draw(n):
        return [Task(f"new{next(fresh)}", "p") for _ in range(n)]

    def sample(tasks, first):
        rs = [Rollout(t, (1,), (2,), (0.0,), "x", "stop", 1.0) for t in tasks for _ in (0, 1)]
        return rs, [Reward(float(i % 2)) for i in range(len(rs))], {}

    used, _, m = collect(run, 1, draw, sample)
    return used, m


def test_carried_group_age_counts_updates_not_steps():
    """Sampled at step 4, used at step 5: one step, num_iterations updates. With 4 updates a
    step and carry_max_age 1 the group is 4 updates old and must be dropped."""
    carried = _group("old", [0.0, 1.0], version=4)
    used, m = _collect(4, 1, carried)
    assert [g.rollouts[0].task.id for g in used] != ["old"]
    assert m["sample/carried_dropped"] == 1 and m["sample/carried_used"] == 0
    used, m = _collect(4, 4, carried)  # 4 updates old, allowed 4: used
    assert [g.rollouts[0].task.id for g in used] == ["old"] and m["sample/carried_used"] == 1
    used, m = _collect(1, 1, carried)  # one update a step: as before
    assert [g.rollouts[0].task.id for g in used] == ["old"] and m["sample/carried_dropped"] == 0
