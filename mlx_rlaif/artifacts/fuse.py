"""Fusing trained LoRA adapters into the base: a model other tools serve.

Fusing goes through mlx-lm: `mlx_lm.utils.load(base, adapter_path=...)` builds base + adapters,
`LoRALinear.fuse` folds each adapter in, `dequantize_model` / `quantize_model` change precision
and `mlx_lm.utils.save` writes a directory that `mlx_lm.load`, `mlx_lm.generate` and
`mlx_lm.server` read. On a quantized base the adapters are folded into dequantized weights (never
into the quantized codes), and when the result is quantized again we measure how much of the LoRA
update survives: the correlation between the update the quantized weights actually apply and the
one the adapters apply. Below 8 bits a small update can vanish in the rounding (mlx-lm issue
#1172: the fused model then behaves like the base); we refuse to write such a model and say how to
keep the adapter (`--dequantize`, or 8 bits).

Not covered: DoRA, full fine-tuning, GGUF export, sharded adapters.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.tuner.lora import LoRALinear

from ..assets import model_source, resolve_model
from ..errors import CheckpointError, UsageError
from .atomic import atomic_dir
from .checkpoint import base_model_of
from .lora import lora_layers

MIN_CORRELATION = 0.5


def load_with_adapters(base: str, adapter_dir: Path) -> tuple[nn.Module, Any, dict]:
    """mlx-lm's loader with the adapters applied: (model, tokenizer, model config)."""
    from mlx_lm.utils import load

    source = model_source(base, "pass the model the adapters were trained on with --model")
    try:
        model, tokenizer, config = load(source, adapter_path=str(adapter_dir), return_config=True)
    except ValueError as e:  # mlx-lm lists mismatching adapter tensors
        first = str(e).strip().splitlines()
        raise CheckpointError(f"{adapter_dir} does not fit {base} ({first[0] if first else e}): "
                              "pass the base model it was trained on with --model") from e
    except FileNotFoundError as e:  # no weights; also a path holding [ or ] (read as a glob)
        hint = (": mlx-lm reads '[' and ']' in a path as a pattern, so link the model to a path "
                "without them" if any(c in str(source) for c in "[]") else
                ": check the path or hub id (--model)")
        raise UsageError(f"model {base} could not be loaded (no weights found){hint}") from e
    return model, tokenizer, config


@dataclass(frozen=True)
class Quantization:
    """How (and whether) to quantize a fused model."""

    bits: int | None = None  # None: keep float weights
    group_size: int = 64
    mode: str = "affine"
    # per-module parameters of the base model (path -> {group_size, bits, mode}); when set only
    # these modules are quantized, as in the base
    per_module: dict[str, dict] | None = None


def base_quantization(model: nn.Module) -> dict[str, dict]:
    """path -> quantization parameters of each quantized module, paths as in the fused model."""
    found = {}
    for name, m in model.named_modules():
        if hasattr(m, "bits") and hasattr(m, "group_size"):
            path = name[: -len(".linear")] if name.endswith(".linear") else name
            found[path] = {"group_size": m.group_size, "bits": m.bits, "mode": m.mode}
    return found


def clone_modules(module: Any) -> Any:
    """A copy of the module tree whose arrays are shared: replacing modules in the copy leaves
    the original untouched (mx.arrays are immutable, so sharing them is safe)."""
    if isinstance(module, nn.Module):
        c = copy.copy(module)
        for k, v in module.items():
            c[k] = clone_modules(v)
        return c
    if isinstance(module, list):
        return [clone_modules(v) for v in module]
    if isinstance(module, dict):
        return {k: clone_modules(v) for k, v in module.items()}
    return module


def fuse_float(model: nn.Module) -> nn.Module:
    """A float copy of `model` with every adapter folded in (`model` itself is not changed).

    Quantized layers are dequantized first, so the LoRA update is added to float weights, never
    rounded into the base's quantization grid.
    """
    from mlx_lm.utils import dequantize_model

    fused = clone_modules(model)
    layers = [(n, m.fuse(dequantize=True)) for n, m in lora_layers(fused)]
    if layers:
        fused.update_modules(tree_unflatten(layers))
    return dequantize_model(fused)


def quantize(model: nn.Module, config: dict, q: Quantization) -> tuple[nn.Module, dict]:
    """mlx-lm's quantize_model, restricted to the base's quantized modules when q.per_module."""
    from mlx_lm.utils import quantize_model

    predicate = None
    if q.per_module is not None:
        per_module = q.per_module
        default = {"group_size": q.group_size, "bits": q.bits, "mode": q.mode}

        def predicate(path: str, module: nn.Module) -> bool | dict:
            params = per_module.get(path)
            return bool(params) if params in (None, default) else params

    return quantize_model(model, config, q.group_size, q.bits, mode=q.mode,
                          quant_predicate=predicate)


