"""QLoRA trains as the float base does: the shipped tiny model quantized to 4 bits at load
(`model.quantize: 4`: adapters on the quantized layers, decoding unfused, the reference the
quantized base) and the float model, same seed, 16 RL steps on the train tasks of four easy
families. The float run is test_learning.py's run itself (tests/conftest.py's `learning_run`,
made once per session and read by both). On both: every loss finite, the adapters moved, the
reward of the last steps above the first's, and held-out pass@1 raised by test_learning's
margin."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from test_learning import MARGIN, _subset

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.metrics.jsonl import read_jsonl
from mlx_rlaif.train import train

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, bits: int) -> tuple[list[dict], dict, Path]:
    cfg = load(ROOT / "configs" / "quickstart.yaml", [
        f"model.quantize={bits}", f"training.output_dir={tmp / f'run{bits}'}",
        "training.max_steps=16", f"data.train_file={_subset('synthetic-train', tmp / 't.jsonl')}",
        f"data.eval_file={_subset('synthetic-eval', tmp / 'e.jsonl')}", "data.eval_samples=8",
        "data.difficulties=[]", "logging.dashboard=false", "logging.tensorboard=false",
        "logging.collect_dataset=false"])
    run_dir = train(replace(cfg))
    evals = json.loads((run_dir / "eval.json").read_text())
    return list(read_jsonl(run_dir / "batches.jsonl")), evals, run_dir


@pytest.mark.slow
def test_4bit_base_trains_as_the_float_base(tmp_path: Path,
                                            learning_run: tuple[Path, str]) -> None:
    float_dir = learning_run[0]
    float_run = (list(read_jsonl(float_dir / "batches.jsonl")),
                 json.loads((float_dir / "eval.json").read_text()), float_dir)
    for bits in (0, 4):
        steps, evals, run_dir = float_run if bits == 0 else _run(tmp_path, bits)
        rewards = [s["reward/mean"] for s in steps]
        assert len(steps) == 16 and all(math.isfinite(s["loss/total"]) for s in steps)
        assert sum(rewards[-4:]) > sum(rewards[:4]), (bits, rewards)
        gain = evals["after"]["pass@1"] - evals["before"]["pass@1"]
        assert gain >= MARGIN, (bits, evals)
        adapters = mx.load(str(checkpoint.latest_checkpoint(run_dir) / "adapters.safetensors"))
        moved = sum(float(mx.abs(v).sum()) for k, v in adapters.items() if k.endswith("lora_b"))
        assert moved > 0, bits
        if bits:
            weights = [s["memory/mlx_peak_gb"] for s in steps]
            assert max(weights) > 0
