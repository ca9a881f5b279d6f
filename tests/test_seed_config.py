"""The seed trainer's config layout: its documented configs load unchanged (tests/data/
seed_config.yaml, transcribed from ../shared/reference/002), keys the one-process design makes
pointless are accepted with one line each, keys with no equivalent are refused, `mlx-rlaif
migrate-config` prints the equivalent in our layout, gradient accumulation equals one step on the
combined batch, and the seed config trains the tiny model for 2 steps."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import yaml
from recording_hub import RecordingHub

from mlx_rlaif import cli
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.config.seed import NOTES, translate
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.train.distributed import World

SEED = Path(__file__).parent / "data" / "seed_config.yaml"


def test_the_seed_config_loads_unchanged_with_a_line_per_pointless_key(caplog):
    logger = logging.getLogger("mlx_rlaif")  # the CLI stops its propagation to the root
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="mlx_rlaif"):
            cfg = load(SEED)
    finally:
        logger.removeHandler(caplog.handler)
    t = cfg.training
    assert (t.batch_size, t.gradient_accumulation_steps, t.save_total_limit) == (2, 16, 3)
    assert t.save_every_batches == 500 and t.save_every_epochs == 1
    assert cfg.generation.num_samples_per_prompt == 2
    assert cfg.logging.baseline_eval_batches == 2 and cfg.logging.collect_dataset
    lines = sorted(set(caplog.messages))  # the handler may see a line twice (propagation)
    for key in ("hardware.use_mlx_for_generation", "hardware.reload_mlx_from_latest_checkpoint",
                "hardware.use_mlx_generation_worker", "hardware.mlx_model_path",
                "model.max_length", "logging.save_json_summaries"):
        (line,) = [m for m in lines if f"{key}: no longer applies: " in m]
        assert NOTES[key] in line and "\n" not in line


@pytest.mark.parametrize(("raw", "message"), [
    ({"huggingface": {"upload_datasets": True}}, "mlx-rlaif export-dataset RUN"),
    ({"huggingface": {"upload_to_hub": True}}, "set huggingface.upload_to_hub to false"),
    ({"rlaif": {"reward_clip": 1.0}}, "rlaif.reward_clip (the seed trainer's layout) has no "
                                      "equivalent here"),
    ({"hardware": {"use_tpu": True}}, "hardware.use_tpu"),
])
def test_keys_with_no_equivalent_are_refused_by_name(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        translate(raw)


def test_mapped_keys_land_in_our_layout():
    raw, _ = translate({"model": {"name": "org/model", "use_4bit": True},
                        "teacher": {"provider": "anthropic", "model": "claude-3-5-haiku-latest"},
                        "rlaif": {"kl_penalty": 0.05, "correctness_weight": 0.5,
                                  "documentation_weight": 0.5, "max_new_tokens": 64},
                        "training": {"save_steps": 10, "save_every_batches": 4}})
    assert raw["model"] == {"path": "org/model", "quantize": 4}
    assert raw["reward"] == {"teacher": {"provider": "anthropic",
                                         "model": "claude-3-5-haiku-latest",
                                         "criteria": {"correctness": 0.5,
                                                      "documentation": 0.5},
                                         "mode": "ratio"}, "type": "teacher"}
    assert raw["rl"] == {"kl_penalty": 0.05} and raw["generation"] == {"max_new_tokens": 64}
    assert raw["training"]["save_every_batches"] == 4  # the finer of the two


def test_our_own_layout_passes_through():
    raw = {"rl": {"kl_penalty": 0.1}, "training": {"batch_size": 3}}
    assert translate(raw) == (raw, [])


def test_migrate_config_prints_a_config_that_loads_the_same(tmp_path, capsys):
    assert cli.main(["migrate-config", str(SEED)]) == 0
    text = capsys.readouterr().out
    assert "# hardware.use_mlx_generation_worker: no longer applies" in text
    out = tmp_path / "new.yaml"
    out.write_text(text)
    assert "hardware" not in yaml.safe_load(text)
    assert load(out) == load(SEED)
    bad = tmp_path / "bad.yaml"
    bad.write_text("huggingface:\n  upload_to_hub: true\n")
    assert cli.main(["migrate-config", str(bad)]) == 2


def _deterministic_sampling(monkeypatch):
    """Each task sampled alone from its own seed: the rollouts do not depend on how the tasks
    are batched, so two batchings of the same prompts can be compared exactly."""
    from mlx_rlaif.train.run import Run

    real = Run.sample

    def per_task(self, tasks, seed, on_group=None):
        outs = [real(self, [t], 1000 + int(t.id[1:]) + 100 * self.state.step, on_group)
                for t in tasks]
        stats = outs[0][1]
        return [r for rs, _ in outs for r in rs], stats

    monkeypatch.setattr(Run, "sample", per_task)


KL_ROUNDING = 4 * 16 * 2.0 ** -24  # 4 ulps of a float32 log-prob of magnitude up to 16


def test_gradient_accumulation_equals_one_step_on_the_combined_batch(micro_model, tmp_path,
                                                                     monkeypatch):
    from mlx_rlaif.train import train

    _deterministic_sampling(monkeypatch)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "t{i}", "prompt": "Write a function number {i}."}}\n'
                             for i in range(8)))

    def run(out, *extra):
        hub = RecordingHub()
        cfg = load(None, [f"model.path={micro_model}", f"data.train_file={tasks}",
                          f"training.output_dir={out}", "reward.type=syntax",
                          "generation.max_new_tokens=10", "generation.num_samples_per_prompt=2",
                          "rl.drop_zero_std=false", "rl.entropy_coef=0.05",
                          "training.learning_rate=0.02", "training.max_steps=2",
                          "data.shuffle=false", *extra])
        ckpt = checkpoint.latest_checkpoint(train(cfg, hub=hub))
        return {k: np.array(v) for k, v in mx.load(str(ckpt / checkpoint.ADAPTERS)).items()}, hub

    whole, a = run(tmp_path / "a", "training.batch_size=4")
    accumulated, b = run(tmp_path / "b", "training.batch_size=2",
                         "training.gradient_accumulation_steps=2")
    assert [m["train/sequences"] for _, m in b.steps] == [8.0, 8.0]  # 2 x 2 prompts x G
    for (_, ma), (_, mb) in zip(a.steps, b.steps, strict=True):  # same loss, same gradient
        for key in ("loss/total", "optim/grad_norm", "train/tokens"):
            assert mb[key] == pytest.approx(ma[key], rel=1e-4), key
        # kl/mean is a mean of logp - ref_logp, two float32 passes that agree exactly in
        # theory on step 1 (no adapter yet): it is their rounding, a few ulps of a log-prob
        # (|logp| < 16 here: ulp 1.9e-6), 0.0 or 8.3e-08 by the summation order of the machine
        assert mb["kl/mean"] == pytest.approx(ma["kl/mean"], rel=1e-4, abs=KL_ROUNDING)
    # Adam's first steps are ~lr * sign(g): where g is float noise (summed in another order
    # over two micro-batches) its sign can flip, so a few weights may differ by up to 2 steps
    # x 2 lr (one of 512 did when the decoding loop changed the recorded log-probs' rounding);
    # the rest agree to 1e-3
    for k in whole:
        off = ~np.isclose(accumulated[k], whole[k], rtol=1e-3, atol=1e-3)
        assert off.mean() <= 0.01, (k, off.mean())
        assert np.abs(accumulated[k] - whole[k]).max() <= 4 * 0.02, k
    assert max(np.abs(v).max() for k, v in whole.items() if k.endswith("lora_b")) > 0


def test_an_accumulated_step_samples_batch_size_prompts_at_a_time():
    from types import SimpleNamespace

    from mlx_rlaif.train.step import sample_chunks, step_seed

    calls = []

    def sample(tasks, seed, on_group=None):
        calls.append((list(tasks), seed))
        return [f"r{t}" for t in tasks], {"gen/tokens": 2.0, "gen/seconds": 1.0,
                                          "gen/tokens_per_sec": 2.0, "gen/decode_width": 4.0,
                                          "gen/decode_width_mean": 3.0}

    cfg = load(None, ["training.batch_size=2", "training.gradient_accumulation_steps=3"])
    run = SimpleNamespace(cfg=cfg, state=checkpoint.LoopState(step=5), sample=sample,
                          world=World())
    rollouts, stats = sample_chunks(run, [0, 1, 2, 3, 4, 5])
    assert calls == [([0, 1], step_seed(0, 5)), ([2, 3], None), ([4, 5], None)]
    assert rollouts == [f"r{i}" for i in range(6)]
    assert stats["gen/tokens"] == 6.0 and stats["gen/tokens_per_sec"] == 2.0
    assert stats["gen/decode_width"] == 4.0


@pytest.mark.slow
def test_the_seed_config_trains_the_tiny_model_for_two_steps(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "train", "--config", str(SEED),
         "--max-steps", "2", "--output-dir", str(tmp_path / "run"), "--no-dashboard",
         "--set", "data.languages=[python]", "--set", "generation.max_new_tokens=48"],
        capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "hardware.use_mlx_for_generation: no longer applies" in run.stderr
    assert "step 2/2" in run.stdout
    assert checkpoint.latest_checkpoint(tmp_path / "run").name == "checkpoint-final-gs2"
