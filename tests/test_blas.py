"""The fast BLAS preload (mlx_rlaif/blas.py) changes speed, not results.

Two child processes run the same matmuls and model forward, one with the system OpenBLAS
preloaded and one with MLX's bundled reference BLAS, and must agree within float32 tolerance;
each child reports whether OpenBLAS is mapped into it, so the test fails if the preload did not
happen (or leaked into the reference run). Skipped where no OpenBLAS is installed (macOS, or
Linux without libopenblas0-pthread).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_rlaif.cpu.blas import default_threads, fast_blas_env, find_fast_blas, without_fast_blas

_CHILD = r"""
import sys
import numpy as np
import mlx.core as mx
from mlx_lm import load

rng = np.random.default_rng(0)
a = mx.array(rng.standard_normal((300, 260)).astype(np.float32))
b = mx.array(rng.standard_normal((260, 270)).astype(np.float32))
v = mx.array(rng.standard_normal((8, 260)).astype(np.float32))
model, _ = load(sys.argv[1])
tokens = mx.array(rng.integers(3, 500, size=(3, 17)).astype(np.int32))
maps = open("/proc/self/maps").read()
np.savez(sys.argv[2], matmul=np.array(a @ b), gemv=np.array(v @ b), logits=np.array(model(tokens)),
         openblas=np.array("libopenblas" in maps))
"""

needs_openblas = pytest.mark.skipif(
    not sys.platform.startswith("linux") or find_fast_blas() is None,
    reason="no system OpenBLAS to preload (apt-get install libopenblas0-pthread)")


def _run(model: Path, out: Path, env: dict[str, str]) -> dict[str, np.ndarray]:
    subprocess.run([sys.executable, "-c", _CHILD, str(model), str(out)], env=env, check=True,
                   timeout=300)
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


@needs_openblas
def test_openblas_gives_the_same_numbers(micro_model: Path, tmp_path: Path):
    plain = without_fast_blas()  # conftest may have preloaded it
    fast_env = fast_blas_env(plain)
    assert fast_env is not None
    fast = _run(micro_model, tmp_path / "fast.npz", fast_env)
    slow = _run(micro_model, tmp_path / "slow.npz", {**plain, "MLX_RLAIF_FAST_BLAS": "0"})
    assert bool(fast["openblas"]) and not bool(slow["openblas"])
    for key in ("matmul", "gemv", "logits"):
        assert np.isfinite(fast[key]).all()
        np.testing.assert_allclose(fast[key], slow[key], rtol=1e-4, atol=1e-4, err_msg=key)


@needs_openblas
def test_fast_env_prepends_the_library_and_sets_threads():
    env = fast_blas_env({"LD_PRELOAD": "/opt/other.so", "PATH": "/bin"})
    assert env is not None
    assert env["LD_PRELOAD"] == f"{find_fast_blas()}:/opt/other.so"
    assert env["OPENBLAS_NUM_THREADS"] == str(default_threads())
    assert env["PATH"] == "/bin"
    kept = fast_blas_env({"OPENBLAS_NUM_THREADS": "3"})
    assert kept is not None and kept["OPENBLAS_NUM_THREADS"] == "3"  # the user's choice wins


def test_opt_out_and_thread_default():
    assert fast_blas_env({"MLX_RLAIF_FAST_BLAS": "0"}) is None
    assert [default_threads(n) for n in (1, 2, 3, 8)] == [1, 1, 1, 4]
