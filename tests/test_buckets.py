"""Bounded compilation (backends/batch.py, backends/mlx/update.py): padded shapes rounded to a
few buckets, padded rows and positions of zero weight, the compiled update's traces counted
(`compile/traces`) and bounded over a run."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends import batch
from mlx_rlaif.backends.mlx import update
from mlx_rlaif.backends.mlx.loss import rl_loss
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import RLConfig
from mlx_rlaif.config import load as load_config
from mlx_rlaif.records import Rollout, Task


def test_buckets_by_hand() -> None:
    assert [batch.bucket(n) for n in (1, 7, 8, 9, 11, 17, 33, 100)] == [
        1, 7, 8, 10, 12, 20, 40, 112]
    # multiples of 8 up to 128 (as before), then 8 buckets per doubling
    assert [batch.bucket_length(n) for n in (1, 8, 9, 64, 65, 129, 136, 145, 257, 1000)] == [
        8, 8, 16, 64, 72, 144, 144, 160, 288, 1024]
    over = max(batch.bucket_length(n) / batch.round_up(n, 8) for n in range(1, 4097))
    assert over <= 1.125


def _rollouts(n: int, seed: int = 0) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    prompts = [tuple(rng.integers(3, 500, k).tolist()) for k in (13, 6)]
    out = []
    for i in range(n):
        toks = tuple(rng.integers(3, 500, 3 + 4 * i).tolist())
        out.append(Rollout(Task(f"t{i % 2}", "p"), prompts[i % 2], toks,
                           tuple(rng.normal(-5, 1, len(toks)).tolist()), "", "stop", 1.0))
    return out


@pytest.mark.parametrize("layout", ["shared", "full"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_bucketed_and_unbucketed_gradients_are_equal(micro_model: Path, layout: str,
                                                     ratio_level: str) -> None:
    """5 rows of 3..19 tokens: bucketed to 6 rows (one of zero weight), 24 positions (not 24
    -> the same) and prompts padded to 16 on the left, 2 prompts padded to 2; the loss, its
    aux sums and the gradient equal the unpadded batch's."""
    model = load_policy(str(micro_model), seed=0).model
    mx.random.seed(1)
    for _, m in lora_layers(model):
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    rollouts = _rollouts(5)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    ref = [np.array(r.logprobs) - 0.3 for r in rollouts]
    build = batch.build_shared if layout == "shared" else batch.build
    plain = mx_batch(build(rollouts, np.linspace(-1, 1, 5), w, ref))
    padded = mx_batch(build(rollouts, np.linspace(-1, 1, 5), w, ref, bucketed=True, rows_to=6))
    assert padded["tokens"].shape[0] == 6 and plain["tokens"].shape[0] == 5
    if layout == "shared":
        assert padded["prefix"].shape == (2, 16) and plain["prefix"].shape == (2, 12)  # 12 -> 16
    rl = RLConfig(kl_penalty=0.1, entropy_coef=0.01, ratio_level=ratio_level)
    grad = nn.value_and_grad(model, partial(rl_loss, rl=rl, kl_penalty=0.1, temperature=0.9))
    (l0, a0), g0 = grad(model, plain)
    (l1, a1), g1 = grad(model, padded)
    assert l1.item() == pytest.approx(l0.item(), rel=1e-5, abs=1e-7)
    for k in a0:
        assert a1[k].item() == pytest.approx(a0[k].item(), rel=1e-5, abs=1e-6), k
    f0, f1 = dict(tree_flatten(g0)), dict(tree_flatten(g1))
    assert max(np.abs(np.array(v)).max() for v in f0.values()) > 1e-4
    for k, v in f0.items():
        # float rounding: left padding shifts a prompt's RoPE positions by a constant
        np.testing.assert_allclose(np.array(f1[k]), np.array(v), rtol=1e-4, atol=1e-5)


def test_micro_batches_are_even_and_padded_to_a_bucket(micro_model: Path) -> None:
    model = load_policy(str(micro_model), seed=0).model
    cfg = load_config(None, ["training.micro_batch_size=6", "training.share_prompt=false"])
    batches = update.micro_batches(model, _rollouts(16), cfg)
    assert [len(rows) for rows, _ in batches] == [6, 5, 5]  # not 6, 6, 4
    assert update.padded_rows(batches, cfg) == 6


QUICKSTART_STEPS, K_GRAD, K_OPTIMIZER = 60, 12, 2


@pytest.mark.slow
def test_a_quickstart_run_traces_each_compiled_function_a_bounded_number_of_times(
        micro_model: Path) -> None:
    """60 updates with the quickstart's shapes (4 prompts x 8 completions of up to 64 tokens,
    prompts of 40 to 90 tokens, whole groups left out at random as zero-variance groups are,
    one micro-batch): the gradient function traces at most K_GRAD = 12 times, the optimizer
    step at most twice (before and after AdamW's state exists); `compile/traces` counts them."""
    policy = load_policy(str(micro_model), seed=0)
    cfg = load_config(None, ["training.batch_size=4", "generation.num_samples_per_prompt=8",
                             "generation.max_new_tokens=64"])
    opt = update.make_optimizer(cfg.training, QUICKSTART_STEPS)
    traced: dict = {}
    rng = np.random.default_rng(0)
    reported = 0.0
    for step in range(QUICKSTART_STEPS):
        rollouts = []
        for p in range(int(rng.integers(1, 5))):
            prompt = tuple(rng.integers(3, 500, int(rng.integers(40, 91))).tolist())
            for _ in range(8):
                n = 64 if rng.random() < 0.3 else int(rng.integers(8, 65))
                rollouts.append(Rollout(Task(f"{step}-{p}", "p"), prompt,
                                        tuple(rng.integers(3, 500, n).tolist()), (-5.0,) * n,
                                        "", "stop", 1.0))
        m, _ = update.update(policy, opt, rollouts, rng.normal(size=len(rollouts)), None, cfg,
                             0.0, traced)
        reported += m["compile/traces"]
    counts = traced["counts"]
    assert counts["grad"] <= K_GRAD and counts["optimizer"] <= K_OPTIMIZER, counts
    assert reported == counts["grad"] + counts["optimizer"]
