"""`mlx-rlaif train` as a user runs it: a subprocess, 3 steps, metrics, the ETA in each plain
step line and a checkpoint that mlx-lm's own CLI loads; Ctrl-C saves a checkpoint; --resume
continues."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_rlaif.artifacts import checkpoint


def _train(model: Path, tasks: Path, out: Path, *extra: str, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(model),
           "--train-file", str(tasks), "--output-dir", str(out),
           "--set", "reward.type=syntax", "--set", "generation.max_new_tokens=8",
           "--set", "generation.num_samples_per_prompt=2", "--set", "rl.entropy_coef=0.05",
           "--set", "rl.drop_zero_std=false", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=out.parent, **kw)


def test_train_three_steps_with_an_eta_then_mlx_lm_generate_loads_the_adapter(
        micro_model, prompts_file, tmp_path):
    out = tmp_path / "run"
    proc = _train(micro_model, prompts_file, out, "--max-steps", "3")
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log
    lines = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and "reward/mean" in lines[0]
    # one plain line per step, each with the time so far and the ETA (0s at the last step)
    steps = re.findall(r"^step (\d)/3 \| elapsed (\S+) \| eta (\S+) \|", log, re.M)
    assert [s[0] for s in steps] == ["1", "2", "3"], log
    assert all(re.fullmatch(r"(\d+m)?\d+s", x) for s in steps for x in s[1:]), steps
    assert steps[-1][2] == "0s" and lines[-1]["time/eta_s"] == 0.0
    # the ETA at step 1: 2 steps left at the step's measured cost
    assert lines[0]["time/eta_s"] == pytest.approx(2 * lines[0]["time/step"], rel=0.5)
    ckpt = checkpoint.latest_checkpoint(out)
    assert ckpt is not None and (ckpt / "adapter_config.json").is_file()
    gen = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", "--model", str(micro_model),
         "--adapter-path", str(ckpt), "--prompt", "def add(a, b):", "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr


def test_ctrl_c_saves_a_checkpoint_and_resume_continues(micro_model, prompts_file, tmp_path):
    out = tmp_path / "run"
    proc = _train(micro_model, prompts_file, out, "--max-steps", "500",
                  "--set", "training.num_epochs=200", "--set", "training.save_every_epochs=0")
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "batches.jsonl").exists():
        time.sleep(0.2)
    assert (out / "batches.jsonl").exists(), "training never logged a step"
    proc.send_signal(signal.SIGINT)
    log, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log
    ckpt = checkpoint.latest_checkpoint(out)
    assert ckpt is not None and ckpt.name.startswith("checkpoint-final-gs")
    step = checkpoint.load_state(ckpt).step
    assert step >= 1
    resumed = _train(micro_model, prompts_file, out, "--resume", "--max-steps", str(step + 1))
    log2, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, log2
    assert checkpoint.load_state(checkpoint.latest_checkpoint(out)).step == step + 1
