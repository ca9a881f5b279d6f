"""The path Metal takes, minus Metal: the core training tests run again in a pytest subprocess
with MLX_RLAIF_CPU_KERNELS=0 (mlx-lm's own attention, SwiGLU, RoPE, sampler and loss
exponentials, as on Apple silicon and CUDA) on bfloat16 tiny models (MLX_RLAIF_TEST_DTYPE, which
tests/conftest.py's model fixtures and `builtin:tiny-coder` honour): what most published
checkpoints are stored in.

Covered (`CORE`): the loop (metrics, checkpoint), an exact resume, PPO-GAE with an EMA reference
and its resume, two-turn training and its resume, off-policy guidance, dynamic sampling with
the curriculum and their resume, and a two-rank update against the one-process one
(`mlx.launch` on loopback; its ranks load the fixture's bfloat16 model).
Not covered: Metal's own kernels and memory behaviour, the torch backend, quantized models,
the two-rank CLI runs (their subprocesses load the shipped float32 `builtin:tiny-coder`), and
every other test of the suite (run it with the two variables set for all of them:
`MLX_RLAIF_CPU_KERNELS=0 MLX_RLAIF_TEST_DTYPE=bfloat16 python3 -m pytest`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import DTYPE_VAR, TEST_DTYPE

from mlx_rlaif import cpu
from mlx_rlaif.backends.mlx.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
CORE = [
    "tests/test_train.py::test_two_steps_write_metrics_and_checkpoint",
    "tests/test_train.py::test_resume_continues_identically",
    "tests/test_gae.py::test_gae_resumes_exactly",
    "tests/test_multiturn.py::test_two_turn_training_resumes_exactly",
    "tests/test_guidance.py::test_training_with_guidance_uses_the_reference_on_hard_tasks",
    "tests/test_dynamic.py::test_dynamic_sampling_and_curriculum_train_and_resume_exactly",
    "tests/test_distributed.py::"
    "test_two_ranks_on_an_uneven_split_update_as_one_process_on_the_whole_batch",
    "tests/test_metal_path.py::test_the_models_are_in_the_test_dtype",
]


def _dtype(model) -> set[str]:  # noqa: ANN001
    from mlx.utils import tree_flatten

    return {str(v.dtype).removeprefix("mlx.core.") for _, v in tree_flatten(model.parameters())
            if mx.issubdtype(v.dtype, mx.floating) and "lora" not in _}


def test_the_models_are_in_the_test_dtype(micro_model: Path) -> None:
    """The fixtures' and the shipped model's base weights are in MLX_RLAIF_TEST_DTYPE (the LoRA
    adapters stay float32, as mlx-lm makes them)."""
    assert _dtype(load_policy(str(micro_model)).model) == {TEST_DTYPE}
    assert _dtype(load_policy("builtin:tiny-coder").model) == {TEST_DTYPE}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(DTYPE_VAR) is not None, reason="already on that path")
def test_core_training_on_the_path_metal_takes(tmp_path: Path) -> None:
    outer = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # CI's report
    env = {**outer, cpu.OPT_OUT: "0", DTYPE_VAR: "bfloat16", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "t"), *CORE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                     proc.stdout.splitlines()[-1]))
    assert counts == {"passed": len(CORE)}, tail
