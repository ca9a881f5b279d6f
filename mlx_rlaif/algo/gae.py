"""Per-token advantages from a critic: generalized advantage estimation (Schulman et al., 2016),
for `rl.advantage: gae`.

A completion of T tokens is an episode of T actions. The reward is the task's score on the last
token, and, with the KL in the reward, -kl_penalty * k1_t on every token t (k1_t = logp_t -
ref_logp_t). With V_t the critic's value of the state before token t and V_T = 0 after the
last one:

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = sum_l (gamma * lam)^l * delta_{t+l}       (lam = 1: returns minus values;
    R_t     = A_t + V_t                                   lam = 0: one-step TD errors)

R_t is the critic's regression target. Advantages are whitened over every token of the batch
(with several ranks, of every rank's batch: `whiten`'s `reduce`).

The value loss is clipped as in PPO: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2).

A conversation (generation.max_turns > 1) holds feedback tokens between the answers (`mask`
0). They are the environment's, not actions: the episode is the student's tokens only (the
recursion steps from an answer's last token to the next answer's first, the score on the last
student token), and the whitening counts only the student's tokens; a feedback token gets
advantage and return 0 (its weight in the loss is 0 as well).

Not covered: bootstrapping from a value after truncation (a cut completion ends like a finished
one), rewards at intermediate tokens other than the KL term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .advantages import Reduce, batch_moments

EPS = 1e-8


def token_rewards(score: float, length: int, k1: np.ndarray | None = None,
                  kl_penalty: float = 0.0, mask: Sequence[int] | None = None) -> np.ndarray:
    """[T] rewards: the score on the last (student's: `mask`) token, minus kl_penalty * k1_t on
    every token (k1 is 0 on feedback tokens)."""
    r = np.zeros(length, dtype=np.float64)
    if k1 is not None:
        r -= kl_penalty * np.asarray(k1, dtype=np.float64)
    steps = student_steps(length, mask)
    if len(steps):
        r[steps[-1]] += score
    return r


def student_steps(length: int, mask: Sequence[int] | None) -> np.ndarray:
    """The positions of the student's tokens among `length` (`mask` None: all of them)."""
    return np.arange(length) if mask is None else np.flatnonzero(np.asarray(mask))


def masked_gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float,
               mask: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`gae` over the student's tokens only (`mask` 1; None: every token): a feedback token is
    no time step; its advantage and return are 0. Returns [T] arrays."""
    steps = student_steps(len(rewards), mask)
    adv, ret = np.zeros(len(rewards)), np.zeros(len(rewards))
    adv[steps], ret[steps] = gae(np.asarray(rewards)[steps], np.asarray(values)[steps], gamma,
                                 lam)
    return adv, ret


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float
        ) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) [T] of one episode from its rewards and values [T]."""
    values = np.asarray(values, dtype=np.float64)
    nxt = np.append(values[1:], 0.0)
    delta = np.asarray(rewards, dtype=np.float64) + gamma * nxt - values
    adv = np.zeros_like(delta)
    running = 0.0
    for t in range(len(delta) - 1, -1, -1):
        running = delta[t] + gamma * lam * running
        adv[t] = running
    return adv, adv + values


def whiten(advantages: Sequence[np.ndarray], reduce: Reduce | None = None,
           masks: Sequence[Sequence[int] | None] | None = None) -> list[np.ndarray]:
    """The advantages of every (student's: `masks`) token of the batch shifted and scaled to
    mean 0, std 1 (with `reduce`, a sum over the ranks: of every rank's tokens together);
    feedback tokens stay 0."""
    masks = masks or [None] * len(advantages)
    steps = [student_steps(len(a), m) for a, m in zip(advantages, masks, strict=True)]
    flat = np.concatenate([np.asarray(a)[s] for a, s in zip(advantages, steps, strict=True)]
                          ) if advantages else np.zeros(0)
    n, mean, std = batch_moments(flat, reduce)
    out = [np.asarray(a, dtype=np.float64).copy() for a in advantages]
    if n < 2:
        return out
    for a, s in zip(out, steps, strict=True):
        a[s] = (a[s] - mean) / (std + EPS)
    return out


def value_loss(values: Any, old_values: Any, returns: Any, clip: float, xp: Any) -> Any:
    """Per-token clipped value loss (`xp`: the array library); clip <= 0: unclipped."""
    plain = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * plain
    clipped = old_values + xp.clip(values - old_values, -clip, clip)
    return 0.5 * xp.maximum(plain, (clipped - returns) ** 2)
