"""DAPO's soft overlong penalty (algo/overlong.py, train/step.py): by hand, its order with
rl.mask_truncated, the test for signal reading the unshaped reward, and the config checks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mlx_rlaif.algo.overlong import penalty, shape
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.train import step
from mlx_rlaif.train.carry import Group
from mlx_rlaif.train.distributed import World

ON = ["generation.max_new_tokens=64", "rl.overlong_penalty=0.5", "rl.overlong_buffer=16"]


def test_penalty_by_hand():
    """Limit 64, buffer 16, P 0.5: nothing up to 48 tokens, then 0.5 (L - 48) / 16."""
    assert [penalty(n, 64, 16, 0.5) for n in (10, 48, 52, 56, 64)] == [0.0, 0.0, 0.125, 0.25, 0.5]
    assert penalty(64, 64, 16, 0.0) == 0.0
    assert shape([1.0, None, 0.0], [56, 64, 30], 64, 16, 0.5) == [0.75, None, 0.0]


def _rollout(task: str, n: int, finish: str = "stop") -> Rollout:
    return Rollout(Task(task, "p"), (1, 2), tuple(range(3, 3 + n)), (-1.0,) * n, "", finish, 1.0)


def _run(sets: list[str]) -> SimpleNamespace:
    return SimpleNamespace(cfg=load(None, sets), ops=None, world=World(),
                           state=SimpleNamespace(reinforce_baseline=None))


def test_length_alone_is_not_signal():
    """A group whose answers all fail, at lengths 20, 52 and 60: shaped, its rewards differ
    (0, -0.125, -0.375), but dynamic sampling's and drop_zero_std's test reads the unshaped
    ones: no signal, left out of the loss. The other group passes/fails and keeps its shaped
    advantages."""
    fails = [_rollout("a", n) for n in (20, 52, 60)]
    mixed = [_rollout("b", n) for n in (20, 56, 30)]
    scores = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert not Group(fails, [Reward(0.0)] * 3, 0).has_signal
    run = _run(ON)
    assert step.shaped(run.cfg, fails, [0.0] * 3) == [0.0, -0.125, -0.375]
    t = step.group_targets(run, fails + mixed, scores, 0.0, keys(fails + mixed))
    assert t.keep == [3, 4, 5] and t.summary.frac_zero_std == 0.5
    r = np.array([1.0, 0.75, 0.0])  # the mixed group shaped
    np.testing.assert_allclose(t.adv, (r - r.mean()) / (r.std() + 1e-6))
    assert step.overlong_metrics(run.cfg, fails + mixed) == {
        "reward/overlong_penalty": pytest.approx((0.125 + 0.375 + 0.25) / 6)}


def test_shaping_comes_before_mask_truncated():
    """A passing answer cut at the limit gets the whole penalty (1 -> 0.5) and counts so in its
    group's baseline, then mask_truncated leaves it out of the loss: baseline of [1, 0.5, 0]
    is 0.5, std 0.408; the short pass gets 0.5 / 0.408 = 1.2247."""
    rollouts = [_rollout("a", 10), _rollout("a", 64, "length"), _rollout("a", 12)]
    t = step.group_targets(_run([*ON, "rl.mask_truncated=true"]), rollouts, [1.0, 1.0, 0.0], 0.0,
                           keys(rollouts))
    assert t.keep == [0, 2]
    std = np.std([1.0, 0.5, 0.0]) + 1e-6
    np.testing.assert_allclose(t.adv, [0.5 / std, -0.5 / std])


def keys(rollouts: list[Rollout]) -> list[str]:
    return [r.task.id for r in rollouts]  # each task drawn once: a group per task


def test_the_kl_in_the_reward_is_taken_from_the_shaped_reward():
    """With rl.kl_in_reward the reward less the KL starts from the shaped reward (a reference
    equal to the sampler: k1 = 0, so the advantages are the shaped ones, as without the KL)."""
    rollouts = [_rollout("a", 10), _rollout("a", 64, "length"), _rollout("a", 12)]
    run = _run([*ON, "rl.kl_in_reward=true"])
    run.ops = SimpleNamespace(reference=lambda policy, rs, cfg: [np.asarray(r.logprobs)
                                                                  for r in rs])
    run.policy = None
    t = step.group_targets(run, rollouts, [1.0, 1.0, 0.0], 0.1, keys(rollouts))
    r = np.array([1.0, 0.5, 0.0])
    np.testing.assert_allclose(t.adv, (r - r.mean()) / (r.std() + 1e-6))


def test_off_leaves_the_rewards_alone():
    run = _run([])
    rollouts = [_rollout("a", 64, "length"), _rollout("a", 3)]
    assert step.shaped(run.cfg, rollouts, [1.0, 0.0]) == [1.0, 0.0]
    assert step.overlong_metrics(run.cfg, rollouts) == {}


@pytest.mark.parametrize("sets, message", [
    (["rl.overlong_penalty=0.5"], "rl.overlong_buffer between 1 and"),
    (["rl.overlong_penalty=0.5", "rl.overlong_buffer=600"], "rl.overlong_buffer between 1 and"),
    (["rl.overlong_penalty=0.5", "rl.overlong_buffer=16", "generation.max_turns=2"],
     "set generation.max_turns to 1"),
])
def test_config_refuses_what_it_cannot_shape(sets, message):
    with pytest.raises(ConfigError, match=message):
        check(load(None, sets))
    check(load(None, ON))
