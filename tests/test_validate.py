"""`mlx-rlaif validate`: the comparison arithmetic by hand, and a real run of two tiny models
(the random base and an SFT adapter that learned to answer `x = 1`) scored by the syntax reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_rlaif import cli
from mlx_rlaif.commands.validate import compare, prompt_means
from mlx_rlaif.train import sft

PROMPTS = [f"Write a Python function number {i} that returns {i}." for i in range(4)]


@pytest.fixture()
def run_cli(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"validate": "validate", "fuse": "fuse"})
    return lambda *argv: cli.main([str(a) for a in argv])


def test_prompt_means_leave_unscored_completions_out():
    assert prompt_means([1.0, None, 0.0, 0.5, None, None], 2) == [1.0, 0.25, None]


def test_compare_by_hand():
    s = compare([0.0, 0.5, None, 1.0], [1.0, 0.5, 1.0, 0.5])
    # the prompt unscored on the baseline side is left out of both means
    assert s["baseline_mean"] == pytest.approx(0.5)
    assert s["fine_tuned_mean"] == pytest.approx(2 / 3)
    assert s["improvement"] == pytest.approx(1 / 6)
    assert s["improvement_pct"] == pytest.approx(100 / 3)
    assert (s["improved"], s["degraded"], s["equal"], s["unscored"]) == (1, 1, 1, 1)
    assert s["prompts"] == 4 and s["scored_prompts"] == 3
    zero = compare([0.0, 0.0], [1.0, 0.0])
    assert zero["improvement"] == 0.5 and zero["improvement_pct"] is None  # no % of 0


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, micro_model) -> Path:
    """An adapter that answers every prompt with `x = 1` (greedy)."""
    root = tmp_path_factory.mktemp("validate")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": "x = 1\n"}) + "\n"
                            for p in PROMPTS))
    cfg = sft.load_config(None, [f"model.path={micro_model}", f"sft.train_file={data}",
                                 f"training.output_dir={root / 'run'}", "training.batch_size=4",
                                 "training.num_epochs=40", "training.learning_rate=0.001",
                                 "lora.rank=4"])
    return sft.sft(cfg, log=lambda *a: None)


def test_validate_writes_its_report(micro_model, sft_run, tmp_path, run_cli, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "language": "python"}) + "\n"
                               for p in PROMPTS))
    out = tmp_path / "report" / "validation.json"
    assert run_cli("validate", "--baseline", micro_model, "--fine-tuned", sft_run,
                   "--prompts", prompts, "--reward", "syntax", "-n", "3",
                   "--max-new-tokens", "8", "--out", out) == 0
    rep = json.loads(out.read_text())
    s, ex = rep["summary"], rep["examples"]
    assert s["prompts"] == 3 and len(ex) == 3
    assert [e["fine_tuned"]["text"] for e in ex] == ["x = 1\n"] * 3
    assert s["fine_tuned_mean"] == 1.0
    base = [e["baseline"]["score"] for e in ex]
    assert s["baseline_mean"] == pytest.approx(sum(base) / 3) and s["baseline_mean"] < 1.0
    assert s["improvement"] == pytest.approx(1.0 - s["baseline_mean"])
    assert s["improved"] == sum(b < 1.0 for b in base) and s["degraded"] == 0
    assert s["improved"] + s["equal"] == 3
    for side in ("baseline", "fine_tuned"):
        assert rep[side]["tokens"] > 0 and rep[side]["tokens_per_sec"] > 0
    assert rep["settings"]["reward"] == "syntax" and rep["settings"]["seed"] == 0
    printed = capsys.readouterr().out
    assert "improved" in printed and "tokens/s" in printed and "x = 1" in printed

    # a fused model directory validates the same as base + adapters
    assert run_cli("fuse", sft_run, "--out", tmp_path / "fused") == 0
    out2 = tmp_path / "fused.json"
    assert run_cli("validate", "--baseline", micro_model, "--fine-tuned", tmp_path / "fused",
                   "--prompts", prompts, "--reward", "syntax", "-n", "3",
                   "--max-new-tokens", "8", "--out", out2) == 0
    rep2 = json.loads(out2.read_text())
    assert rep2["summary"] == s
    assert [e["fine_tuned"]["text"] for e in rep2["examples"]] == ["x = 1\n"] * 3


def test_validate_reports_a_missing_prompts_file(micro_model, sft_run, tmp_path, run_cli,
                                                  capsys):
    assert run_cli("validate", "--baseline", micro_model, "--fine-tuned", sft_run,
                   "--prompts", tmp_path / "nope.jsonl", "--reward", "syntax",
                   "--out", tmp_path / "r.json") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope.jsonl" in err
    assert not (tmp_path / "r.json").exists()
