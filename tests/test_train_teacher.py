"""Training with a teacher judge through the real SDK against a local fake API server:
the run's metrics carry teacher counters, a 401 or the cost budget stops the run cleanly with a
checkpoint, and the API key reaches no file the run writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_api import FakeAPI
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.train import train

CANARY = "sk-canary-0123456789abcdef"


def _cfg(model: Path, tasks: Path, out: Path, srv: FakeAPI, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=teacher", "reward.teacher.provider=openai", "reward.teacher.model=judge",
        f"reward.teacher.base_url={srv.openai_url}", "reward.teacher.api_key_env=CANARY_KEY",
        "generation.max_new_tokens=8", "generation.num_samples_per_prompt=2",
        "rl.drop_zero_std=false", "rl.entropy_coef=0.05", "logging.tensorboard=true",
        "training.num_epochs=5", *extra])


def _all_text(root: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file())


def test_teacher_run_logs_counters_and_never_writes_the_key(micro_model, prompts_file, tmp_path,
                                                            monkeypatch, caplog):
    monkeypatch.setenv("CANARY_KEY", CANARY)
    with FakeAPI(api_key=CANARY) as srv:
        from mlx_rlaif.metrics import MetricsHub  # the real hub: JSONL + TensorBoard files

        cfg = _cfg(micro_model, prompts_file, tmp_path / "run", srv, "training.max_steps=2")
        run_dir = train(cfg, hub=MetricsHub.create(cfg.logging, tmp_path / "run", False, 2, {},
                                                  resume=False))
        assert srv.hits() > 0
    text = _all_text(run_dir)
    assert "teacher/calls" in text and checkpoint.latest_checkpoint(run_dir) is not None
    assert CANARY not in text
    assert CANARY not in caplog.text


def test_401_stops_the_run_with_a_checkpoint(micro_model, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setenv("CANARY_KEY", "wrong-key")
    with FakeAPI(api_key=CANARY) as srv:
        hub = RecordingHub()
        run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", srv), hub=hub)
    assert any("stopping" in m and "401" in m for m in hub.messages), hub.messages
    ckpt = checkpoint.latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name.startswith("checkpoint-final")


def test_cost_budget_ends_the_run_cleanly(micro_model, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setenv("CANARY_KEY", CANARY)
    with FakeAPI(api_key=CANARY) as srv:
        hub = RecordingHub()
        run_dir = train(_cfg(micro_model, prompts_file, tmp_path / "run", srv,
                             "reward.teacher.max_cost_usd=0.5",
                             "reward.teacher.price_in_per_mtok=1000",
                             "reward.teacher.price_out_per_mtok=5000"), hub=hub)
    assert len(hub.steps) < 15  # 5 epochs x 3 batches would be 15 steps
    assert any("budget" in m for m in hub.messages), hub.messages
    assert checkpoint.latest_checkpoint(run_dir) is not None


def test_missing_key_is_a_config_error_before_the_model_loads(prompts_file, tmp_path,
                                                              monkeypatch):
    from mlx_rlaif.errors import ConfigError

    monkeypatch.delenv("CANARY_KEY", raising=False)
    cfg = load(None, [f"data.train_file={prompts_file}", "model.path=/no/such/model",
                      f"training.output_dir={tmp_path / 'run'}", "reward.type=teacher",
                      "reward.teacher.provider=anthropic", "reward.teacher.model=claude",
                      "reward.teacher.api_key_env=CANARY_KEY"])
    with pytest.raises(ConfigError, match="CANARY_KEY"):
        train(cfg, hub=RecordingHub())
    assert not (tmp_path / "run").exists()
