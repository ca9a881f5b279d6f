"""Advantages against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_rlaif.algo.advantages import EPS, compute


def test_grpo_group_std_and_zero_variance_groups():
    adv = compute([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], "grpo", "group")
    # group a: mean 0.5, std 0.5 -> +-0.5 / (0.5 + eps); group b: zero variance
    np.testing.assert_allclose(adv.values, [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0, 0])
    assert adv.frac_zero_std == 0.5
    assert adv.keep.tolist() == [True, True, False, False]


def test_zero_std_groups_kept_when_asked():
    adv = compute([0.5, 0.5], ["b", "b"], drop_zero_std=False)
    assert adv.keep.tolist() == [True, True] and adv.values.tolist() == [0.0, 0.0]


def test_groups_are_keyed_by_task_id_not_position():
    adv = compute([1.0, 0.5, 0.0, 0.5], ["a", "b", "a", "b"], "grpo", "none")
    np.testing.assert_allclose(adv.values, [0.5, 0.0, -0.5, 0.0])
    assert adv.keep.tolist() == [True, False, True, False]


def test_rloo_leave_one_out():
    adv = compute([1.0, 0.0, 0.5], ["a"] * 3, "rloo", "none")
    # 1 - (0 + .5)/2 = .75 ; 0 - (1 + .5)/2 = -.75 ; .5 - (1 + 0)/2 = 0
    np.testing.assert_allclose(adv.values, [0.75, -0.75, 0.0])


def test_none_reward_is_left_out_and_gets_zero():
    adv = compute([1.0, None, 0.0], ["a"] * 3, "grpo", "none")
    np.testing.assert_allclose(adv.values, [0.5, 0.0, -0.5])
    assert adv.keep.tolist() == [True, False, True]
    assert adv.valid.tolist() == [True, False, True]


def test_single_valid_reward_in_group_is_zero_variance():
    adv = compute([1.0, None], ["a", "a"])
    assert adv.values.tolist() == [0.0, 0.0] and adv.frac_zero_std == 1.0


def test_batch_scale():
    r = [1.0, 0.0, 1.0, 1.0]
    adv = compute(r, ["a", "a", "b", "b"], "grpo", "batch", drop_zero_std=False)
    std = np.std(r)  # 0.4330
    np.testing.assert_allclose(adv.values, [0.5 / (std + EPS), -0.5 / (std + EPS), 0, 0])


def test_reinforce_running_baseline():
    first = compute([1.0, 0.0], ["a", "b"], "reinforce", "none")
    np.testing.assert_allclose(first.values, [0.5, -0.5])
    assert first.baseline == pytest.approx(0.5)
    second = compute([1.0, 1.0], ["a", "b"], "reinforce", "none", baseline=0.5, decay=0.9)
    np.testing.assert_allclose(second.values, [0.5, 0.5])
    assert second.baseline == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    assert second.keep.all()  # reinforce's baseline is not the group's: no zero-std drop


def test_whiten():
    adv = compute([1.0, 0.0, 1.0, 0.5], ["a", "a", "b", "b"], "grpo", "none", whiten=True)
    a = adv.values
    assert a.mean() == pytest.approx(0.0, abs=1e-9)
    assert a.std() == pytest.approx(1.0, abs=1e-4)


def test_reinforce_with_group_scaling_is_refused():
    """The old code divided [1, 1, 0, 1] (baseline 0.5) by each group's std: [5e5, 5e5, -1, 1]."""
    with pytest.raises(ValueError, match="scale batch or none"):
        compute([1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"], "reinforce", "group", baseline=0.5)
    adv = compute([1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"], "reinforce", "batch", baseline=0.5)
    std = np.std([1.0, 1.0, 0.0, 1.0])  # 0.4330
    np.testing.assert_allclose(adv.values, np.array([0.5, 0.5, -0.5, 0.5]) / (std + EPS))


def test_kl_noise_does_not_lift_a_tied_group_out_of_zero_variance():
    """Task rewards tied in group a ([1, 1]); KL in the reward makes them 0.99 and 0.97. The
    group is still zero-variance: counted, dropped, and (when kept) not scaled by the noise's
    std (the old code gave it +-1)."""
    shaped, task = [0.99, 0.97, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]
    ids = ["a", "a", "b", "b"]
    adv = compute(shaped, ids, "grpo", "group", task_rewards=task)
    assert adv.frac_zero_std == 0.5 and adv.keep.tolist() == [False, False, True, True]
    kept = compute(shaped, ids, "grpo", "group", drop_zero_std=False, task_rewards=task)
    np.testing.assert_allclose(kept.values[:2], [0.01, -0.01], atol=1e-12)  # unscaled
    np.testing.assert_allclose(kept.values[2:], [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])
