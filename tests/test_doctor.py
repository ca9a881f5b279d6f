"""`mlx-rlaif doctor` end to end on a tiny model (subprocess, as a user runs it), a config that
does not fit its budget, and the sandbox self-test's checks failing where containment fails."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_rlaif.sandbox import Sandbox, selftest

ROOT = Path(__file__).resolve().parent.parent


def doctor(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "doctor", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_doctor_end_to_end(tiny_model: Path, prompts_file: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = doctor(cwd, "--model", str(tiny_model), "--set", "reward.type=syntax",
                  "--set", f"data.train_file={prompts_file}", "--set", "data.difficulties=[]",
                  "--set", "rl.drop_zero_std=false",
                  "--set", "generation.max_new_tokens=16", "--set", "training.batch_size=2")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    lines = {line.split()[0]: line for line in out.splitlines() if line[:1].strip()}
    assert {"device", "BLAS", "sandbox", "memory", "probe", "projected"} <= set(lines), out
    assert "trivial program: ok" in out and "killed at its time limit: ok" in out
    assert "FAILED" not in out
    assert "plan: weights" in lines["memory"] and "checkpointing off" in lines["memory"]
    # 2 steps of 2 prompts x 8 completions (the quickstart's G), every one trained
    assert "2 step(s) of" in lines["probe"] and "trained 32 sequences" in lines["probe"]
    # the quickstart's training.max_steps = 60: 6 tasks, 2 per step, cycled 20 times
    assert "; 60 steps:" in lines["projected"]
    assert list(cwd.iterdir()) == []  # nothing written where it ran (no runs/)


def test_doctor_says_a_config_does_not_fit(tmp_path: Path) -> None:
    proc = doctor(tmp_path, "--no-probe", "--set", "training.max_memory_gb=0.001")
    assert proc.returncode == 1
    memory_line = next(x for x in proc.stdout.splitlines() if x.startswith("memory"))
    assert "DOES NOT FIT" in memory_line and "training.max_memory_gb" in memory_line
    assert "probe" not in proc.stdout


def test_self_test_fails_where_containment_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    box = Sandbox("auto")
    held = {c.name: c.ok for c in selftest.self_test(box)}
    assert held["trivial program"] and held["killed at its time limit"]
    assert held["memory limit held"]
    monkeypatch.setattr(selftest, "LIMITS", replace(selftest.LIMITS, memory_mb=8192))
    broken = {c.name: c.ok for c in selftest.self_test(box)}
    assert broken["memory limit held"] is False
