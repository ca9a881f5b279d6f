"""LoRA adapters in Hugging Face PEFT's format, both ways: for transformers / vLLM users, and for
the torch backend, which writes its checkpoints in mlx-lm's format.

PEFT export renames mlx-lm's adapter tensors to PEFT's: `X.lora_a` [in, r] becomes
`base_model.model.X.lora_A.weight` [r, in], `X.lora_b` [r, out] becomes `...lora_B.weight`
[out, r], and `lora_alpha = scale * r` (PEFT scales by alpha / r). It relies on mlx-lm keeping the
Hugging Face module names, which holds for the Llama/Qwen/Mistral families.

Not covered: DoRA, full fine-tuning, LoRA on embeddings or mixture-of-experts layers (refused with
a message).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import UsageError
from . import checkpoint
from .atomic import atomic_dir, check_out_dir

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def peft_weights(adapters: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm adapter tensors -> PEFT tensors with Hugging Face names (transposed)."""
    out = {}
    for name, w in adapters.items():
        module, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise UsageError(f"adapter tensor {name} is not plain LoRA (DoRA or full fine-tuning?):"
                             " only LoRA adapters export to PEFT")
        if "embed" in module.rsplit(".", 1)[-1] or w.ndim != 2:
            raise UsageError(f"adapter tensor {name}: LoRA on embeddings or expert layers does "
                             "not export to PEFT; train with lora.keys on linear layers")
        peft_leaf = "lora_A" if leaf == "lora_a" else "lora_B"
        out[f"{_PEFT_PREFIX}{module}.{peft_leaf}.weight"] = w.T  # [r, in] / [out, r]
    return out


def peft_config(adapter_cfg: dict, adapters: dict[str, mx.array], base_name: str) -> dict:
    """PEFT's adapter_config.json for mlx-lm adapters."""
    if adapter_cfg.get("fine_tune_type", "lora") != "lora":
        raise UsageError(f"fine_tune_type {adapter_cfg.get('fine_tune_type')} does not export to "
                         "PEFT: only LoRA adapters do")
    params = adapter_cfg["lora_parameters"]
    rank, scale = int(params["rank"]), float(params["scale"])
    modules = sorted({n.rpartition(".")[0] for n in adapters})
    layers = sorted({int(m.group(1)) for n in modules if (m := _LAYER.search(f".{n}."))})
    alpha = scale * rank
    cfg: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
        "lora_dropout": float(params.get("dropout", 0.0)),
        "target_modules": sorted({n.rsplit(".", 1)[-1] for n in modules}),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
    }
    if layers and layers[0] != 0:  # mlx-lm adapts the last num_layers blocks
        cfg["layers_to_transform"] = layers
        cfg["layers_pattern"] = "layers"
    return cfg


def export_peft(ckpt: str | Path, out: str | Path, base_name: str | None = None) -> Path:
    """Write `out/adapter_model.safetensors` + `out/adapter_config.json` (PEFT) atomically."""
    out = check_out_dir(out)
    adapter_dir = checkpoint.resolve(ckpt)
    adapters = mx.load(str(adapter_dir / checkpoint.ADAPTERS))
    cfg = peft_config(checkpoint.load_adapter_config(adapter_dir), adapters,
                      base_name or checkpoint.base_model_of(adapter_dir))
    weights = peft_weights(adapters)
    with atomic_dir(out) as tmp:
        mx.save_safetensors(str(tmp / PEFT_WEIGHTS), weights, metadata={"format": "pt"})
        (tmp / PEFT_CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def mlx_from_peft(weights: dict[str, mx.array], cfg: dict) -> tuple[dict[str, mx.array], dict]:
    """PEFT LoRA -> (mlx-lm adapter tensors, mlx-lm lora_parameters): the inverse of the export."""
    out = {}
    for name, w in weights.items():
        rest = name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name
        module, leaf = _split_peft(rest)
        out[f"{module}.{'lora_a' if leaf == 'lora_A' else 'lora_b'}"] = w.T
    rank = int(cfg["r"])
    scale = float(cfg["lora_alpha"]) / rank
    return out, {"rank": rank, "scale": scale, "dropout": float(cfg.get("lora_dropout", 0.0))}


def _split_peft(name: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.+)\.(lora_A|lora_B)(?:\.[^.]+)?\.weight", name)
    if m is None:
        raise UsageError(f"{name} is not a PEFT LoRA tensor name (…lora_A.weight / lora_B.weight)")
    return m.group(1), m.group(2)
