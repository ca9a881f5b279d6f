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


def _rl(**kw):
    return RLConfig(**{"clip_low": 0.2, "clip_high": 0.28, **kw})


def _total(logp, adv, rl, w=(0.5, 0.5)):
    mb = {"mask": mx.array([[1.0, 1.0]]), "weights": mx.array([w]),
          "old_logp": mx.zeros((1, 2)), "adv": mx.array([adv])}
    return objective(logp, mx.zeros((1, 2)), mb, rl, 0.0)


def test_gspo_clips_one_ratio_per_sequence_by_hand():
    """log-ratios ln 2 and 0: s = exp(ln 2 / 2) = 1.4142. A = +1: clipped to 1.28 on both
    tokens (no gradient); A = -1: unclipped, the loss is s and d s / d logp_t = s / 2."""
    logp = mx.array([[math.log(2.0), 0.0]])
    rl = _rl(ratio_level="sequence")
    loss, aux = _total(logp, 1.0, rl)
    assert loss.item() == pytest.approx(-1.28) and aux["clipped"].item() == 2
    assert aux["ratio"].item() == pytest.approx(2 * math.sqrt(2.0))  # s on each of 2 tokens
    assert np.abs(np.array(mx.grad(lambda lp: _total(lp, 1.0, rl)[0])(logp))).max() == 0.0
    loss, aux = _total(logp, -1.0, rl)
    assert loss.item() == pytest.approx(math.sqrt(2.0)) and aux["clipped"].item() == 0
    # loss = sum_t w_t s = s; ds/dlogp_t = s / 2 (the mean over 2 tokens)
    g = np.array(mx.grad(lambda lp: _total(lp, -1.0, rl)[0])(logp))
    np.testing.assert_allclose(g, [[math.sqrt(2.0) / 2] * 2], rtol=1e-6)


def test_cispo_keeps_the_gradient_ppo_clips_away_by_hand():
    """Ratios 2 and 0.5 with A = +1: PPO's clip zeroes token 1's gradient (2 > 1.28); CISPO
    weighs each token's -A logp_t by the clipped ratio, detached: gradients -1.28 w and
    -0.8 w."""
    logp = mx.array([[math.log(2.0), math.log(0.5)]])
    g_ppo = np.array(mx.grad(lambda lp: _total(lp, 1.0, _rl())[0])(logp))
    assert g_ppo[0, 0] == 0.0 and g_ppo[0, 1] == pytest.approx(-0.5 * 0.5)  # -A r_t w_t
    cispo = _rl(loss="cispo")
    loss, aux = _total(logp, 1.0, cispo)
    # loss = -(1.28 ln 2 + 0.8 ln 0.5) * 0.5
    assert loss.item() == pytest.approx(-(1.28 * math.log(2) + 0.8 * math.log(0.5)) / 2)
    assert aux["clipped"].item() == 2  # both ratios were outside [0.8, 1.28]
    g = np.array(mx.grad(lambda lp: _total(lp, 1.0, cispo)[0])(logp))
    np.testing.assert_allclose(g, [[-1.28 * 0.5, -0.8 * 0.5]], rtol=1e-6)


@pytest.mark.parametrize("kw", [{"ratio_level": "sequence"}, {"loss": "cispo"},
                                {"loss": "cispo", "ratio_level": "sequence"}])
def test_the_variants_give_torch_and_mlx_the_same_loss(kw):
    torch = pytest.importorskip("torch")
    rl = _rl(**kw)
    lp = np.array([[math.log(2.0), 0.1, -0.3], [0.2, -0.1, 0.0]], dtype=np.float32)
    mb = {"mask": np.array([[1, 1, 1], [1, 1, 0]], np.float32),
          "weights": np.full((2, 3), 0.2, np.float32), "old_logp": np.zeros((2, 3), np.float32),
          "adv": np.array([1.0, -0.5], np.float32)}
    m, _ = objective(mx.array(lp), mx.zeros((2, 3)), {k: mx.array(v) for k, v in mb.items()},
                     rl, 0.0)
    t, _ = objective(torch.from_numpy(lp), torch.zeros(2, 3),
                     {k: torch.from_numpy(v) for k, v in mb.items()}, rl, 0.0, xp=torch)
    assert m.item() == pytest.approx(t.item(), rel=1e-6)
