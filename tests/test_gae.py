"""PPO with a critic (rl.advantage gae) and a moving KL reference (rl.reference ema|periodic):
GAE, returns and the clipped value loss against hand-computed numbers; the value head trained,
saved beside the adapters (never in them), resumed; the moving reference equal to a model
carrying its adapters, and its memory adapter-sized."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_unflatten
from recording_hub import RecordingHub

from mlx_rlaif.algo.gae import gae, token_rewards, value_loss, whiten
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.artifacts.lora import adapter_weights
from mlx_rlaif.backends.mlx.loss import token_logprobs
from mlx_rlaif.backends.mlx.policy import adapters_loaded, load_policy
from mlx_rlaif.config import load
from mlx_rlaif.train import train

R, V = np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.4, 0.3])


@pytest.mark.parametrize(("lam", "adv", "ret"), [
    (0.0, [-0.1, -0.1, 0.7], [0.4, 0.3, 1.0]),  # one-step TD errors: r + V' - V
    (1.0, [0.5, 0.6, 0.7], [1.0, 1.0, 1.0]),  # returns minus values
    (0.5, [0.025, 0.25, 0.7], [0.525, 0.65, 1.0]),  # -0.1 + 0.5 * (-0.1 + 0.5 * 0.7)
])
def test_gae_and_returns_by_hand(lam, adv, ret):
    a, r = gae(R, V, gamma=1.0, lam=lam)
    np.testing.assert_allclose(a, adv, atol=1e-12)
    np.testing.assert_allclose(r, ret, atol=1e-12)


def test_gae_discounts():
    a, r = gae(R, V, gamma=0.9, lam=1.0)
    # returns: 0.81, 0.9, 1.0 (the one reward, discounted back)
    np.testing.assert_allclose(r, [0.81, 0.9, 1.0], atol=1e-12)
    np.testing.assert_allclose(a, np.array([0.81, 0.9, 1.0]) - V, atol=1e-12)


def test_token_rewards_put_the_score_last_and_the_kl_everywhere():
    np.testing.assert_allclose(token_rewards(0.8, 3), [0, 0, 0.8])
    np.testing.assert_allclose(token_rewards(0.8, 3, np.array([0.1, -0.2, 0.3]), 0.5),
                               [-0.05, 0.1, 0.8 - 0.15])


@pytest.mark.parametrize(("v", "old", "ret", "expected"), [
    (1.0, 0.5, 0.0, 0.5),  # plain 0.5 * 1; clipped V 0.7 -> 0.245; the larger wins
    (0.9, 0.5, 1.0, 0.045),  # plain 0.005; clipped V 0.7 -> 0.5 * 0.09: clipping bites
    (0.6, 0.5, 1.0, 0.08),  # within the clip: plain 0.5 * 0.16
])
def test_clipped_value_loss_by_hand(v, old, ret, expected):
    got = value_loss(mx.array(v), mx.array(old), mx.array(ret), 0.2, mx)
    assert got.item() == pytest.approx(expected)
    assert value_loss(mx.array(0.9), mx.array(0.5), mx.array(1.0), 0.0, mx).item() == \
        pytest.approx(0.005)  # clip 0: unclipped


def test_whiten_over_all_tokens():
    out = whiten([np.array([1.0, 2.0]), np.array([3.0])])
    flat = np.concatenate(out)
    assert flat.mean() == pytest.approx(0.0, abs=1e-9) and flat.std() == pytest.approx(1.0)


def _cfg(model: Path, tasks: Path, out: Path, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=syntax", "generation.max_new_tokens=10", "rl.advantage=gae",
        "generation.num_samples_per_prompt=1", "training.batch_size=3",
        "training.learning_rate=0.01", "training.num_epochs=4", "logging.tensorboard=false",
        *extra])


def test_gae_trains_with_groups_of_one_and_keeps_the_head_out_of_the_adapters(
        micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3",
                         "rl.kl_in_reward=true", "rl.kl_penalty=0.5"), hub=hub)
    m = hub.steps[-1][1]
    assert m["kl/mean"] != 0 and "loss/kl" not in m  # the KL went into the per-token rewards
    assert m["loss/value"] > 0 and np.isfinite(m["critic/value_mean"])
    assert m["train/sequences"] == 3  # G = 1: nothing dropped for zero variance
    first = hub.steps[0][1]["critic/value_mean"]
    assert first == pytest.approx(hub.steps[0][1]["reward/mean"], abs=1e-4)  # head starts at it
    ckpt = checkpoint.latest_checkpoint(run_dir)
    adapters = mx.load(str(ckpt / checkpoint.ADAPTERS))
    head = mx.load(str(ckpt / checkpoint.VALUE_HEAD))
    assert not any(k.startswith("value_head") for k in adapters)
    assert set(head) == {"value_head.weight", "value_head.bias"}
    from mlx_lm import load as mlx_load

    mlx_load(str(micro_model), adapter_path=str(ckpt))  # mlx-lm loads the adapters as they are


def test_gae_resumes_exactly(micro_model, prompts_file, tmp_path):
    extra = ("training.save_every_batches=1", "training.save_total_limit=0",
             "rl.reference=ema", "rl.ref_ema_decay=0.5",
             "rl.entropy_coef=0.05")  # every step moves the weights, rewards equal or not
    straight = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=3",
                          *extra), hub=RecordingHub())
    ckpts = {p.name[-3:]: p for p in checkpoint.list_checkpoints(straight)}
    resumed = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=3",
                         *extra), resume_from=ckpts["gs2"], hub=RecordingHub())
    again = checkpoint.latest_checkpoint(resumed)
    before, after = (mx.load(str(ckpts[n] / checkpoint.ADAPTERS)) for n in ("gs2", "gs3"))
    assert any(np.abs(np.array(after[k] - before[k])).max() > 1e-6 for k in after)
    for fname in (checkpoint.ADAPTERS, checkpoint.VALUE_HEAD, checkpoint.REFERENCE):
        a, b = mx.load(str(ckpts["gs3"] / fname)), mx.load(str(again / fname))
        for k in a:
            np.testing.assert_allclose(np.array(b[k]), np.array(a[k]), rtol=1e-5, atol=1e-7)


def test_ema_reference_is_a_model_carrying_the_ema_adapters(micro_model, prompts_file,
                                                             tmp_path):
    """After a few steps the reference adapters moved (EMA of the trained ones) and the
    reference log-probs are those of the base plus the EMA adapters, loaded by mlx-lm."""
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3",
                         "rl.advantage=grpo", "generation.num_samples_per_prompt=2",
                         "rl.drop_zero_std=false", "rl.reference=ema", "rl.ref_ema_decay=0.5"),
                    hub=RecordingHub())
    ckpt = checkpoint.latest_checkpoint(run_dir)
    ema = mx.load(str(ckpt / checkpoint.REFERENCE))
    trained = mx.load(str(ckpt / checkpoint.ADAPTERS))
    assert any(np.abs(np.array(ema[k] - trained[k])).max() > 1e-6 for k in ema)
    assert any(np.abs(np.array(ema[k])).max() > 0 for k in ema if k.endswith("lora_b"))
    policy = load_policy(str(micro_model), adapter=ckpt)
    toks = mx.array([[3, 17, 99, 5, 42, 7, 11]])
    with adapters_loaded(policy.model, dict(ema)):
        as_reference = np.array(token_logprobs(policy.model, toks)[0])
    carrier = load_policy(str(micro_model), adapter=ckpt)
    carrier.model.update(tree_unflatten(list(ema.items())))
    np.testing.assert_allclose(as_reference, np.array(token_logprobs(carrier.model, toks)[0]),
                               atol=1e-6)
    back = np.array(token_logprobs(policy.model, toks)[0])  # the trained adapters are back
    assert not np.allclose(back, as_reference, atol=1e-5)
    assert set(adapter_weights(policy.model)) == set(ema)
    summary = json.loads((ckpt / "state.json").read_text())
    assert summary["step"] == 3


@pytest.mark.slow
def test_ema_reference_step_memory_at_the_half_billion_shape(tmp_path):
    """An EMA-reference step at Qwen2.5-0.5B's shape peaks at most 5% above a frozen-reference
    step: the reference is an adapter-sized copy, not a model."""
    import subprocess
    import sys

    from mlx_rlaif.testing.randmodel import make_model_dir

    model = make_model_dir(tmp_path / "m", "qwen0.5b", seed=0)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Write f{i}."}) + "\n"
                             for i in range(2)))
    probe = (
        "import json, sys, mlx.core as mx\n"
        "from mlx_rlaif.config import load\nfrom mlx_rlaif.train import train\n"
        "sys.path.insert(0, sys.argv[4])\nfrom recording_hub import RecordingHub\n"
        "cfg = load(None, [f'model.path={sys.argv[1]}', f'data.train_file={sys.argv[2]}',"
        " f'training.output_dir={sys.argv[3]}', 'reward.type=syntax',"
        " 'generation.max_new_tokens=8', 'generation.num_samples_per_prompt=2',"
        " 'training.batch_size=2', 'training.max_steps=2', 'rl.drop_zero_std=false',"
        " 'logging.tensorboard=false', 'training.save_every_epochs=0', sys.argv[5]])\n"
        "train(cfg, hub=RecordingHub())\nprint('PEAK', mx.get_peak_memory())\n")
    peaks = {}
    for ref in ("base", "ema"):
        out = subprocess.run([sys.executable, "-c", probe, str(model), str(tasks),
                              str(tmp_path / ref), str(Path(__file__).parent),
                              f"rl.reference={ref}"], capture_output=True, text=True,
                             timeout=1200)
        assert out.returncode == 0, out.stderr[-2000:]
        peaks[ref] = int(out.stdout.split("PEAK")[-1])
    assert peaks["ema"] <= 1.05 * peaks["base"], peaks
