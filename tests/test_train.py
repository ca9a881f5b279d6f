"""The RL loop end to end on a tiny model: metrics, checkpoints, resume, Ctrl-C-free stop."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.train import train


def _cfg(model: Path, tasks: Path, out: Path, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=syntax", "generation.max_new_tokens=12", "generation.num_samples_per_prompt=3",
        "rl.entropy_coef=0.05", "rl.drop_zero_std=false", "rl.kl_penalty=0.1",
        "training.learning_rate=0.01", "training.num_epochs=3", "logging.tensorboard=false",
        *extra])


def _adapters(ckpt: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(ckpt / checkpoint.ADAPTERS)).items()}


def test_two_steps_write_metrics_and_checkpoint(micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=2"),
                    hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2]
    m = hub.steps[-1][1]
    for key in ("reward/mean", "kl/mean", "loss/total", "policy/clipfrac", "policy/entropy",
                "gen/tokens_per_sec", "train/tokens_per_sec", "gen/decode_width",
                "reward/frac_zero_std", "time/generate", "time/score", "time/train"):
        assert key in m and np.isfinite(m[key]), key
    assert m["gen/decode_width"] == 6  # P=2 x G=3 decoded together
    assert m["kl/mean"] > 0  # after one update the policy moved away from the base
    ckpt = checkpoint.latest_checkpoint(run_dir)
    assert ckpt.name == "checkpoint-final-gs2"
    assert (run_dir / "config.yaml").is_file()
    assert checkpoint.load_state(ckpt).step == 2


def test_resume_continues_identically(micro_model, prompts_file, tmp_path):
    straight = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=4"),
                     hub=RecordingHub())
    first = train(_cfg(micro_model, prompts_file, tmp_path / "b", "training.max_steps=2"),
                  hub=RecordingHub())
    resumed = train(_cfg(micro_model, prompts_file, tmp_path / "b", "training.max_steps=4"),
                    resume_from=checkpoint.latest_checkpoint(first), hub=RecordingHub())
    a = _adapters(checkpoint.latest_checkpoint(straight))
    b = _adapters(checkpoint.latest_checkpoint(resumed))
    assert checkpoint.load_state(checkpoint.latest_checkpoint(resumed)).step == 4
    start = _adapters(checkpoint.list_checkpoints(first)[0])
    assert any(np.abs(a[k] - start[k]).max() > 1e-6 for k in a)  # steps 3-4 changed weights
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6)


def test_existing_run_is_not_overwritten(micro_model, prompts_file, tmp_path):
    cfg = _cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1")
    train(cfg, hub=RecordingHub())
    before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="--resume"):
        train(cfg, hub=RecordingHub())
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before


def test_checkpoint_retention_and_names(micro_model, prompts_file, tmp_path):
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=5",
                         "training.save_every_batches=2", "training.save_total_limit=2"),
                    hub=RecordingHub())
    names = [p.name for p in checkpoint.list_checkpoints(run_dir)]
    assert names == ["checkpoint-e2-b1-gs4", "checkpoint-final-gs5"]


@pytest.mark.parametrize("extra", [
    ("rl.advantage=rloo", "rl.loss_agg=sequence", "rl.num_iterations=2"),
    ("rl.advantage=reinforce", "rl.scale=batch", "rl.loss_agg=constant", "rl.whiten=true"),
    ("rl.scale=batch", "rl.kl_estimator=k3", "training.micro_batch_size=2", "training.lr_schedule=cosine", "training.warmup_steps=1"),
    ("rl.kl_penalty=0",),
    ("training.grad_checkpoint=on", "training.micro_batch_size=2"),
])
def test_variants_run(micro_model, prompts_file, tmp_path, extra):
    hub = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=2", *extra),
          hub=hub)
    m = hub.steps[-1][1]
    assert np.isfinite(m["loss/total"]) and m["optim/skipped"] == 0
    if "rl.kl_penalty=0" in extra:
        assert "kl/mean" not in m  # no reference forward at all


def test_second_iteration_sees_the_ratio_move(micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1",
               "rl.num_iterations=3", "training.learning_rate=0.05"), hub=hub)
    m = hub.steps[-1][1]
    assert m["kl/sample_train"] < 1e-5  # iteration 1: trainer == sampler
    assert m["policy/approx_kl"] > m["kl/sample_train"]  # later iterations moved away


def test_kl_in_reward_with_adaptive_controller(micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3",
               "rl.kl_in_reward=true", "rl.adaptive_kl=true", "rl.kl_target=1e-6",
               "rl.kl_horizon=10"), hub=hub)
    coefs = [m["kl/penalty"] for _, m in hub.steps]
    assert coefs[0] == pytest.approx(0.1)
    assert hub.steps[-1][1]["kl/mean"] > 0
    # step 1: policy == base, KL 0 < target: beta * (1 - 0.2 * 6/10); then KL > target: raised
    assert coefs[1] == pytest.approx(0.1 * (1 - 0.2 * 6 / 10))
    assert coefs[2] == pytest.approx(coefs[1] * (1 + 0.2 * 6 / 10))


def test_mask_truncated_leaves_cut_completions_out(micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1",
               "rl.mask_truncated=true"), hub=hub)
    m = hub.steps[-1][1]
    # P=2 x G=3 completions, all scorable, no zero-std drop: only the truncated ones are left out
    assert m["gen/truncated_frac"] > 0
    assert m["train/sequences"] == round(6 * (1 - m["gen/truncated_frac"]))


def test_checkpoint_carries_a_fused_mlx_model_when_asked(micro_model, prompts_file, tmp_path):
    from mlx_lm import load as mlx_load

    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1",
                         "training.save_mlx_model_bits=8"), hub=RecordingHub())
    fused = checkpoint.latest_checkpoint(run_dir) / "mlx_model"
    model, _ = mlx_load(str(fused))
    assert model.layers[0].self_attn.q_proj.bits == 8


def test_baseline_batches_are_scored_before_training(micro_model, prompts_file, tmp_path):
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1",
                         "logging.baseline_eval_batches=2"), hub=hub)
    value, source = hub.baseline
    assert 0.0 <= value <= 1.0 and "2 batches" in source
    summary = json.loads((checkpoint.latest_checkpoint(run_dir) / "checkpoint_summary.json"
                          ).read_text())
    assert summary["baseline_reward"] == pytest.approx(value)
    assert summary["global_step"] == 1 and "reward_gain_from_baseline" in summary


def test_resume_keeps_the_controllers_kl_penalty_unless_the_user_changed_it(
        micro_model, prompts_file, tmp_path):
    """The adaptive controller's value is loop state: it continues on --resume. A rl.kl_penalty
    the user changed since the checkpoint wins instead, and a line says so."""
    extra = ("rl.adaptive_kl=true", "rl.kl_target=1e-6", "rl.kl_horizon=10")
    first = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=2",
                       *extra), hub=RecordingHub())
    ckpt = checkpoint.latest_checkpoint(first)
    adapted = checkpoint.load_state(ckpt).kl_penalty
    assert adapted != pytest.approx(0.1)
    same = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3", *extra),
          resume_from=ckpt, hub=same)
    assert same.steps[0][1]["kl/penalty"] == pytest.approx(adapted)
    assert not any("kl_penalty" in m for m in same.messages)
    changed = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3", *extra,
               "rl.kl_penalty=0.5"), resume_from=ckpt, hub=changed)
    assert changed.steps[0][1]["kl/penalty"] == pytest.approx(0.5)
    assert any("rl.kl_penalty = 0.5 (changed since the checkpoint)" in m
               for m in changed.messages)


def test_kl_in_reward_is_not_counted_again_in_the_loss(micro_model, prompts_file, tmp_path):
    """With rl.kl_in_reward the KL shapes the reward only: the update adds no KL term (the old
    code passed the reference to the update as well, counting the KL twice)."""
    hub = RecordingHub()
    train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=2",
               "rl.kl_in_reward=true"), hub=hub)
    m = hub.steps[-1][1]
    assert m["kl/mean"] > 0 and "loss/kl" not in m
    assert m["loss/total"] == pytest.approx(m["loss/policy"] - 0.05 * m["policy/entropy"],
                                            rel=1e-3, abs=1e-6)


def test_held_out_and_baseline_samples_reach_the_dataset(micro_model, prompts_file, tmp_path):
    """Training fills the train split; the baseline batches the validation split; the held-out
    evaluation the evaluation split (the old code wrote only train)."""
    from mlx_rlaif.metrics import MetricsHub

    cfg = _cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=1",
               "logging.baseline_eval_batches=1", f"data.eval_file={prompts_file}")
    hub = MetricsHub.create(cfg.logging, tmp_path / "run", False, 1, {})
    run_dir = train(cfg, hub=hub)
    rows = {s: [json.loads(x) for x in (run_dir / "datasets" / f"{s}.jsonl").read_text()
                .splitlines()] for s in ("train", "validation", "evaluation")}
    assert len(rows["train"]) == 6 and len(rows["validation"]) == 6  # P x G
    assert len(rows["evaluation"]) == 2 * 6  # 6 held-out tasks, before and after, 1 sample
    assert all(r["student_score"] == r["reward"] for r in rows["train"])


def test_checkpoint_and_stats_agree_on_the_reward_gain(micro_model, prompts_file, tmp_path):
    """One reward EMA for the run: checkpoint_summary.json's gain is training_stats.json's (the
    old code kept a second EMA, decay 0.8, reset on resume)."""
    from mlx_rlaif.metrics import MetricsHub

    cfg = _cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=3")
    run_dir = train(cfg, hub=MetricsHub.create(cfg.logging, tmp_path / "run", False, 3, {}))
    ckpt = checkpoint.latest_checkpoint(run_dir)
    summary = json.loads((ckpt / "checkpoint_summary.json").read_text())
    stats = json.loads((ckpt / "training_stats.json").read_text())
    assert summary["reward_gain_from_baseline"] is not None
    assert summary["reward_gain_from_baseline"] == stats["reward_gain_from_baseline"]


def test_resume_is_exact_with_a_cosine_schedule_and_another_max_steps(micro_model, prompts_file,
                                                                        tmp_path):
    """The schedule's horizon is the first launch's: resuming step 2 of a 4-step cosine run with
    --max-steps 6 reproduces the 4-step run's step 4 (the old code stretched the cosine to 6)."""
    import shutil

    extra = ("training.lr_schedule=cosine", "training.warmup_steps=1",
             "training.save_every_batches=1", "training.save_total_limit=0")
    straight = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=4",
                          *extra), hub=RecordingHub())
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    two = next(p for p in checkpoint.list_checkpoints(straight) if p.name.endswith("gs2"))
    shutil.copytree(two, tmp_path / "b" / "checkpoints" / two.name)
    hub = RecordingHub()
    resumed = train(_cfg(micro_model, prompts_file, tmp_path / "b", "training.max_steps=6",
                         *extra), resume_from=tmp_path / "b" / "checkpoints" / two.name, hub=hub)
    four = {p.name[-3:]: p for p in checkpoint.list_checkpoints(resumed)}["gs4"]
    a = _adapters(next(p for p in checkpoint.list_checkpoints(straight)
                       if p.name.endswith("gs4")))
    b = _adapters(four)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7)
    assert checkpoint.load_state(four).total_updates == 4
    assert any("horizon of the run's first launch (4 updates)" in m for m in hub.messages)


