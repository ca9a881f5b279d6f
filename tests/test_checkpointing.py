"""Gradient checkpointing per block (backends/mlx/checkpointing.py): the same loss and
gradients as without it, with each prompt computed once (shared prompts) and in full rows; the
blocks' classes are restored after the block."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten
from test_chunked_loss import _perturb, _rollouts

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.backends.batch import build, build_shared
from mlx_rlaif.backends.mlx.checkpointing import checkpointed_blocks
from mlx_rlaif.backends.mlx.loss import rl_loss
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import RLConfig


@pytest.mark.parametrize("layout", [build_shared, build])
def test_checkpointed_gradients_equal_the_plain_ones(micro_model: Path, layout) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = _rollouts(6, 9, 512)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    ref = [np.array(r.logprobs) - 0.05 for r in rollouts]
    mb = mx_batch(layout(rollouts, np.linspace(-1, 1, 6), w, ref))
    fn = nn.value_and_grad(policy.model, partial(rl_loss, rl=RLConfig(entropy_coef=0.01),
                                                 kl_penalty=0.1, temperature=0.9))
    (loss, _), grads = fn(policy.model, mb)
    block = type(policy.model.layers[0])
    with checkpointed_blocks(policy.model):
        assert type(policy.model.layers[0]) is not block
        (loss_c, _), grads_c = fn(policy.model, mb)
        mx.eval(loss_c, grads_c)
    assert type(policy.model.layers[0]) is block
    assert loss_c.item() == pytest.approx(loss.item(), rel=1e-6)
    plain, ckpt = dict(tree_flatten(grads)), dict(tree_flatten(grads_c))
    assert max(np.abs(np.array(v)).max() for v in plain.values()) > 1e-4
    for k, v in plain.items():
        np.testing.assert_allclose(np.array(ckpt[k]), np.array(v), rtol=1e-5, atol=1e-7)
