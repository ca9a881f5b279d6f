"""Sampler and trainer in agreement (algo/correction.py): the gap's metrics and the tis / mis
corrections against hand-computed numbers; `none` bit for bit the objective as it was before the
correction existed; with an injected sampler bias the corrected expected gradient equals the
unbiased one where `none`'s does not; the update keeps iteration 1's log-probs as the later
iterations' old policy, on MLX and on torch."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_rlaif.algo import correction
from mlx_rlaif.algo.gae import value_loss
from mlx_rlaif.algo.objective import kl_estimate, objective, policy_term
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.mlx import loss as mlx_loss
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.mlx.rollout import sample
from mlx_rlaif.backends.mlx.update import make_optimizer, policy_logprobs, update
from mlx_rlaif.backends.sampling import SamplingParams
from mlx_rlaif.config import RLConfig
from mlx_rlaif.config import load as load_config
from mlx_rlaif.records import Rollout, Task

# gaps d = trainer - sampler log-prob of 3 student tokens, then a feedback token (mask 0) whose
# gap is huge and must count nowhere
GAPS = [math.log(3.0), math.log(0.4), math.log(1.5), -40.0]
MASK = [[1.0, 1.0, 1.0, 0.0]]


def _case(adv: float = 1.0) -> tuple[mx.array, dict[str, mx.array]]:
    logp = mx.full((1, 4), -1.0)
    mb = {"mask": mx.array(MASK), "weights": mx.array([[1 / 3, 1 / 3, 1 / 3, 0.0]]),
          "old_logp": logp - mx.array([GAPS]), "adv": mx.array([adv])}
    return logp, mb


def _loss_and_grad(logp: mx.array, mb: dict, rl: RLConfig) -> tuple[float, dict, np.ndarray]:
    loss, aux = objective(logp, mx.zeros(logp.shape), mb, rl, 0.0)
    g = mx.grad(lambda lp: objective(lp, mx.zeros(lp.shape), mb, rl, 0.0)[0])(logp)
    return loss.item(), aux, np.array(g)


def test_the_gap_metrics_by_hand():
    """k3 = w - ln w - 1 per token: 3 - ln 3 - 1 = 0.9014, 0.4 - ln 0.4 - 1 = 0.3163,
    1.5 - ln 1.5 - 1 = 0.0945; |d| > ln 2 for ln 3 and ln 0.4; max |d| = ln 3."""
    logp, mb = _case()
    _, aux, _ = _loss_and_grad(logp, mb, RLConfig())
    m = correction.metrics({k: v.item() for k, v in aux.items() if v.ndim == 0})
    k3 = sum(w - math.log(w) - 1 for w in (3.0, 0.4, 1.5))  # 1.3122
    assert m["policy/sampler_kl"] == pytest.approx(k3 / 3, rel=1e-5)
    assert m["policy/sampler_far_frac"] == pytest.approx(2 / 3)
    assert m["policy/sampler_logp_absdiff_max"] == pytest.approx(math.log(3.0), rel=1e-6)
    assert "policy/is_weight_mean" not in m  # no correction: no weight


@pytest.mark.parametrize("kw, loss, grad, hits", [
    # iteration 1: ratio 1 (against the recomputed old); A = 1, w_t = 1/3
    # tis: min(w, 2) = 2, 0.4, 1.5 -> loss -(2 + 0.4 + 1.5) / 3 = -1.3; d loss / d logp = -w/3
    ({"is_correction": "tis"}, -1.3, [-2 / 3, -0.4 / 3, -0.5, 0.0], 1),
    # mis: 3 > 2 and 0.4 < 1/2 are masked; 1.5 kept with its weight
    ({"is_correction": "mis"}, -0.5, [0.0, 0.0, -0.5, 0.0], 2),
    # sequence: the geometric mean (3 x 0.4 x 1.5)^(1/3) = 1.8^(1/3) = 1.21644 on every token
    ({"is_correction": "tis", "is_level": "sequence"}, -1.8 ** (1 / 3),
     [-(1.8 ** (1 / 3)) / 3] * 3 + [0.0], 0),
    ({"is_correction": "tis", "is_level": "sequence", "is_cap": 1.2}, -1.2,
     [-0.4] * 3 + [0.0], 3),
    ({"is_correction": "mis", "is_level": "sequence", "is_cap": 1.2}, 0.0, [0.0] * 4, 3),
    ({"is_correction": "mis", "is_level": "sequence", "is_cap": 1.3}, -1.8 ** (1 / 3),
     [-(1.8 ** (1 / 3)) / 3] * 3 + [0.0], 0),
])
def test_each_mode_by_hand(kw, loss, grad, hits):
    logp, mb = _case()
    got, aux, g = _loss_and_grad(logp, mb, RLConfig(**kw))
    assert got == pytest.approx(loss, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(g[0], grad, rtol=1e-5, atol=1e-7)
    key = "is_truncated" if kw["is_correction"] == "tis" else "is_masked"
    assert aux[key].item() == hits
    assert aux["clipped"].item() == 0  # the ratio against the recomputed old is 1
    np.testing.assert_array_equal(np.array(aux[correction.TRAINER_LOGP]), np.array(logp))


def test_later_iterations_take_the_ratio_against_iteration_1s_log_probs():
    """Kept old log-probs -1; the policy moved token 0 to -1 + ln 1.5: ratio 1.5 > 1.28 with
    A = +1 is clipped (no gradient), times the tis weight 2: -2.56; tokens 1, 2 at ratio 1:
    -0.4 and -1.5. Loss (-2.56 - 0.4 - 1.5) / 3; the sampler's log-probs set only the weight."""
    logp, mb = _case()
    mb[correction.TRAINER_LOGP] = logp
    moved = logp + mx.array([[math.log(1.5), 0.0, 0.0, 0.0]])
    got, aux, g = _loss_and_grad(moved, mb, RLConfig(is_correction="tis"))
    assert got == pytest.approx(-(2.56 + 0.4 + 1.5) / 3, rel=1e-5)
    np.testing.assert_allclose(g[0], [0.0, -0.4 / 3, -0.5, 0.0], rtol=1e-5, atol=1e-7)
    assert aux["clipped"].item() == 1 and correction.TRAINER_LOGP not in aux


