"""bfloat16 and float16 models on MLX's CPU build, with the CPU kernels (cpu/kernels.py) on and
off: the kernels keep their inputs' dtype forward and backward (a custom VJP must return each
primal's dtype, or `value_and_grad` fails with "Type of cotangents does not match primal output
type"), two updates on a fixed batch give the same losses and weights with the kernels on as
off, and the tiny shape trains two steps end to end either way.

Not covered: speed (the CPU build has no fast bfloat16 matrix multiply), the Metal kernels
themselves (tests/test_metal_path.py runs the training tests on the path Metal takes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from dp_update import batch
from mlx.utils import tree_flatten
from mlx_lm.models import activations
from mlx_lm.models import base as mlx_lm_base
from recording_hub import RecordingHub

from mlx_rlaif import cpu
from mlx_rlaif.algo import advantages
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.backends.ops import OPS
from mlx_rlaif.config import load
from mlx_rlaif.cpu.kernels import scaled_dot_product_attention, swiglu
from mlx_rlaif.testing.randmodel import make_model_dir
from mlx_rlaif.train import train

pytestmark = pytest.mark.skipif(not cpu.on_cpu(), reason="the CPU kernels run on MLX's CPU only")
DTYPES = ["bfloat16", "float16"]
TOL = {"bfloat16": 2e-2, "float16": 2e-3}  # relative: 8 and 11 bits of mantissa


@pytest.fixture(scope="module", params=DTYPES)
def low_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Path]:
    """The tiny shape (4 layers, width 256, vocab 4096) stored in bfloat16 or float16."""
    path = tmp_path_factory.mktemp(request.param) / "model"
    return request.param, make_model_dir(path, "tiny", seed=4, dtype=request.param)


def _close(a: mx.array, b: mx.array, tol: float) -> None:
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_keep_the_dtype_forward_and_backward(dtype: str) -> None:
    dt, tol = getattr(mx, dtype), TOL[dtype]
    mx.random.seed(0)
    gate, x = (mx.random.normal((2, 5, 64)).astype(dt) for _ in range(2))
    out = swiglu(gate, x)
    assert out.dtype == dt
    _close(out, activations.swiglu(gate, x), tol)
    grads = mx.grad(lambda a, b: swiglu(a, b).astype(mx.float32).sum(), argnums=(0, 1))(gate, x)
    ref = mx.grad(lambda a, b: (nn.silu(a) * b).astype(mx.float32).sum(), argnums=(0, 1))(gate, x)
    for g, r in zip(grads, ref, strict=True):
        assert g.dtype == dt
        _close(g, r, 2 * tol)
    q, k, v = (mx.random.normal((1, h, 6, 16)).astype(dt) for h in (4, 2, 2))

    def attn(fn, *a):  # noqa: ANN001, ANN002, ANN202
        return fn(*a, None, 0.25, "causal")

    out = attn(scaled_dot_product_attention, q, k, v)
    assert out.dtype == dt
    _close(out, attn(mlx_lm_base.scaled_dot_product_attention, q, k, v), tol)
    grads = mx.grad(lambda *a: attn(scaled_dot_product_attention, *a).astype(mx.float32).sum(),
                    argnums=(0, 1, 2))(q, k, v)
    ref = mx.grad(lambda *a: attn(mlx_lm_base.scaled_dot_product_attention, *a)
                  .astype(mx.float32).sum(), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(grads, ref, strict=True):
        assert g.dtype == dt
        _close(g, r, 4 * tol)


def _two_updates(model: Path, kernels: bool, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Two SGD steps (rl.num_iterations=2) on tests/dp_update.py's fixed batch (rewards with
    variance), its sampler log-probs the policy's own, from the same LoRA init: (metrics,
    adapters after). SGD, not AdamW: Adam's first step moves a weight whose gradient is float
    noise by the full learning rate, whichever way the noise points."""
    if kernels:
        monkeypatch.delenv(cpu.OPT_OUT, raising=False)
    else:
        monkeypatch.setenv(cpu.OPT_OUT, "0")
    assert cpu.active() == kernels
    cfg = load(None, [f"model.path={model}", "rl.num_iterations=2", "rl.kl_penalty=0.1",
                      "rl.entropy_coef=0.01", "generation.num_samples_per_prompt=3",
                      "training.micro_batch_size=4"])
    ops = OPS["mlx"]()
    policy = ops.load(cfg)
    pairs = [p for g in batch() for p in g]
    rollouts, rewards = [r for r, _ in pairs], [v for _, v in pairs]
    adv = advantages.compute(rewards, [r.task.id for r in rollouts], "grpo", "group", True)
    kept = [r for r, k in zip(rollouts, adv.keep, strict=True) if k]
    own = ops.logprobs(policy, kept, cfg)
    kept = [replace(r, logprobs=tuple(float(x) for x in lp))
            for r, lp in zip(kept, own, strict=True)]
    ref = ops.reference(policy, kept, cfg)
    metrics, skipped = ops.update(policy, optim.SGD(learning_rate=0.05), kept,
                                  list(adv.values[adv.keep]), ref, cfg, 0.1)
    assert skipped == 0
    return metrics, {k: np.array(v.astype(mx.float32)) for k, v in
                     tree_flatten(policy.model.trainable_parameters())}


