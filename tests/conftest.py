"""Shared fixtures: tiny random-weight models built once per session (no download).

MLX_RLAIF_TEST_DTYPE (default float32; bfloat16 or float16) is the dtype the tiny models are
stored in: the `micro_model` and `tiny_model` fixtures, and `builtin:tiny-coder` (within this
process, a copy of the shipped model in that dtype stands in for it). tests/test_metal_path.py
sets it, with MLX_RLAIF_CPU_KERNELS=0, to run the core training tests on the path Metal takes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_rlaif.cpu.blas import fast_blas_active, find_fast_blas, maybe_reexec_with_fast_blas
from mlx_rlaif.testing.randmodel import make_model_dir

ROOT = Path(__file__).resolve().parent.parent
# tests/data holds inputs, not this project's tests: the fixture repository's own pytest suite
# (data/repo_fixture/tests) runs only inside `mlx-rlaif data from-repo`'s sandbox. Ignored here,
# not by a conftest.py of tests/data: a second module named `conftest` shadowed this one for
# `from conftest import ...` in the suite's other files.
collect_ignore = ["data"]
DTYPE_VAR = "MLX_RLAIF_TEST_DTYPE"
TEST_DTYPE = os.environ.get(DTYPE_VAR) or "float32"
if TEST_DTYPE not in ("float32", "bfloat16", "float16"):
    raise pytest.UsageError(f"{DTYPE_VAR}={TEST_DTYPE}: use float32, bfloat16 or float16")


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
    return make_model_dir(tmp_path_factory.mktemp("micro") / "model", "micro", seed=3,
                          dtype=TEST_DTYPE)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark's tiny shape: 4 layers, width 256, vocab 4096."""
    return make_model_dir(tmp_path_factory.mktemp("tiny") / "model", "tiny", seed=4,
                          dtype=TEST_DTYPE)


def cast_model_dir(src: Path, dst: Path, dtype: str) -> Path:
    """A copy of the model directory `src` with its floating-point weights in `dtype`."""
    import mlx.core as mx

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in src.glob("*.safetensors"):
        weights = {k: v.astype(getattr(mx, dtype)) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in mx.load(str(f)).items()}
        mx.save_safetensors(str(dst / f.name), weights, {"format": "mlx"})
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "torch_dtype": dtype}, indent=2))
    return dst


@pytest.fixture(scope="session", autouse=True)
def builtin_in_test_dtype(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under MLX_RLAIF_TEST_DTYPE, `builtin:tiny-coder` resolves to a copy in that dtype (this
    process only: a subprocess a test starts loads the shipped float32 model)."""
    if TEST_DTYPE == "float32":
        yield
        return
    from mlx_rlaif import assets

    copy = cast_model_dir(assets.HERE / "tiny-coder",
                          tmp_path_factory.mktemp("builtin") / "tiny-coder", TEST_DTYPE)
    shipped = assets.resolve_model

    def resolve(path: str) -> str:
        return str(copy) if path == f"{assets.PREFIX}tiny-coder" else shipped(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(assets, "resolve_model", resolve)
        yield


@pytest.fixture(scope="session")
def learning_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """tests/test_learning.py's run, once per session: `mlx-rlaif train` (a subprocess) with the
    quickstart's settings from the shipped tiny model, float base, seed 0, 16 RL steps on the
    train tasks of four easy families, held-out eval of the same families before and after
    (8 samples each). Returns the run directory and the CLI's stdout + stderr. Read-only for the
    tests that use it: test_learning.py, and test_qlora.py's float-base half."""
    import subprocess

    from test_learning import _subset

    tmp = tmp_path_factory.mktemp("learning")
    out = tmp / "run"
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--config", "configs/quickstart.yaml",
           "--output-dir", str(out), "--no-dashboard", "--max-steps", "16",
           "--train-file", str(_subset("synthetic-train", tmp / "train.jsonl")),
           "--eval-file", str(_subset("synthetic-eval", tmp / "eval.jsonl")),
           "--set", "data.eval_samples=8", "--set", "data.difficulties=[]"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out, r.stdout + r.stderr


@pytest.fixture()
def prompts_file(tmp_path: Path) -> Path:
    """Seed-format task lines: prompt + language only."""
    p = tmp_path / "tasks.jsonl"
    lines = [{"prompt": f"Write a Python function number {i} that returns {i}.",
              "language": "python"} for i in range(6)]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p
