"""Advantages per sequence from rewards, grouped by the caller's group keys: one group per
prompt drawn (the train step keys its draws, so a task drawn twice in a step is two groups;
task ids where each task is drawn once).

    grpo       A_i = r_i - mean(r_group)
    rloo       A_i = r_i - mean(r_group without i)
    reinforce  A_i = r_i - b, b a running mean of batch rewards (EMA, decay d)

then optionally divided by the group's std (`scale: group`), the batch's std (`batch`) or nothing
(`none`, Dr. GRPO), and optionally whitened over the batch. Stds are population stds (ddof=0)
plus 1e-6. A `None` reward (unscorable) is left out of every mean and std and gets advantage 0,
and its sequence is left out of the loss.

A group whose task rewards are all equal (or has fewer than two valid ones) carries no signal:
it is counted (`reward/frac_zero_std`) and, by default, left out of the loss. "Task rewards"
are the scores before any KL shaping (`task_rewards`): with the KL in the reward, KL noise
separates tied scores, and such a group must neither escape the count nor, when kept, have
that noise divided by its own tiny std (a kept zero-variance group is never std-scaled).

`reinforce` has no group baseline, so dividing by a group's std is undefined for it (a group of
equal rewards would get advantages of 1e6): that combination is refused; verl's REINFORCE++
normalizes over the batch (`scale: batch`, or `whiten`).

With several ranks (data parallel), each rank holds whole groups, so group baselines and group
stds need no communication; the batch statistics (`scale: batch`, `whiten`, the reinforce
baseline) are the whole batch's when the caller passes `reduce`, a sum over the ranks
(`batch_moments`).

Not covered: per-token advantages (GAE needs a value model: gae.py), tree rollouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..records import group_indices

EPS = 1e-6
Reduce = Callable[[np.ndarray], np.ndarray]  # a float64 vector summed over the ranks


@dataclass(frozen=True)
class Advantages:
    values: np.ndarray  # [N] float64
    keep: np.ndarray  # [N] bool: sequence enters the loss
    zero_std: np.ndarray  # [N] bool: sequence belongs to a zero-variance group
    valid: np.ndarray  # [N] bool: reward is not None
    baseline: float | None  # the reinforce running baseline after this batch

    @property
    def frac_zero_std(self) -> float:
        return float(self.zero_std.mean()) if len(self.zero_std) else 0.0


def _as_array(rewards: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    valid = np.array([r is not None for r in rewards], dtype=bool)
    r = np.array([0.0 if x is None else float(x) for x in rewards], dtype=np.float64)
    return r, valid


def compute(rewards: Sequence[float | None], group_keys: Sequence[str], kind: str = "grpo",
            scale: str = "group", whiten: bool = False, drop_zero_std: bool = True,
            baseline: float | None = None, decay: float = 0.9,
            task_rewards: Sequence[float | None] | None = None,
            reduce: Reduce | None = None) -> Advantages:
    """Advantages of `rewards` (shaped, e.g. minus a KL term) grouped by `group_keys`; zero-variance
    groups are found on `task_rewards` (the unshaped scores; default: `rewards`). `reduce`:
    with several ranks, the sum over them, so the batch statistics are the whole batch's (every
    rank calls it the same number of times, whatever its rewards; None: one process)."""
    if kind == "reinforce" and scale == "group":
        raise ValueError("advantage reinforce with scale group: a group's std is undefined "
                         "without a group baseline: use scale batch or none")
    r, valid = _as_array(rewards)
    task = r if task_rewards is None else _as_array(task_rewards)[0]
    adv = np.zeros_like(r)
    zero = np.zeros_like(valid)
    new_baseline = baseline
    groups = [np.array(ix) for ix in group_indices(group_keys).values()]
    for ix in groups:
        v = ix[valid[ix]]
        if len(v) < 2 or np.ptp(task[v]) == 0:
            zero[ix] = True
    if kind == "reinforce":
        n, mean, _ = batch_moments(r[valid], reduce, std=False)
        batch_mean = mean if n else None
        b = batch_mean if baseline is None else baseline
        if b is not None:
            adv[valid] = r[valid] - b
        if batch_mean is not None:
            new_baseline = batch_mean if baseline is None else decay * baseline + (
                1 - decay) * batch_mean
    else:
        for ix in groups:
            v = ix[valid[ix]]
            if len(v) >= 2:
                adv[v] = _centered(r[v], kind)
    if scale == "group":
        for ix in groups:
            v = ix[valid[ix]]
            if len(v) >= 2 and not zero[ix[0]]:
                adv[v] /= r[v].std() + EPS
    elif scale == "batch":
        n, _, std = batch_moments(r[valid], reduce)
        if n >= 2:
            adv[valid] /= std + EPS
    # reinforce's baseline is not the group's, so an equal-reward group still carries signal
    drop = drop_zero_std and kind != "reinforce"
    keep = valid & ~zero if drop else valid.copy()
    adv[~valid] = 0.0
    if whiten:
        n, mean, std = batch_moments(adv[keep], reduce)
        if n >= 2:
            adv[keep] = (adv[keep] - mean) / (std + EPS)
    return Advantages(adv, keep, zero, valid, new_baseline)


def batch_moments(x: np.ndarray, reduce: Reduce | None = None, std: bool = True
                  ) -> tuple[float, float, float]:
    """(count, mean, population std) of `x`, or with `reduce` (a sum over the ranks) of every
    rank's `x` together, in two passes as numpy's mean and std (the second skipped when `std`
    is False). Empty: (0, 0.0, 0.0)."""
    if reduce is None:
        if not len(x):
            return 0.0, 0.0, 0.0
        return float(len(x)), float(x.mean()), float(x.std()) if std else 0.0
    n, total = reduce(np.array([len(x), x.sum()], dtype=np.float64))
    mean = total / n if n else 0.0
    if not std:
        return float(n), float(mean), 0.0
    (squares,) = reduce(np.array([((x - mean) ** 2).sum()], dtype=np.float64))
    return float(n), float(mean), float(np.sqrt(squares / n)) if n else 0.0


def _centered(r: np.ndarray, kind: str) -> np.ndarray:
    if kind == "rloo":
        n = len(r)
        return r - (r.sum() - r) / (n - 1)
    return r - r.mean()