def test_model_quantize_trains_lora_on_a_4bit_base(micro_model, prompts_file, tmp_path):
    """model.quantize: 4 (the seed's model.use_4bit) quantizes the base at load; the adapters
    sit on quantized layers and train."""
    import mlx.nn as nn

    from mlx_rlaif.backends.ops import mlx_ops
    from mlx_rlaif.config import check

    cfg = _cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=2",
               "model.quantize=4")
    policy = mlx_ops().load(cfg)
    q = policy.model.layers[0].self_attn.q_proj
    assert isinstance(q.linear, nn.QuantizedLinear) and q.linear.bits == 4
    hub = RecordingHub()
    run_dir = train(cfg, hub=hub)
    assert hub.steps[-1][1]["optim/grad_norm"] > 0 and hub.steps[-1][1]["kl/mean"] > 0
    start = _adapters(checkpoint.latest_checkpoint(run_dir))
    assert any(np.abs(v).max() > 0 for k, v in start.items() if k.endswith("lora_b"))
    with pytest.raises(ConfigError, match="MLX-only"):
        check(_cfg(micro_model, prompts_file, tmp_path / "x", "model.quantize=4",
                   "model.backend=torch"))


def test_skipped_updates_and_the_schedule_horizon_survive_a_checkpoint(tmp_path):
    """optim/skipped counts for the whole run: the count is loop state, saved and restored (the
    old LoopState had no such field, so a resumed run restarted it at 0)."""
    state = checkpoint.LoopState(step=3, skipped=2, total_updates=40, kl_penalty=0.05)
    ckpt = checkpoint.write_checkpoint(tmp_path, "checkpoint-e1-b3-gs3", lambda d: None, {},
                                       state)
    assert checkpoint.load_state(ckpt) == state


def test_a_time_budget_ends_training_like_its_last_step(micro_model, prompts_file, tmp_path):
    """training.max_minutes: the loop stops after the step that passes it, saves the final
    checkpoint and runs the held-out evaluation as at the end."""
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=50",
                         "training.max_minutes=0.00001", f"data.eval_file={prompts_file}",
                         "data.eval_samples=1"), hub=hub)
    assert [s for s, _ in hub.steps] == [1]
    assert checkpoint.latest_checkpoint(run_dir).name == "checkpoint-final-gs1"
    assert any("time budget of 1e-05 min reached after 1 steps" in m for m in hub.messages)
    assert "after" in json.loads((run_dir / "eval.json").read_text())
