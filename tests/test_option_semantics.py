"""Options that combine as their docs say, by hand (issue 35): GSPO as published (each sequence
counted once, the paper's clip range, policy/clipfrac a share of tokens, an old run saved with
token aggregation refused on resume); GAE over the student's tokens of a conversation; the
reward's KL reported over the student's tokens and steering the adaptive controller; each KL
estimator's gradient in expectation, and k1 refused in the loss.

Not covered: the all-pairs comparison with the numpy reference (test_reference_objective.py).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from recording_hub import RecordingHub

from mlx_rlaif.algo.aggregation import aggregation_weights, loss_aggregation
from mlx_rlaif.algo.objective import clip_range, kl_estimate, objective
from mlx_rlaif.config import RLConfig, check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.train.step import adapt_kl, critic_targets, group_targets

# --- GSPO --------------------------------------------------------------------------------------


def _batch(lengths, adv, logp_shift=None):
    """One row per sequence, left-aligned, the rest padding."""
    n, width = len(lengths), max(lengths)
    mask = np.zeros((n, width), np.float32)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1
    old = np.full((n, width), -1.0, np.float32)
    logp = old + (0 if logp_shift is None else np.asarray(logp_shift, np.float32)[:, None])
    return mx.array(logp), {"mask": mx.array(mask), "old_logp": mx.array(old),
                            "adv": mx.array(np.asarray(adv, np.float32))}


def _grad(rl, lengths, adv, shift=None):
    logp, mb = _batch(lengths, adv, shift)
    w = aggregation_weights(lengths, loss_aggregation(rl), 8)
    mb["weights"] = mb["mask"] * mx.array(np.asarray(w, np.float32))[:, None]
    f = lambda lp: objective(lp, mx.zeros(lp.shape), mb, rl, 0.0)  # noqa: E731
    (_, aux), g = mx.value_and_grad(f)(logp)
    return np.array(g), aux


def test_gspo_counts_each_sequence_once_by_hand():
    """Lengths 2 and 8, A = 1, ratio 1: token ratios with the token mean give every token
    -1/10; GSPO (ratio_level sequence, loss_agg auto) gives -1/(2*2) and -1/(2*8), the paper's
    1/G weighting. The old default (loss_agg token) gave GSPO the token-level gradient."""
    g, _ = _grad(RLConfig(), [2, 8], [1.0, 1.0])
    np.testing.assert_allclose(g[0, :2], [-0.1] * 2, rtol=1e-6)
    np.testing.assert_allclose(g[1], [-0.1] * 8, rtol=1e-6)
    g, _ = _grad(RLConfig(ratio_level="sequence"), [2, 8], [1.0, 1.0])
    np.testing.assert_allclose(g[0, :2], [-0.25] * 2, rtol=1e-6)
    np.testing.assert_allclose(g[1], [-0.0625] * 8, rtol=1e-6)
    assert g[0, 2:].tolist() == [0.0] * 6  # padding


def test_gspo_clip_range_and_clipfrac_by_hand():
    """Sequence ratios clip at the paper's 1 - 3e-4 / 1 + 4e-4 unless set; policy/clipfrac is
    the share of tokens whose sequence was clipped: the 2-token sequence's log-ratio 5e-4 > 4e-4
    (A = 1: clipped, no gradient), the 8-token one's 3e-4 is not: 2 of 10 tokens, 0.2."""
    assert clip_range(RLConfig(ratio_level="sequence")) == (3e-4, 4e-4)
    assert clip_range(RLConfig()) == (0.2, 0.28)
    assert clip_range(RLConfig(ratio_level="sequence", clip_low=0.1, clip_high=0.2)) == (0.1,
                                                                                          0.2)
    g, aux = _grad(RLConfig(ratio_level="sequence"), [2, 8], [1.0, 1.0], [5e-4, 3e-4])
    assert np.abs(g[0]).max() == 0.0 and np.abs(g[1]).min() > 0
    from mlx_rlaif.backends.mlx.update import update_metrics

    m = update_metrics(aux, aux, 1.0, optim.AdamW(learning_rate=1e-3), 10, 1.0)
    assert m["policy/clipfrac"] == pytest.approx(0.2)
    assert m["policy/ratio_mean"] == pytest.approx((2 * math.exp(5e-4) + 8 * math.exp(3e-4)) / 10,
                                                   rel=1e-6)