def test_two_updates_equal_with_the_kernels_on_and_off(low_model, monkeypatch) -> None:
    """The same losses (means of per-token terms of order 1: equal to the dtype's rounding)
    and the same weights after two steps; float32 gives equal numbers to 1e-8 (measured)."""
    dtype, model = low_model
    off, w_off = _two_updates(model, False, monkeypatch)
    on, w_on = _two_updates(model, True, monkeypatch)
    assert off["train/tokens"] == on["train/tokens"] == 2 * 71  # 2 updates; the tied group dropped
    tol = TOL[dtype]
    for key in ("loss/total", "loss/policy", "loss/kl", "kl/mean"):
        assert on[key] == pytest.approx(off[key], abs=tol / 5), key
    for key in ("policy/entropy", "policy/ratio_mean"):
        assert on[key] == pytest.approx(off[key], rel=tol / 5), key
    # the gradient's norm sums every weight's rounding (the one-pass head's in the dtype):
    # bfloat16 measured 0.44% apart
    assert on["optim/grad_norm"] == pytest.approx(off["optim/grad_norm"], rel=tol / 2)
    step = max(float(np.abs(w_off[k]).max()) for k in w_off if k.endswith("lora_b"))
    assert step > 1e-3  # lora_b starts at zero: the updates ran
    for k in w_on:
        np.testing.assert_allclose(w_on[k], w_off[k], rtol=0, atol=tol * step, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("kernels", [True, False], ids=["kernels-on", "kernels-off"])
def test_the_tiny_shape_trains_two_steps(low_model, kernels, prompts_file, tmp_path,
                                         monkeypatch) -> None:
    """End to end: sampling, scoring, two updates (drop_zero_std off and an entropy term, so
    every step trains), checkpoint."""
    dtype, model = low_model
    if kernels:
        monkeypatch.delenv(cpu.OPT_OUT, raising=False)
    else:
        monkeypatch.setenv(cpu.OPT_OUT, "0")
    hub = RecordingHub()
    run_dir = train(load(None, [
        f"model.path={model}", f"data.train_file={prompts_file}",
        f"training.output_dir={tmp_path / 'run'}", "reward.type=syntax",
        "generation.max_new_tokens=8", "generation.num_samples_per_prompt=3",
        "rl.drop_zero_std=false", "rl.entropy_coef=0.05", "training.learning_rate=0.01",
        "training.max_steps=2", "logging.tensorboard=false"]), hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2]
    for _, m in hub.steps:
        assert m["train/tokens"] > 0 and m["optim/grad_norm"] > 0
        assert np.isfinite(m["loss/total"]) and np.isfinite(m["kl/mean"])
    ckpt = checkpoint.latest_checkpoint(run_dir)
    adapters = mx.load(str(ckpt / checkpoint.ADAPTERS))
    assert any(np.abs(np.array(v.astype(mx.float32))).max() > 0
               for k, v in adapters.items() if k.endswith("lora_b"))
    assert json.loads((model / "config.json").read_text())["torch_dtype"] == dtype
