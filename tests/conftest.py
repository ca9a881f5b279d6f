"""Shared fixtures: tiny random-weight models built once per session (no download)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlx_rlaif.cpu.blas import fast_blas_active, find_fast_blas, maybe_reexec_with_fast_blas
from mlx_rlaif.testing.randmodel import make_model_dir

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """MLX's Linux CPU wheel bundles a reference BLAS: run the suite again with the system
    OpenBLAS preloaded (about 15x faster matmuls) when it is installed. No-op on macOS and where it is
    already preloaded (see mlx_rlaif/blas.py)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if sys.platform.startswith("linux") and not fast_blas_active() and find_fast_blas():
        if capture is not None:
            capture.stop_global_capturing()  # give the new process the real stdout/stderr
        maybe_reexec_with_fast_blas(list(sys.orig_argv))


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers, width 64, vocab 512: fast enough for many forward/backward passes."""
    return make_model_dir(tmp_path_factory.mktemp("micro") / "model", "micro", seed=3)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark's tiny shape: 4 layers, width 256, vocab 4096."""
    return make_model_dir(tmp_path_factory.mktemp("tiny") / "model", "tiny", seed=4)


@pytest.fixture()
def prompts_file(tmp_path: Path) -> Path:
    """Seed-format task lines: prompt + language only."""
    p = tmp_path / "tasks.jsonl"
    lines = [{"prompt": f"Write a Python function number {i} that returns {i}.",
              "language": "python"} for i in range(6)]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p