def test_gspo_update_weighs_sequences_as_grpo_does_at_ratio_one(micro_model: Path):
    """Through the MLX update (backends/mlx/update.py): at ratio 1 with one advantage per
    sequence, GSPO's gradient is the per-sequence aggregation's with token ratios, and not the
    token mean's (the old code: GSPO's grad norm equal to the token mean's, 9.141087 vs
    9.141088 in the issue's run)."""
    from mlx_rlaif.backends.mlx.policy import load_policy
    from mlx_rlaif.backends.mlx.update import make_optimizer, policy_logprobs, update

    def grad_norm(*overrides: str) -> float:
        cfg = load(None, ["training.max_grad_norm=0", *overrides])
        policy = load_policy(str(micro_model))
        rollouts = [Rollout(Task(f"t{i // 2}", "p"), (5, 6, 7), tuple(range(30, 30 + n)),
                            (0.0,) * n, "x", "stop", 1.0)
                    for i, n in enumerate([2, 9, 4, 12])]
        lps = policy_logprobs(policy.model, rollouts, cfg)  # on-policy: ratio 1
        rollouts = [Rollout(r.task, r.prompt_tokens, r.tokens, tuple(lp.tolist()), "x", "stop",
                            1.0) for r, lp in zip(rollouts, lps, strict=True)]
        metrics, _ = update(policy, make_optimizer(cfg.training, 1), rollouts,
                            [1.0, -1.0, 0.5, -0.5], None, cfg, 0.0)
        return metrics["optim/grad_norm"]

    gspo = grad_norm("rl.ratio_level=sequence")
    assert gspo == pytest.approx(grad_norm("rl.loss_agg=sequence"), rel=1e-4)
    assert gspo != pytest.approx(grad_norm(), rel=1e-2)


@pytest.mark.parametrize("agg", ["token", "constant"])
def test_gspo_with_length_weighted_aggregation_is_refused(agg):
    with pytest.raises(ConfigError) as e:
        check(load(None, ["rl.ratio_level=sequence", f"rl.loss_agg={agg}"]))
    assert "rl.ratio_level" in str(e.value) and "rl.loss_agg" in str(e.value)
    check(load(None, ["rl.ratio_level=sequence", "rl.loss_agg=sequence"]))
    check(load(None, ["rl.loss_agg=sequence"]))  # GRPO's aggregation with token ratios


def test_an_old_gspo_run_is_refused_on_resume_with_the_fix(micro_model, prompts_file, tmp_path):
    """A run saved before loss_agg auto has `loss_agg: token` beside `ratio_level: sequence` in
    its config.yaml: --resume stops with one line naming both and the fix, and the fix
    resumes."""
    from mlx_rlaif.train import train

    run_dir = tmp_path / "run"
    cfg = load(None, [f"model.path={micro_model}", f"data.train_file={prompts_file}",
                      f"training.output_dir={run_dir}", "reward.type=syntax",
                      "generation.max_new_tokens=4", "training.max_steps=1",
                      "training.save_every_batches=1", "logging.tensorboard=false",
                      "rl.ratio_level=sequence"])
    train(cfg, hub=RecordingHub())
    saved = run_dir / "config.yaml"
    text = saved.read_text()
    assert "loss_agg: auto" in text
    saved.write_text(text.replace("loss_agg: auto", "loss_agg: token"))  # as 0.1 saved it

    def resume(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "train", "--resume",
                               str(run_dir), "--no-dashboard", "--set", "training.max_steps=1",
                               *extra], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300)

    proc = resume()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rl.ratio_level = sequence" in lines[0], proc.stderr
    assert "rl.loss_agg = token" in lines[0] and "--set rl.loss_agg=auto" in lines[0]
    assert resume("--set", "rl.loss_agg=auto").returncode == 0


# --- GAE and the reward's KL over the student's tokens -------------------------------------------


def _conversation(feedback: int, first: int = 3, second: int = 7, logprobs=None) -> Rollout:
    mask = (1,) * first + (0,) * feedback + (1,) * second
    n = len(mask)
    return Rollout(Task("t", "p"), (1, 2), tuple(range(10, 10 + n)),
                   tuple(logprobs if logprobs is not None else [0.0] * n), "x", "stop", 1.0,
                   mask if feedback else None)


def _run(cfg, ref=None, values=None):
    ops = SimpleNamespace(reference=lambda p, rs, c: [ref(r) for r in rs],
                          values=lambda p, rs, c, mean: [values(r) for r in rs])
    return SimpleNamespace(cfg=cfg, ops=ops, policy=None, world=SimpleNamespace(reduce=None),
                           state=SimpleNamespace(reinforce_baseline=None))


@pytest.mark.parametrize("feedback", [0, 20, 60, 200])
def test_gae_skips_feedback_tokens_by_hand(feedback):
    """A critic predicting 0.5 on every token, lambda 0.95, score 1 on the last token of a
    second answer of 7 tokens: the first answer's last token gets 0.5 * 0.95^7 = 0.349 whatever
    the feedback's length (the old code: 0.125 with 20 feedback tokens, 0.016 with 60, 0.000
    with 200)."""
    cfg = load(None, ["rl.advantage=gae", "generation.num_samples_per_prompt=1",
                      "rl.kl_penalty=0", "rl.lam=0.95"])
    r = _conversation(feedback)
    values = np.full(len(r.tokens), 0.5)
    t = critic_targets(_run(cfg, values=lambda _: values), [r], [1.0], 0.0)
    raw = t.critic["returns"][0] - values  # returns = raw advantages + values
    assert raw[2] == pytest.approx(0.5 * 0.95**7, abs=1e-12)  # 0.3492
    assert raw[-1] == pytest.approx(0.5)