def adapter_correlation(lora: list[tuple[str, nn.Module]], fused: nn.Module) -> float | None:
    """How faithfully the fused (possibly quantized) weights carry the LoRA update.

    For each adapted layer: delta = scale * (a @ b).T is the update the adapter applies, and
    effect = W_fused - W_ref is the update the fused weights apply, with W_ref the base weights
    at the fused layer's precision (quantized the same way when the fused layer is quantized).
    Returns sum <effect, delta> / sqrt(sum |effect|^2 * sum |delta|^2): 1.0 for float weights,
    near 0 when quantization rounded the update away. None when the adapters are all zero.
    """
    fused_mods = dict(fused.named_modules())
    dot = e2 = d2 = mx.array(0.0)
    for path, m in lora:
        if not isinstance(m, LoRALinear):
            continue
        base_w = _float_weight(m.linear).astype(mx.float32)  # [out, in]
        delta = (m.scale * (m.lora_a @ m.lora_b)).T.astype(mx.float32)  # [out, in]
        target = fused_mods[path]
        w = _float_weight(target).astype(mx.float32)
        ref = _requantize_like(base_w, target)
        effect = w - ref
        dot = dot + (effect * delta).sum()
        e2 = e2 + (effect * effect).sum()
        d2 = d2 + (delta * delta).sum()
        mx.eval(dot, e2, d2)
    if d2.item() == 0.0:
        return None
    if e2.item() == 0.0:
        return 0.0
    return dot.item() / math.sqrt(e2.item() * d2.item())


def _float_weight(m: nn.Module) -> mx.array:
    if isinstance(m, nn.QuantizedLinear):
        return mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size, bits=m.bits,
                             mode=m.mode)
    return m.weight


def _requantize_like(w: mx.array, target: nn.Module) -> mx.array:
    if not isinstance(target, nn.QuantizedLinear):
        return w
    packed = mx.quantize(w, group_size=target.group_size, bits=target.bits, mode=target.mode)
    return mx.dequantize(*packed, group_size=target.group_size, bits=target.bits,
                         mode=target.mode)


def fuse(model: nn.Module, config: dict, q: Quantization,
         min_correlation: float = MIN_CORRELATION) -> tuple[nn.Module, dict, float | None]:
    """Fold the adapters of `model` into a new model, quantized as `q` asks.

    Returns (fused model, its config, adapter correlation). Raises UsageError when quantization
    keeps too little of the LoRA update (correlation below `min_correlation`).
    """
    lora = lora_layers(model)
    if not lora:
        raise CheckpointError("the model has no LoRA layers to fuse: pass a checkpoint with "
                              "adapters.safetensors")
    fused = fuse_float(model)
    config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    if q.bits is not None:
        fused, config = quantize(fused, config, q)
    corr = adapter_correlation(lora, fused)
    if q.bits is not None and corr is not None and corr < min_correlation:
        raise UsageError(
            f"quantizing the fused model to {q.bits} bits keeps too little of the LoRA update "
            f"(correlation {corr:.2f} < {min_correlation}): the adapter would be silently lost; "
            "pass --dequantize for float weights or --quantize 8")
    return fused, config, corr


def quantization_for(base_model: nn.Module, config: dict, bits: int | None, dequantize: bool,
                     group_size: int | None = None) -> Quantization:
    """The output precision: float with --dequantize, `bits` when given, else the base's own."""
    if dequantize and bits:
        raise UsageError("--quantize and --dequantize exclude each other: pass one of them")
    if dequantize:
        return Quantization()
    if bits:
        return Quantization(bits=bits, group_size=group_size or 64)
    base_q = config.get("quantization")
    per_module = base_quantization(base_model)
    if not base_q or not per_module:
        return Quantization()
    return Quantization(bits=base_q.get("bits", 4), group_size=base_q.get("group_size", 64),
                        mode=base_q.get("mode", "affine"), per_module=per_module)


def save_model_dir(out: Path, model: nn.Module, tokenizer: Any, config: dict, source: str,
                   extra_json: dict[str, Any] | None = None) -> Path:
    """mlx-lm's `save` (weights, config.json, tokenizer, model card), written atomically."""
    from mlx_lm.utils import save

    with atomic_dir(out) as tmp:
        save(tmp, resolve_model(source), model, tokenizer, dict(config), donate_model=False)
        for name, obj in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n")
    return out


def write_mlx_model(model: nn.Module, tokenizer: Any, ckpt_dir: str | Path, bits: int | None,
                    config: dict | None = None, source: str | None = None) -> Path:
    """Write `<ckpt_dir>/mlx_model/`: the live training model with its adapters fused, quantized
    to `bits` (None: float), loadable by `mlx_lm.load`. The training model is not changed.

    Meant to run inside training, so it never refuses: the adapter correlation (see
    `adapter_correlation`) is written to `mlx_model/export.json` instead, for the caller to log.
    `config` is the base model's config.json (read from the checkpoint's base_model when None).
    """
    ckpt_dir = Path(ckpt_dir)
    src = source or base_model_of(ckpt_dir)
    if config is None:
        from mlx_lm.utils import _download, load_config

        config = load_config(_download(model_source(src)))
    q = Quantization(bits=bits) if bits else Quantization()
    fused, cfg, corr = fuse(model, config, q, min_correlation=-1.0)
    out = ckpt_dir / "mlx_model"
    if out.exists():
        shutil.rmtree(out)
    info = {"bits": bits, "adapter_correlation": corr, "base_model": src}
    return save_model_dir(out, fused, tokenizer, cfg, src, {"export.json": info})
