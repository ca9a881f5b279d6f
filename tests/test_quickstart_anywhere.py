"""The quickstart from any directory and from a non-editable install: the built wheel installed
into a fresh virtual environment (with --no-deps; the venv sees the packages of the interpreter
running the tests, never its base interpreter's: on a fresh machine the base has none),
then `mlx-rlaif train` in an empty directory runs the shipped quickstart config on the shipped
model and writes its run directory there."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def see_our_packages(py: Path) -> None:
    """Let the venv of `py` import this interpreter's packages (mlx, numpy, ...) after its own.

    `venv --system-site-packages` would not do: from inside a venv it exposes the *base*
    interpreter's site-packages, not the venv's. Plain path lines in a .pth file add the
    directories without running their own .pth files (so this checkout's editable install does
    not shadow the wheel's copy)."""
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    theirs = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    (Path(theirs) / "_outer_packages.pth").write_text("".join(f"{p}\n" for p in ours))


@pytest.mark.slow
def test_wheel_runs_the_quickstart_in_an_empty_directory(tmp_path: Path) -> None:
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "empty"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(ROOT)], check=True,
                   cwd=tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    see_our_packages(py)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(next(dist.glob("*.whl")))], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(py), "-c", "import mlx_rlaif; print(mlx_rlaif.__file__)"],
                           capture_output=True, text=True, env=env, cwd=work, check=True)
    assert where.stdout.startswith(str(venv))  # the wheel's copy, not this checkout's
    run = subprocess.run([str(venv / "bin" / "mlx-rlaif"), "train", "--max-steps", "2",
                          "--set", "data.eval_samples=1", "--no-dashboard"],
                         capture_output=True, text=True, env=env, cwd=work, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    run_dir = work / "runs" / "quickstart"
    assert (run_dir / "checkpoints" / "checkpoint-final-gs2" / "adapters.safetensors").is_file()
    evals = json.loads((run_dir / "eval.json").read_text())
    assert evals["before"]["tasks"] == 40 and "after" in evals  # the quickstart's held-out set
    saved = json.loads((run_dir / "checkpoints" / "checkpoint-final-gs2" /
                        "adapter_config.json").read_text())
    assert saved["base_model"] == "builtin:tiny-coder"
