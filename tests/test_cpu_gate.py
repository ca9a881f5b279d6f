"""One gate for every CPU-only path (`mlx_rlaif.cpu.active()`): with MLX's device reported as a
GPU, or with MLX_RLAIF_CPU_KERNELS=0, no CPU kernel is swapped in, no OpenBLAS thread count
changes, the reference pass stays on one stream, decoding keeps the weights' layout (and the
memory plan counts no transposed copy), and the loss and the sampler take `mx.exp`.
Where the gate is on (this machine's CPU build), each of them is active: the control that shows
the checks can fail."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx_lm.models.qwen2 as qwen2
import pytest
from mlx_lm.models import activations

from mlx_rlaif import cpu
from mlx_rlaif.backends.mlx import decode, loss, update
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import load as load_config
from mlx_rlaif.cpu import blas, decode_kernels, kernels

pytestmark = pytest.mark.skipif(not cpu.on_cpu(), reason="MLX computes on a GPU here")


def _paths_taken(model, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Which CPU-only paths a phase takes, each observed where it acts."""
    calls: list[int] = []
    monkeypatch.setattr(blas, "openblas_thread_fns", lambda: (lambda: 1, calls.append))
    used: list[str] = []

    def spy(name, fn):  # noqa: ANN001, ANN202
        def wrapped(*a):  # noqa: ANN002, ANN202
            used.append(name)
            return fn(*a)
        return wrapped

    monkeypatch.setattr(loss, "power_exp", spy("loss", kernels.power_exp))
    monkeypatch.setattr(decode, "_draw_cpu", spy("sampler", decode._draw_cpu))
    monkeypatch.setattr(update, "openblas_thread_fns", lambda: (lambda: 1, calls.append))
    with kernels.fast_cpu_kernels(model):
        swapped = qwen2.swiglu is not activations.swiglu
    with kernels.decode_rope(model):
        rope = any(isinstance(m, kernels.DecodeRoPE) for m in model.modules())
    with decode_kernels.compiled_decode_kernels(model, transposed=True):
        transposed = any(isinstance(m, decode_kernels.DecodeLinear) for m in model.modules())
    with blas.blas_threads(2):
        pass
    loss.exp(mx.zeros(3))
    decode.picker(1.0)(mx.zeros((2, 8)))
    streams = update.reference_streams(load_config(None, []), rows=4)
    return {"kernels": swapped, "rope": rope, "transposed": transposed,
            "transposed_bytes": decode_kernels.transposed_bytes(model) > 0,
            "blas_threads": bool(calls),
            "loss_exp": "loss" in used, "sampler_exp": "sampler" in used,
            "two_streams": len(streams) > 1}


def test_every_cpu_path_is_on_behind_the_gate(micro_model: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu.OPT_OUT, raising=False)
    taken = _paths_taken(load_policy(str(micro_model)).model, monkeypatch)
    assert all(taken.values()), taken


@pytest.mark.parametrize("how", ["gpu", "opt_out"])
def test_no_cpu_path_where_the_gate_is_off(how: str, micro_model: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_policy(str(micro_model)).model
    if how == "gpu":
        monkeypatch.setattr(cpu, "on_cpu", lambda: False)
    else:
        monkeypatch.setenv(cpu.OPT_OUT, "0")
    assert not cpu.active()
    taken = _paths_taken(model, monkeypatch)
    assert not any(taken.values()), taken