def test_gae_whitens_over_the_students_tokens():
    cfg = load(None, ["rl.advantage=gae", "generation.num_samples_per_prompt=1",
                      "rl.kl_penalty=0"])
    rs = [_conversation(20), _conversation(5, first=4, second=2)]
    t = critic_targets(_run(cfg, values=lambda r: np.full(len(r.tokens), 0.5)), rs, [1.0, 0.0],
                       0.0)
    student = np.concatenate([a[np.array(r.mask) == 1] for a, r in zip(t.adv, rs, strict=True)])
    assert student.mean() == pytest.approx(0.0, abs=1e-9)
    assert student.std() == pytest.approx(1.0, abs=1e-6)
    assert all((a[np.array(r.mask) == 0] == 0).all() for a, r in zip(t.adv, rs, strict=True))


def _kl_case(advantage: str):
    """Two conversations of 4 student tokens (k1 = 0.5 each) and 3 feedback tokens: the true
    KL over the student's tokens is 0.5 (the old code: 0.5 * 4/7 = 0.2857)."""
    cfg = load(None, [f"rl.advantage={advantage}", "rl.kl_in_reward=true", "rl.kl_penalty=0.1",
                      "rl.adaptive_kl=true", "rl.kl_target=0.5", "generation.max_turns=2",
                      "generation.num_samples_per_prompt=2"])
    lp = [-1.0, -2.0, 0.0, 0.0, 0.0, -1.5, -0.5]  # answer, 3 feedback tokens (0), answer
    rs = [_conversation(3, first=2, second=2, logprobs=lp) for _ in range(2)]
    def ref(r: Rollout) -> np.ndarray:  # k1 = 0.5 on the answers; anything on the feedback
        return np.where(np.array(r.mask) == 1, np.array(r.logprobs) - 0.5, 7.0)

    return cfg, _run(cfg, ref=ref, values=lambda r: np.zeros(len(r.tokens))), rs


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_the_rewards_kl_is_the_mean_over_the_students_tokens(advantage):
    cfg, run, rs = _kl_case(advantage)
    targets = (critic_targets if advantage == "gae" else group_targets)(run, rs, [1.0, 0.0], 0.1)
    assert targets.kl["kl/mean"] == pytest.approx(0.5)
    # the adaptive controller steers on it: at the target, the penalty stays
    assert adapt_kl(cfg, 0.1, targets.kl["kl/mean"], 2) == pytest.approx(0.1)


# --- the KL estimators in the loss ---------------------------------------------------------------


def test_each_kl_estimators_gradient_in_expectation():
    """Exactly over a 5-token vocabulary, pi = softmax(theta): E_pi[grad k(log pi(y), log
    ref(y))] (the gradient through the sampled token's log-prob, as the loss takes it) is 0 for
    k1, grad KL(pi || ref) for k2 and grad KL(ref || pi) for k3."""
    rng = np.random.default_rng(0)
    theta, log_ref = mx.array(rng.normal(size=5)), mx.log(mx.softmax(mx.array(rng.normal(size=5))))

    def expected_grad(kind: str) -> np.ndarray:
        p = mx.softmax(theta)
        total = mx.zeros(5)
        for y in range(5):
            g = mx.grad(lambda th, y=y: kl_estimate(th - mx.logsumexp(th), log_ref, kind)[y])(
                theta)
            total = total + p[y] * g
        return np.array(total)

    def kl_grad(forward: bool) -> np.ndarray:
        def kl(th: mx.array) -> mx.array:
            log_p = th - mx.logsumexp(th)
            if forward:
                return (mx.exp(log_p) * (log_p - log_ref)).sum()
            return (mx.exp(log_ref) * (log_ref - log_p)).sum()
        return np.array(mx.grad(kl)(theta))

    np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k2"), kl_grad(forward=True), atol=1e-6)
    np.testing.assert_allclose(expected_grad("k3"), kl_grad(forward=False), atol=1e-6)
    assert not np.allclose(kl_grad(forward=True), kl_grad(forward=False), atol=1e-3)


def test_k1_in_the_loss_is_refused_and_in_the_reward_is_not():
    with pytest.raises(ConfigError) as e:
        check(load(None, ["rl.kl_estimator=k1"]))
    assert "rl.kl_estimator = k1" in str(e.value) and "rl.kl_in_reward" in str(e.value)
    check(load(None, ["rl.kl_estimator=k1", "rl.kl_in_reward=true"]))
    check(load(None, ["rl.kl_estimator=k1", "rl.kl_penalty=0"]))  # no KL term at all