def _legacy_objective(logp, entropy, mb, rl, kl_penalty, xp=mx, values=None):
    """algo/objective.objective as it was before rl.is_correction (commit fa8404f)."""
    mask, w, old = mb["mask"], mb["weights"], mb["old_logp"]
    pg, ratio, clipped = policy_term(logp, old, mb["adv"], mask, rl, xp)
    per_token = pg - rl.entropy_coef * entropy
    aux = {"tokens": mask.sum(), "pg": (pg * w).sum(), "entropy": (entropy * mask).sum(),
           "clipped": (clipped * mask).sum(), "ratio": (ratio * mask).sum(),
           "approx_kl": (0.5 * (logp - old) ** 2 * mask).sum()}
    if "ref_logp" in mb:
        kl = kl_estimate(logp, mb["ref_logp"], rl.kl_estimator, xp)
        per_token = per_token + kl_penalty * kl
        aux["kl_loss"] = kl_penalty * (kl * w).sum()
        aux["kl"] = ((logp - mb["ref_logp"]) * mask).sum()
    if values is not None:
        vl = value_loss(values, mb["old_values"], mb["returns"], rl.value_clip, xp)
        per_token = per_token + rl.value_coef * vl
        aux["value_loss"] = (vl * w).sum()
        aux["value"] = (values * mask).sum()
    loss = (per_token * w).sum()
    aux["loss"] = loss
    return loss, aux


@pytest.mark.parametrize("kw", [{}, {"ratio_level": "sequence"}, {"loss": "cispo"},
                                {"kl_estimator": "k3", "entropy_coef": 0.01}])
