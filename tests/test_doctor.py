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
    assert "a trivial program" in out and "killed at its time limit" in out
    assert "FAILED" not in out and "escaped" not in out.replace("0 escaped", "")
    assert "plan: weights" in lines["memory"] and "checkpointing off" in lines["memory"]
    # 3 steps of 2 prompts x 8 completions (the quickstart's G), every one trained
    assert "3 step(s) of" in lines["probe"] and "trained 48 sequences" in lines["probe"]
    assert "first " in lines["probe"] and "(it compiles), then " in lines["probe"]
    assert lines["install"].split()[1] == "mlx-cpu" and "FAILED" not in lines["install"]
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
    box = Sandbox("auto", slots=2, uid_base=64400)
    held = {r.name: r.verdict for r in selftest.needed_rows(box)}
    assert held["a trivial program"] == held["killed at its time limit"] == "ok"
    assert held["memory limit held"] == "ok"
    monkeypatch.setattr(selftest, "LIMITS", replace(selftest.LIMITS, memory_mb=8192))
    broken = {r.name: r.verdict for r in selftest.needed_rows(box)}
    assert broken["memory limit held"] == "FAILED"


def test_doctor_names_a_cuda_device_and_its_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_rlaif.backends.mlx import device
    from mlx_rlaif.commands import doctor as d

    h200 = device.Device("cuda", "NVIDIA H200", 150 * 2**30, 140 * 2**30, "9.0")
    monkeypatch.setattr(device, "current", lambda: h200)
    monkeypatch.setattr(device, "kind_of", lambda default=None: "cuda")
    line = d.device_line()
    assert "MLX 0.32.4, CUDA: NVIDIA H200 (compute capability 9.0), 150.0 GB (140.0 GB free)" \
        in line and "RAM" in line
    assert d.blas_line().startswith("cuBLAS and cuDNN through MLX's CUDA build")


def test_doctor_fails_a_mixed_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_rlaif import install
    from mlx_rlaif.commands import doctor as d

    monkeypatch.setattr(install, "installed_backends",
                        lambda: {"mlx-cpu": "0.32.4", "mlx-cuda-13": "0.32.4"})
    text, ok = d.install_line()
    assert not ok and text.startswith("FAILED: MLX's builds mlx-cpu 0.32.4 and mlx-cuda-13")
    monkeypatch.setattr(install, "installed_backends", lambda: {"mlx-cuda-13": "0.32.4"})
    assert d.install_line() == ("mlx-cuda-13 0.32.4 (CUDA 13)", True)


def test_the_projection_leaves_the_compiling_step_out() -> None:
    from mlx_rlaif.commands.doctor import projection

    # a GPU's first step compiles its kernels: 170 s, then 0.2 s steps
    assert projection([170.0, 0.21, 0.19, 0.2]) == (0.2, "")
    per_step, note = projection([170.0, 9.0, 0.2])  # step 2 compiled a new shape
    assert per_step == pytest.approx(4.6) and "an upper bound" in note and "0.20-9.00" in note
    assert projection([3.0])[1].startswith("; from one step")
