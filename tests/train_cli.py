"""Shared by the fault-injection tests (tests/test_faults_*.py): one training config, run either
in this process (`train`) or as the `mlx-rlaif train` subprocess a user runs, and the checks that
follow a fault: adapters, JSONL files read back, leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.metrics.jsonl import read_jsonl

DEFAULTS = Path(__file__).resolve().parent / "data" / "defaults.yaml"
# syntax reward (no sandbox), 2 prompts x 2 completions of 8 tokens, an update every step
# (entropy bonus, zero-variance groups kept), a checkpoint every step, 3 kept
SETS = ("reward.type=syntax", "generation.max_new_tokens=8", "generation.num_samples_per_prompt=2",
        "rl.entropy_coef=0.05", "rl.drop_zero_std=false", "training.learning_rate=0.01",
        "training.num_epochs=200", "training.save_every_batches=1", "training.save_total_limit=3",
        "logging.tensorboard=false")


def config(model: Path, tasks: Path, out: Path, steps: int, *extra: str):
    return load(None, [f"model.path={model}", f"data.train_file={tasks}",
                       f"training.output_dir={out}", f"training.max_steps={steps}", *SETS, *extra])


def command(model: Path, tasks: Path, out: Path, steps: int, *extra: str,
            resume: bool = False) -> list[str]:
    """`mlx-rlaif train` with the same settings as `config` (an empty --config: the defaults,
    not the quickstart the CLI starts from without one)."""
    sets = [a for s in (*SETS, *extra) for a in ("--set", s)]
    return [sys.executable, "-m", "mlx_rlaif.cli", "train", "--config", str(DEFAULTS),
            "--model", str(model),
            "--train-file", str(tasks), "--output-dir", str(out), "--max-steps", str(steps),
            "--no-dashboard", *sets, *(["--resume"] if resume else [])]


def env(fault: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment with the worktree first on PYTHONPATH and MLX_RLAIF_FAULT set
    (or unset)."""
    e = {**os.environ, **extra}
    root = str(Path(__file__).resolve().parent.parent)
    e["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    e.pop("MLX_RLAIF_FAULT", None)
    if fault:
        e["MLX_RLAIF_FAULT"] = fault
    return e


def run_cli(cmd: list[str], cwd: Path, fault: str | None = None, timeout: float = 300,
            **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(fault, **extra_env), capture_output=True,
                          text=True, timeout=timeout)


def adapters(ckpt: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(ckpt / checkpoint.ADAPTERS)).items()}


def assert_same_adapters(a: Path, b: Path) -> None:
    wa, wb = adapters(a), adapters(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], atol=1e-6, err_msg=k)


def jsonl_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob("*.jsonl"))


def strict_records(path: Path) -> list[dict]:
    """Every line of a JSONL file parses (no torn line anywhere, the last included)."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path}: torn last line"
    return [json.loads(line) for line in text.splitlines()]


def readable(run_dir: Path) -> dict[str, int]:
    """Records per JSONL file, read as `summary` reads them (a torn last line is skipped)."""
    return {p.name: len(read_jsonl(p)) for p in jsonl_files(run_dir)}


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files and directories of the run (a checkpoint write cut short, ...)."""
    return sorted(p.name for p in run_dir.rglob("*") if ".tmp" in p.name)
