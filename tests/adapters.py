"""Adapter checkpoints for tests: LoRA adapters on a model directory with lora_b set to small
seeded random values (so the model they make differs from the base), saved as the trainer
saves them (a run directory `mlx-rlaif train --set lora.init_adapter=DIR` starts from)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_unflatten

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.artifacts.lora import adapter_weights
from mlx_rlaif.backends.mlx.policy import adapter_config_for, load_policy
from mlx_rlaif.config import LoraConfig


def write_adapters(model: str | Path, run_dir: Path, seed: int = 0, size: float = 0.05,
                   rank: int = 4) -> Path:
    """A run directory holding one checkpoint of random adapters on `model`."""
    policy = load_policy(str(model), LoraConfig(rank=rank), seed=seed)
    moved = []
    for i, (k, v) in enumerate(sorted(adapter_weights(policy.model).items())):
        if k.endswith("lora_b"):
            v = (size * mx.random.normal(v.shape, key=mx.random.key(1000 * seed + i))
                 ).astype(v.dtype)
        moved.append((k, v))
    policy.model.update(tree_unflatten(moved))
    mx.eval(policy.model.parameters())
    checkpoint.save_checkpoint(run_dir, "checkpoint-final-gs1", policy.model,
                               adapter_config_for(policy), checkpoint.LoopState(step=1))
    return run_dir