def test_none_is_the_old_objective_bit_for_bit(kw):
    rng = np.random.default_rng(0)
    logp = mx.array(rng.normal(-2, 1, (3, 5)).astype(np.float32))
    ent = mx.array(rng.uniform(0, 2, (3, 5)).astype(np.float32))
    mb = {"mask": mx.array((rng.uniform(size=(3, 5)) > 0.2).astype(np.float32)),
          "weights": mx.full((3, 5), 0.07), "adv": mx.array([1.0, -0.5, 0.3]),
          "old_logp": logp + mx.array(rng.normal(0, 0.3, (3, 5)).astype(np.float32)),
          "ref_logp": logp - 0.2}
    rl = RLConfig(**kw)
    for fn in (objective, _legacy_objective):
        loss, aux = fn(logp, ent, mb, rl, 0.1)
        g = mx.grad(lambda lp, fn=fn: fn(lp, ent, mb, rl, 0.1)[0])(logp)
        if fn is objective:
            want = (loss, aux, g)
    assert np.array_equal(np.array(want[0]), np.array(loss))
    assert np.array_equal(np.array(want[2]), np.array(g))
    for k in aux:
        assert np.array_equal(np.array(want[1][k]), np.array(aux[k])), k


def test_corrected_expected_gradient_equals_the_unbiased_one():
    """A one-token policy pi = softmax(theta) over 6 tokens, a sampler biased by a known b,
    pi_s = softmax(theta + b). Every token is one row, weighted by pi_s(y): the batch is the
    exact expectation under the sampler. The unbiased gradient is that of -E_pi[A]. With
    `none` the ratio pi / pi_s carries the bias into PPO's clip, which zeroes the tokens it
    pushed outside [0.8, 1.28]; tis (and mis, all weights inside [1/2, 2]) recover it."""
    theta = mx.array([0.3, -0.2, 1.0, 0.0, -0.7, 0.4])
    b = mx.array([0.55, -0.35, 0.5, -0.35, 0.0, 0.1])
    tokens = mx.arange(6)
    pi_s = mx.softmax(theta + b)
    r = np.array(mx.softmax(theta) / pi_s)
    assert (r > 1.28).sum() >= 2 and (r < 0.8).sum() >= 2 and r.max() < 2 and r.min() > 0.5
    adv = mx.array(np.where(r > 1, 1.0, -1.0).astype(np.float32))  # every clip bites
    mb = {"mask": mx.ones((6, 1)), "weights": pi_s[:, None], "adv": adv,
          "old_logp": mx.log(pi_s)[:, None]}

    def loss(th: mx.array, rl: RLConfig) -> mx.array:
        logp = (th - mx.logsumexp(th))[tokens][:, None]
        return objective(logp, mx.zeros((6, 1)), mb, rl, 0.0)[0]

    unbiased = np.array(mx.grad(lambda th: -(mx.softmax(th) * adv).sum())(theta))
    grads = {mode: np.array(mx.grad(loss)(theta, RLConfig(is_correction=mode)))
             for mode in ("none", "tis", "mis")}
    np.testing.assert_allclose(grads["tis"], unbiased, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["mis"], unbiased, rtol=1e-5, atol=1e-6)
    assert np.abs(grads["none"] - unbiased).max() > 0.05


def test_the_torch_objective_agrees():
    torch = pytest.importorskip("torch")
    logp, mb = _case(-0.7)
    mb["old_logp"] = mb["old_logp"] + mx.array([[0.0, 0.0, 0.0, 40.0]])  # a finite feedback gap
    for kw in ({"is_correction": "tis"}, {"is_correction": "mis", "is_level": "sequence",
                                          "is_cap": 1.3}, {"is_correction": "mis"}):
        rl = RLConfig(**kw)
        m, m_aux = objective(logp, mx.zeros((1, 4)), mb, rl, 0.0)
        t_lp = torch.from_numpy(np.array(logp)).requires_grad_()
        t, t_aux = objective(t_lp, torch.zeros(1, 4),
                             {k: torch.from_numpy(np.array(v)) for k, v in mb.items()}, rl, 0.0,
                             xp=torch)
        t.backward()
        g = np.array(mx.grad(lambda lp, rl=rl: objective(lp, mx.zeros((1, 4)), mb, rl, 0.0)[0])(
            logp))
        assert m.item() == pytest.approx(t.item(), rel=1e-6, abs=1e-7)
        np.testing.assert_allclose(t_lp.grad.numpy(), g, rtol=1e-6, atol=1e-7)
        for k in m_aux:
            np.testing.assert_allclose(np.array(m_aux[k]), t_aux[k].detach().numpy(), rtol=1e-6)


