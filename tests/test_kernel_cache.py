"""The first run on a fresh machine says it compiles MLX's kernels, and where they are kept
(backends/mlx/kernel_cache.py); a warm cache, or Metal, says nothing."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_rlaif.backends.mlx import kernel_cache


@pytest.fixture()
def tmp_temp(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return tmp_path


def test_cpu_cold_then_warm(tmp_temp):
    line = kernel_cache.first_run_line("cpu", "0.32.4", env={})
    assert line is not None and "compile its CPU kernels" in line
    assert str(tmp_temp / "mlx" / "0.32.4" / "cpu") in line
    (tmp_temp / "mlx" / "0.32.4" / "cpu").mkdir(parents=True)
    assert kernel_cache.first_run_line("cpu", "0.32.4", env={}) is not None  # empty: still cold
    (tmp_temp / "mlx" / "0.32.4" / "cpu" / "kernel.so").write_bytes(b"x")
    assert kernel_cache.first_run_line("cpu", "0.32.4", env={}) is None


def test_cuda_honours_mlx_ptx_cache_dir(tmp_temp):
    line = kernel_cache.first_run_line("cuda", "0.32.4", env={"MLX_PTX_CACHE_DIR": "/x/ptx"})
    assert "CUDA kernels (NVRTC)" in line and "/x/ptx" in line and "MLX_PTX_CACHE_DIR" in line
    assert kernel_cache.cache_dir("cuda", "1.0", env={}) == tmp_temp / "mlx" / "1.0" / "ptx"


def test_metal_says_nothing(tmp_temp):
    assert kernel_cache.first_run_line("metal", "0.32.4", env={}) is None


@pytest.mark.slow
def test_the_cpu_cache_is_where_mlx_writes_it(tmp_temp):
    """A compiled function run on MLX's CPU build fills the folder cache_dir names."""
    if mx.default_device() != mx.cpu:
        pytest.skip("MLX's CPU build only")
    import subprocess
    import sys

    code = ("import mlx.core as mx\n"
            "f = mx.compile(lambda x: mx.exp(x) * 3.5 + mx.sin(x))\n"
            "mx.eval(f(mx.arange(64, dtype=mx.float32)))\n")
    path = kernel_cache.cache_dir("cpu", mx.__version__)
    assert kernel_cache.is_cold(path)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert not kernel_cache.is_cold(path)
