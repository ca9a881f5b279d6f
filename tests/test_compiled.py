"""The update's compiled functions (update.py: `grad_fn`, `optimizer_step`) against the same
computations run eagerly: same loss, gradients and optimizer steps;
the KL coefficient is an input of the trace, not a constant frozen into it; a trace is rebuilt
when the object it traces changes; micro-batches with large logits run eagerly."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten, tree_map

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.batch import build_shared
from mlx_rlaif.backends.mlx import memory, update
from mlx_rlaif.backends.mlx.loss import rl_loss
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.mlx.update import grad_fn, kept, make_optimizer, optimizer_step
from mlx_rlaif.config import load as load_config
from mlx_rlaif.cpu.kernels import training_fast_paths
from mlx_rlaif.records import Rollout, Task


def _policy(micro_model: Path) -> nn.Module:
    model = load_policy(str(micro_model), seed=0).model
    mx.random.seed(1)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())
    return model


def _batch(width: int = 6) -> dict[str, mx.array]:
    """Two prompts x 2 completions of uneven lengths (at most `width` tokens), with a reference."""
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(3, 500, n).tolist()) for n in (5, 3)]
    rollouts = []
    for i, n in enumerate([width, width - 2, width - 1, 2]):
        toks = tuple(rng.integers(3, 500, n).tolist())
        rollouts.append(Rollout(Task(f"t{i % 2}", "p"), prompts[i % 2], toks,
                                tuple(rng.normal(-5, 1, n).tolist()), "", "stop", 1.0))
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", width)
    ref = [np.array(r.logprobs) - 0.3 for r in rollouts]
    return mx_batch(build_shared(rollouts, np.linspace(-1, 1, 4), w, ref))


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(np.array(a[k]), np.array(b[k]), atol=2e-6, rtol=1e-4)


def test_gradient_equals_eager_and_follows_the_kl_coefficient(micro_model: Path) -> None:
    model = _policy(micro_model)
    cfg = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3",
                             "generation.temperature=0.8"])
    grad = grad_fn(model, cfg)
    losses = []
    with training_fast_paths(model):
        for mb, kl in ((_batch(), 0.0), (_batch(), 0.5), (_batch(9), 0.5)):  # a new shape too
            (loss, aux), g = grad(mb, mx.array(kl))
            eager = nn.value_and_grad(model, partial(rl_loss, rl=cfg.rl, kl_penalty=kl,
                                                     temperature=0.8))
            (want, want_aux), want_g = eager(model, mb)
            assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
            _close(dict(tree_flatten(g)), dict(tree_flatten(want_g)))
            _close(aux, want_aux)
            losses.append(loss.item())
    assert abs(losses[1] - losses[0]) > 1e-4  # the coefficient reached the trace


def test_optimizer_step_equals_eager_updates(micro_model: Path) -> None:
    cfg = load_config(None, ["training.warmup_steps=2", "training.lr_schedule=cosine",
                             "training.weight_decay=0.1"])
    models = [_policy(micro_model), _policy(micro_model)]
    opts = [make_optimizer(cfg.training, 10), make_optimizer(cfg.training, 10)]
    step = optimizer_step(models[1], opts[1])
    mx.random.seed(2)
    for _ in range(3):
        grads = tree_map(lambda p: mx.random.normal(p.shape), models[0].trainable_parameters())
        opts[0].update(models[0], grads)
        step(grads)
        mx.eval(models[0].parameters(), models[1].parameters())
    _close(dict(tree_flatten(models[1].trainable_parameters())),
           dict(tree_flatten(models[0].trainable_parameters())))
    assert opts[1].step.item() == 3


def test_kept_traces_again_for_a_new_owner() -> None:
    traced: dict = {}
    made = []
    a, b = object(), object()
    for owner in (a, a, b, b, a):
        kept(traced, "f", owner, lambda o=owner: made.append(o) or len(made))
    assert made == [a, b, a]


@pytest.mark.parametrize(("floor_mb", "budget_gb", "traced"),
                         [(64, 0, True), (0, 0, False), (0, 16, True)])
def test_micro_batches_over_the_budgets_compile_limit_run_eagerly(
        micro_model: Path, monkeypatch: pytest.MonkeyPatch, floor_mb: int, budget_gb: float,
        traced: bool) -> None:
    """The compile limit is a share of the budget (16 GB: 1 GB of logits), at least the floor."""
    calls = []

    def recording(fn, model, *more):  # noqa: ANN001, ANN202  (stands in for update.compiled)
        return lambda *a: calls.append(1) or fn(*a)

    monkeypatch.setattr(update, "compiled", recording)
    monkeypatch.setattr(memory, "COMPILE_MAX_LOGITS_MB", floor_mb)
    model = _policy(micro_model)
    cfg = load_config(None, [f"training.max_memory_gb={budget_gb}"])
    (loss, _), _ = update.grad_fn(model, cfg)(_batch(), mx.array(0.1))
    assert np.isfinite(loss.item())
    assert bool(calls) is traced
