"""`mlx-rlaif summary` (table, CSV, PNG) and `mlx-rlaif export-dataset` on a real run directory."""

from __future__ import annotations

import argparse
import csv
import re
import struct

import pytest

from mlx_rlaif import cli
from mlx_rlaif.commands import export_dataset, summary
from mlx_rlaif.config import LoggingConfig
from mlx_rlaif.errors import UsageError
from mlx_rlaif.metrics import MetricsHub
from mlx_rlaif.metrics.dataset import to_row


def run_command(module, argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def metrics(step: int) -> dict[str, float]:
    return {
        "epoch": float((step + 1) // 2),
        "batch": float(step),
        "reward/mean": 0.1 * step + 0.01,
        "reward/std": 0.25,
        "reward/min": 0.0,
        "reward/max": 1.0,
        "kl/mean": 0.002 * step,
        "loss/total": 1.0 / step,
        "loss/policy": 0.5,
        "policy/clipfrac": 0.125,
        "gen/tokens_per_sec": 100.0 * step,
        "train/tokens_per_sec": 800.0,
        "time/step": 2.0,
    }


def completion(step: int, split: str, parts: dict) -> dict:
    return {
        "task_id": f"task-{step}",
        "prompt": f"Write f{step}.",
        "language": "python",
        "completion": f"Here:\n```python\ndef f{step}():\n    return {step}\n```",
        "reward": 0.5 if parts else None,
        "parts": parts,
        "advantage": -0.25,
        "reason": "ok",
        "rationale": "Fine." if parts else None,
        "truncated": step == 3,
        "teacher_code": "def f(): pass" if split == "validation" else None,
        "teacher_score": 0.875 if split == "validation" else None,
        "split": split,
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory written by the metrics hub: 4 steps in 2 epochs, 3 splits."""
    path = tmp_path_factory.mktemp("run")
    hub = MetricsHub.create(
        LoggingConfig(tensorboard=False),
        path,
        interactive=False,
        total_steps=4,
        hparams={"model": {"path": "models/tiny"}},
        resume=False,
    )
    for step in (1, 2, 3, 4):
        hub.log_step(step, metrics(step))
        hub.log_samples(
            step,
            [
                completion(step, "train", {"tests": 1.0, "build": 1.0}),
                completion(step, "train", {}),
                completion(step, "evaluation", {"judge": 0.75}),
                completion(step, "validation", {"tests": 0.0}),
            ],
        )
        if step % 2 == 0:
            hub.end_epoch(step // 2)
    hub.close()
    return path


def test_commands_are_registered():
    assert cli.COMMANDS["summary"] == "summary"
    assert cli.COMMANDS["export-dataset"] == "export_dataset"


def test_summary_table_and_csv(run_dir, tmp_path, capsys):
    out_csv = tmp_path / "b.csv"
    assert run_command(summary, [str(run_dir), "--tail", "2", "--csv-out", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "batch: 2 of 4" in text and "reward/" in text and "mean" in text
    assert re.search(r"\b0\.31\b", text) and re.search(r"\b0\.41\b", text)  # steps 3, 4
    assert not re.search(r"\b0\.(11|21)\b", text)  # steps 1 and 2 are beyond the tail
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]  # the CSV holds every record
    assert float(rows[2]["reward/mean"]) == pytest.approx(0.31)
    assert float(rows[3]["kl/mean"]) == 0.008
    assert "memory/rss_gb" in rows[0] and "timestamp" in rows[0]


def test_summary_epochs(run_dir, capsys):
    assert run_command(summary, [str(run_dir), "--type", "epoch", "--tail", "0"]) == 0
    text = capsys.readouterr().out
    assert "epoch: 2 of 2" in text
    assert re.search(r"\b0\.16\b", text) and re.search(r"\b0\.36\b", text)  # epoch means


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_summary_plot(run_dir, tmp_path):
    pytest.importorskip("matplotlib")  # a dev extra: without it the command says so (below)
    for kind in ("batch", "epoch"):
        out = tmp_path / f"{kind}.png"
        assert run_command(summary, [str(run_dir), "--type", kind, "--plot", str(out)]) == 0
        assert png_size(out) == (1100, 700)  # figsize 11 x 7 inches at 100 dpi
        assert curve_pixels(out) > 500  # curves were drawn, not just empty axes


def test_summary_plot_without_matplotlib_says_what_to_install(run_dir, tmp_path, monkeypatch):
    import sys

    from mlx_rlaif.errors import UsageError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    out = tmp_path / "batch.png"
    with pytest.raises(UsageError, match="pip install matplotlib"):  # the CLI exits with 2
        run_command(summary, [str(run_dir), "--plot", str(out)])
    assert not out.exists()


def curve_pixels(path) -> int:
    """Pixels in matplotlib's first line colour (C0, #1f77b4)."""
    from matplotlib.image import imread

    rgb = (imread(str(path))[..., :3] * 255).round()
    return int((abs(rgb - (31, 119, 180)).max(axis=-1) < 8).sum())


def test_summary_of_a_missing_run(tmp_path):
    with pytest.raises(UsageError, match="batches.jsonl not found"):
        run_command(summary, [str(tmp_path / "nope")])


def test_export_dataset_loads_with_datasets(run_dir, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "ds"
    assert run_command(export_dataset, [str(run_dir), "--out", str(out)]) == 0
    assert "train 8, validation 4, evaluation 4" in capsys.readouterr().out
    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    assert {k: len(v) for k, v in ds.items()} == {"train": 8, "validation": 4, "evaluation": 4}
    first = ds["train"][0]
    assert first["prompt"] == "Write f1." and first["student_code"] == "def f1():\n    return 1"
    assert first["scoring_breakdown"] == {"build": 1.0, "judge": None, "tests": 1.0}
    assert first["reward"] == 0.5 and first["rationale"] == "Fine."
    unscorable = ds["train"][1]
    assert unscorable["reward"] is None and unscorable["scoring_breakdown"] is None
    assert ds["validation"][0]["teacher_score"] == 0.875
    assert ds["validation"][0]["teacher_code"] == "def f(): pass"
    assert ds["train"][4]["truncated"] is True  # step 3
    card = (out / "README.md").read_text()
    assert "model: models/tiny" in card and "| train | 8 |" in card


def test_export_from_samples_when_no_dataset_was_collected(tmp_path):
    datasets = pytest.importorskip("datasets")
    run = tmp_path / "run"
    hub = MetricsHub.create(
        LoggingConfig(tensorboard=False, collect_dataset=False),
        run,
        interactive=False,
        total_steps=1,
        hparams={},
        resume=False,
    )
    hub.log_step(1, metrics(1))
    hub.log_samples(1, [completion(1, "train", {"tests": 1.0})])
    hub.close()
    assert run_command(export_dataset, [str(run), "--out", str(tmp_path / "ds")]) == 0
    ds = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "cache"))
    assert list(ds) == ["train"] and ds["train"][0]["task_id"] == "task-1"


def test_export_of_an_empty_run(tmp_path):
    with pytest.raises(UsageError, match="neither datasets/ nor samples.jsonl"):
        run_command(export_dataset, [str(tmp_path), "--out", str(tmp_path / "ds")])


def test_to_row_extracts_the_code_and_keeps_none():
    row = to_row(completion(2, "train", {}), "2025-01-01T00:00:00")
    assert row["student_code"] == "def f2():\n    return 2"
    assert row["reward"] is None and row["scoring_breakdown"] is None
    assert row["step"] == 0  # samples carry the step the hub adds; this one has none