# --- the update -------------------------------------------------------------------------------


def _perturb(model: nn.Module) -> None:
    mx.random.seed(1)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())


@pytest.fixture(scope="module")
def exact_rollouts(micro_model: Path):
    """Sampled rollouts whose recorded log-probs are replaced by the trainer's own (an exact
    sampler), and per-token offsets to bias them with."""
    policy = load_policy(str(micro_model), seed=0)
    _perturb(policy.model)
    tasks = [Task(f"t{i}", f"Write function {i} that returns {i}") for i in range(2)]
    mx.random.seed(11)
    rollouts, _ = sample(policy.model, policy.tokenizer, tasks,
                         SamplingParams(temperature=1.0, max_new_tokens=10), 4)
    cfg = load_config(None, [])
    exact = policy_logprobs(policy.model, rollouts, cfg, policy.split)
    from dataclasses import replace
    rollouts = [replace(r, logprobs=tuple(float(x) for x in lp))
                for r, lp in zip(rollouts, exact, strict=True)]
    rng = np.random.default_rng(5)
    bias = [rng.choice([-0.9, -0.2, 0.1, 0.3], len(r.tokens)) for r in rollouts]
    return rollouts, bias


def _biased(rollouts, bias):
    from dataclasses import replace
    return [replace(r, logprobs=tuple(np.add(r.logprobs, b).tolist()))
            for r, b in zip(rollouts, bias, strict=True)]


def _run(micro_model: Path, rollouts, sets: list[str], objective_fn=None, monkeypatch=None):
    """One update of 3 iterations. lr 1e-3: Adam's first steps move every weight by about
    3 lr whatever its gradient's size, so at a large lr the noise-level difference between an
    'exact' sampler and the recomputation (1e-7, OpenBLAS) would decide the trajectory."""
    cfg = load_config(None, ["rl.kl_penalty=0", "rl.num_iterations=3", "rl.entropy_coef=0.01",
                             "training.learning_rate=0.001", *sets])
    policy = load_policy(str(micro_model), cfg.lora, seed=0)
    _perturb(policy.model)
    if objective_fn is not None:
        monkeypatch.setattr(mlx_loss, "objective", objective_fn)
    adv = np.linspace(-1, 1, len(rollouts))
    metrics, _ = update(policy, make_optimizer(cfg.training, 10), rollouts, adv, None, cfg, 0.0)
    return metrics, {k: np.array(v) for k, v in
                     tree_flatten(policy.model.trainable_parameters())}


def test_update_none_is_bit_for_bit_the_old_update(micro_model, exact_rollouts, monkeypatch):
    rollouts = _biased(*exact_rollouts)
    _, now = _run(micro_model, rollouts, [])
    _, old = _run(micro_model, rollouts, [], _legacy_objective, monkeypatch)
    for k in now:
        assert np.array_equal(now[k], old[k]), k


