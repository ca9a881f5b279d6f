"""What an MLX LoRA adapter is, in mlx-lm's format: its layers in a model, its weights and its
`adapter_config.json`. Shared by the MLX policy, checkpoints and fusing.

Not covered: DoRA, full fine-tuning (mlx-lm's other `fine_tune_type`s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tuner.lora import LoRAEmbedding, LoRALinear, LoRASwitchLinear

LORA_TYPES = (LoRALinear, LoRASwitchLinear, LoRAEmbedding)


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA settings an adapter was made with (config.LoraConfig has the same fields)."""

    rank: int = 8
    scale: float = 20.0
    dropout: float = 0.0
    keys: tuple[str, ...] = ()


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of every LoRA layer of `model`."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LORA_TYPES)]


def adapter_config(lora: Any, base_model: str, num_layers: int) -> dict:
    """mlx-lm's adapter_config.json for a LoRA config section (see config.LoraConfig)."""
    params = {"rank": lora.rank, "scale": lora.scale, "dropout": lora.dropout}
    if lora.keys:
        params["keys"] = list(lora.keys)
    return {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": params,
        "base_model": base_model,
    }


CRITIC = "value_head"  # a critic's value head rides on the policy but is not an adapter


def adapter_weights(model: Any) -> dict[str, mx.array]:
    """The LoRA tensors by path (a value head, when there is one, left out)."""
    return {k: v for k, v in tree_flatten(model.trainable_parameters())
            if not k.startswith(CRITIC + ".")}


def critic_weights(model: Any) -> dict[str, mx.array]:
    """The value head's tensors by path (empty without one)."""
    return {k: v for k, v in tree_flatten(model.trainable_parameters())
            if k.startswith(CRITIC + ".")}


def spec_of(adapter_cfg: dict) -> tuple[LoraSpec, int]:
    """(the LoRA settings, the number of adapted blocks) of an `adapter_config.json`."""
    p = adapter_cfg["lora_parameters"]
    spec = LoraSpec(p["rank"], p["scale"], p.get("dropout", 0.0), tuple(p.get("keys") or ()))
    return spec, adapter_cfg["num_layers"]
