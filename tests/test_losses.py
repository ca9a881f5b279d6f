"""The objective's pieces against hand-computed numbers."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.algo.objective import clipped_surrogate, kl_estimate, objective
from mlx_rlaif.backends.batch import chunks
from mlx_rlaif.config import RLConfig


def test_kl_estimators():
    logp, ref = mx.array([0.0]), mx.array([math.log(0.5)])
    d = math.log(0.5)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-d)  # 0.6931
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)  # 0.2402
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - d - 1)  # 0.1931
    same = mx.array([-1.3])
    for k in ("k1", "k2", "k3"):
        assert kl_estimate(same, same, k).item() == 0.0


@pytest.mark.parametrize(
    "ratio, adv, loss, clipped",
    [
        (1.5, 1.0, -1.28, True),  # positive advantage, ratio above 1 + 0.28: clipped
        (1.5, -1.0, 1.5, False),  # negative advantage: the pessimistic unclipped term wins
        (0.5, 1.0, -0.5, False),
        (0.5, -1.0, 0.8, True),  # negative advantage, ratio below 1 - 0.2: clipped
        (1.1, 2.0, -2.2, False),  # inside the trust region
    ],
)
def test_clipped_surrogate(ratio, adv, loss, clipped):
    logp = mx.array([[math.log(ratio)]])
    pg, r, c = clipped_surrogate(logp, mx.array([[0.0]]), mx.array([adv]), 0.2, 0.28)
    assert pg.item() == pytest.approx(loss, rel=1e-5)
    assert r.item() == pytest.approx(ratio, rel=1e-5)
    assert bool(c.item()) is clipped


def test_aggregation_weights():
    assert aggregation_weights([2, 4], "token", 8) == pytest.approx([1 / 6, 1 / 6])
    assert aggregation_weights([2, 4], "sequence", 8) == pytest.approx([1 / 4, 1 / 8])
    assert aggregation_weights([2, 4], "constant", 8) == pytest.approx([1 / 16, 1 / 16])
    # each aggregation sums to one over the batch except the constant divisor
    w = np.array(aggregation_weights([2, 4], "sequence", 8))
    assert (w * np.array([2, 4])).sum() == pytest.approx(1.0)


def test_constant_divisor_is_the_configured_batchs_not_the_kept_sequences():
    """Dr. GRPO: sequences x max_new_tokens of the configured batch. Dropping zero-variance
    groups (2 of 8 sequences kept) must not change the weight; the old code used 2."""
    assert aggregation_weights([2, 4], "constant", 8, batch_sequences=8) == pytest.approx(
        [1 / 64, 1 / 64])


def test_loss_is_policy_loss_plus_the_kl_term_with_its_penalty():
    """loss/kl (TensorBoard Train/KLPenalty) is the KL term of the loss, penalty included, so
    Train/Loss = Train/PolicyLoss + Train/KLPenalty for any penalty (the old aux left it out)."""
    d = math.log(0.5)  # ref - logp
    mb = {"mask": mx.array([[1.0, 1.0]]), "weights": mx.array([[0.5, 0.5]]),
          "old_logp": mx.array([[0.0, 0.0]]), "adv": mx.array([1.0]),
          "ref_logp": mx.array([[d, d]])}
    logp = mx.array([[0.0, 0.0]])
    loss, aux = objective(logp, mx.zeros((1, 2)), mb, RLConfig(kl_estimator="k1"), 0.1)
    # pg: ratio 1, adv 1 -> -1 per token, weighted: -1; kl k1 = -d per token, weighted: -d
    assert aux["pg"].item() == pytest.approx(-1.0)
    assert aux["kl_loss"].item() == pytest.approx(0.1 * -d)  # 0.0693
    assert loss.item() == pytest.approx(aux["pg"].item() + aux["kl_loss"].item())


def test_chunks():
    assert chunks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert chunks(5, 0) == [slice(0, 5)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_float64_numpy(temperature):
    from mlx_rlaif.backends.mlx.loss import logprobs_and_entropy

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(2, 5, 50))
    targets = rng.integers(0, 50, size=(2, 5))
    z = logits / temperature
    logsm = z - z.max(-1, keepdims=True)
    logsm = logsm - np.log(np.exp(logsm).sum(-1, keepdims=True))
    want_lp = np.take_along_axis(logsm, targets[..., None], -1)[..., 0]
    want_h = -(np.exp(logsm) * logsm).sum(-1)
    lp, h = logprobs_and_entropy(mx.array(logits.astype(np.float32)), mx.array(targets),
                                 temperature)
    np.testing.assert_allclose(np.array(lp), want_lp, atol=2e-5)
    np.testing.assert_allclose(np.array(h), want_h, atol=2e-5)