def test_update_keeps_iteration_1s_log_probs(micro_model, exact_rollouts):
    """With an exact sampler, tis and none are the same update: weight 1, and the later
    iterations' ratio against the kept log-probs is none's against the sampler's (not 1, as it
    would be against the current log-probs). With a biased sampler the metrics see the bias:
    k3 = exp(-b) + b - 1 per token, |b| > ln 2 only for b = -0.9."""
    rollouts, bias = exact_rollouts
    none_m, none_w = _run(micro_model, rollouts, [])
    tis_m, tis_w = _run(micro_model, rollouts, ["rl.is_correction=tis"])
    assert abs(tis_m["policy/ratio_mean"] - 1.0) > 1e-3 and tis_m["policy/clipfrac"] > 0
    for k in ("loss/total", "policy/ratio_mean", "policy/clipfrac", "optim/grad_norm"):
        assert tis_m[k] == pytest.approx(none_m[k], rel=1e-4, abs=1e-6), k
    for k in none_w:
        np.testing.assert_allclose(tis_w[k], none_w[k], rtol=1e-3, atol=1e-6)
    assert tis_m["policy/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tis_m["policy/sampler_kl"] == pytest.approx(0.0, abs=1e-6)

    biased, _ = _run(micro_model, _biased(rollouts, bias), ["rl.is_correction=tis"])
    b = np.concatenate(bias)
    assert biased["policy/sampler_kl"] == pytest.approx(np.mean(np.exp(-b) + b - 1), rel=1e-3)
    assert biased["policy/sampler_logp_absdiff_max"] == pytest.approx(0.9, rel=1e-3)
    assert biased["policy/sampler_far_frac"] == pytest.approx(np.mean(b == -0.9))
    assert biased["policy/is_truncated_frac"] == pytest.approx(np.mean(b == -0.9))


def test_carried_rows_are_not_a_mismatch(micro_model, exact_rollouts):
    """A group carried by dynamic sampling was sampled updates ago (Rollout.behind > 0): its
    recorded log-probs differ from the trainer's by the policy's change, not by a mismatch, so
    the agreement metrics count only the rows sampled at the trainer's weights (before, the
    shipped full-python recipe warned 'sampler and trainer disagree' at sampler_kl ~3e-3 with
    float32 decoding exact to 1e-11). Half the rows carried and biased: the metrics are the
    exact half's; every row carried: no agreement metric at all."""
    from dataclasses import replace
    rollouts, bias = exact_rollouts
    half = len(rollouts) // 2
    mixed = rollouts[:half] + [replace(r, behind=1) for r in _biased(rollouts, bias)[half:]]
    m, _ = _run(micro_model, mixed, [])
    assert m["policy/sampler_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["policy/sampler_logp_absdiff_max"] < 1e-3 and m["policy/sampler_far_frac"] == 0
    carried = [replace(r, behind=2) for r in _biased(rollouts, bias)]
    m, _ = _run(micro_model, carried, [])
    assert "policy/sampler_kl" not in m and m["train/tokens"] > 0


def test_dynamic_sampling_stamps_a_carried_group_with_its_age():
    from mlx_rlaif.train.carry import Group
    from mlx_rlaif.train.dynamic import stamped

    r = Rollout(Task("t", "p"), (1,), (2, 3), (-0.1, -0.2), "x", "stop", 1.0)
    g = Group([r, r], [], version=3)
    assert stamped(g, 3, 2) is g  # sampled this step
    assert [x.behind for x in stamped(g, 4, 2).rollouts] == [2, 2]  # one step of 2 updates


def test_torch_update_keeps_iteration_1s_log_probs(micro_model, exact_rollouts):
    """The torch backend's update gives the MLX update's correction metrics and loss."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from mlx_rlaif.artifacts import checkpoint
    from mlx_rlaif.backends.mlx.policy import adapter_config_for
    from mlx_rlaif.backends.torch import policy as tb
    from mlx_rlaif.backends.torch import update as tu

    rollouts, bias = exact_rollouts
    rollouts = _biased(rollouts, bias)
    cfg = load_config(None, ["rl.kl_penalty=0", "rl.num_iterations=2", "rl.is_correction=tis",
                             "training.learning_rate=0.001"])
    mpol = load_policy(str(micro_model), cfg.lora, seed=0)
    _perturb(mpol.model)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint.save_checkpoint(Path(tmp), "checkpoint-e1-b1-gs1", mpol.model,
                                          adapter_config_for(mpol), checkpoint.LoopState(step=1))
        tpol = tb.load_policy(str(micro_model), adapter=ckpt, device="cpu")
    adv = np.linspace(-1, 1, len(rollouts))
    t_m, _ = tu.update(tpol, tu.make_optimizer(tpol, cfg, 10), rollouts, adv, None, cfg, 0.0)
    m_m, _ = update(mpol, make_optimizer(cfg.training, 10), rollouts, adv, None, cfg, 0.0)
    for key in ("loss/total", "policy/ratio_mean", "policy/sampler_kl", "policy/is_weight_mean",
                "policy/is_truncated_frac", "policy/sampler_logp_absdiff_max"):
        assert t_m[key] == pytest.approx(m_m[key], rel=1e-3, abs=1e-5), key
    assert abs(t_m["policy/ratio_mean"] - 1.0) > 1e-4
