"""The MLX policy: one model, LoRA adapters on it, and the frozen base as the same weights with
the LoRA layers bypassed.

Covered: any model directory or hub id mlx-lm loads (quantized included), LoRA through mlx-lm's
tuner (rank, scale, dropout, keys, number of layers), starting from saved adapters, log-probs of
given tokens at a temperature, and the reference pass. Not covered: DoRA, full fine-tuning,
models whose LoRA layers are not `LoRALinear` (the reference switch only knows mlx-lm's LoRA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.lora import LoRAEmbedding, LoRALinear
from mlx_lm.tuner.utils import linear_to_lora_layers

from ... import cpu
from ...artifacts import checkpoint
from ...artifacts.lora import (
    LORA_TYPES,
    LoraSpec,
    adapter_config,
    adapter_weights,
    lora_layers,
    spec_of,
)
from ...assets import model_source
from ...cpu.experts import float32_experts
from ...errors import UsageError
from .device import kind_of, quantized_problem
from .loss import Split, split_head
from .model_shape import once
from .probe import first_line, load_failure_line, probe
from .weight_files import preflight


@dataclass
class Policy:
    model: nn.Module
    tokenizer: Any
    base_model: str
    num_layers: int
    lora: Any  # the LoraConfig-like object used (rank, scale, dropout, keys)
    split: Split | None = None  # the model as body + head (loss.split_head), where it is one
    reference: dict[str, mx.array] | None = None  # the reference's adapters (rl.reference
    # ema, periodic: moving; initial: the ones loaded at the start, frozen)


def load_model(path: str, trust_remote_code: bool = False, quantize: int = 0,
               quantize_key: str = "", planned: bool = False) -> tuple[nn.Module, Any]:
    """mlx-lm's model and tokenizer, quantized to `quantize` bits at load where the weights are
    not quantized already, with a one-line error for a path that is neither a model nor a hub
    id, for weights that cannot be read or quantized (an integer tensor, a weight file that is
    a FIFO: not opened), and for a quantized model this backend cannot run
    (`quantize_key` prefixes it: the setting that asked). The weights are read lazily and
    evaluated one tensor at a time after the quantization, so a float model quantized at load
    peaks at its quantized copy plus one float tensor, never the whole float model beside it
    (MLX peak 0.63 GB against 2.05 for a Qwen2.5-0.5B shape in float32, 4 bits). A model on
    this machine is planned from its files first (weight_files.preflight) unless the caller has
    (`planned`)."""
    from mlx_lm import load

    source = model_source(path)
    if not planned and Path(source).is_dir():  # before mlx-lm builds it from config.json
        preflight(f"model {path}", "model", Path(source), None)
    try:
        model, tokenizer = load(source, tokenizer_config={"trust_remote_code": trust_remote_code},
                                lazy=True, trust_remote_code=trust_remote_code)
    except Exception as e:  # hub errors, missing weights, unsupported architectures
        inside = load_failure_line(e)  # raised by mlx-lm's model code itself
        if inside:
            raise UsageError(f"model {path}: {inside}") from e
        raise UsageError(f"model {path} could not be loaded ({type(e).__name__}: "
                         f"{first_line(e)}): check the path or hub id"
                         ) from e
    problem = quantized_problem(kind_of(), mx.__version__) if quantize or is_quantized(model) \
        else None
    if problem:
        raise UsageError(quantize_key + problem)
    if quantize and not is_quantized(model):
        from mlx_lm.utils import quantize_model

        try:
            quantize_model(model, {}, None, quantize)
        except Exception as e:  # noqa: BLE001  (an integer tensor where a float one belongs)
            setting = quantize_key.rstrip(": ") or "model.quantize"
            raise UsageError(f"model {path}: its weights could not be quantized to {quantize} "
                             f"bits ({type(e).__name__}: {first_line(e)}"
                             f"): check the model's files or set {setting}: 0") from e
    if cpu.on_cpu():  # 16-bit experts: GatherMM runs only in float32 on MLX's CPU build
        float32_experts(model)
    read_weights(model, path)
    return model, tokenizer


def read_weights(model: nn.Module, path: str) -> None:
    """Evaluate a lazily loaded model's parameters one tensor at a time (each float tensor is
    freed once its quantized copy exists); a weight file that fails when read is a one-line
    UsageError naming the model."""
    try:
        for _, p in tree_flatten(model.parameters()):
            mx.eval(p)
    except Exception as e:  # noqa: BLE001  (a truncated or unreadable weight file)
        raise UsageError(f"model {path}: its weights could not be read ({type(e).__name__}: "
                         f"{first_line(e)}): check the model's files") from e


def load_policy(model_path: str, lora_cfg: Any = None, adapter: str | Path | None = None,
                seed: int = 0, trust_remote_code: bool = False, quantize: int = 0,
                critic: bool = False, moving_reference: bool = False) -> Policy:
    """Load the base model (quantized to `quantize` bits at load when it is not quantized
    already: QLoRA), freeze it and add LoRA layers (from `adapter` if given); with `critic` a
    value head on the last hidden state (`model.value_head`), with `moving_reference` a copy of
    the adapters as loaded (`adapter`'s, or the fresh ones) as the KL reference."""
    model, tokenizer = load_model(model_path, trust_remote_code, quantize)
    model.freeze()
    lora = lora_cfg or LoraSpec()
    num_layers = getattr(lora, "num_layers", -1)
    adapter_dir = checkpoint.resolve(adapter) if adapter else None
    if adapter_dir is not None:
        lora, num_layers = spec_of(checkpoint.load_adapter_config(adapter_dir))
    n_blocks = len(model.layers)
    num_layers = n_blocks if num_layers in (-1, None) or num_layers > n_blocks else num_layers
    mx.random.seed(seed)
    add_lora(model, lora, num_layers)
    if adapter_dir is not None:
        checkpoint.load_weights_into(model, adapter_dir)
    model.train(False)
    probe(model, bool(quantize) or is_quantized(model))
    split = split_head(model)
    once(model, "full_logits", lambda: split is None)  # the memory plan's (memory.shape_of)
    if critic:
        add_value_head(model, split)
    mx.eval(model.parameters())
    reference = dict(adapter_weights(model)) if moving_reference else None
    return Policy(model, tokenizer, model_path, num_layers, lora, split, reference)


class ValueHead(nn.Module):
    """V(s) = w . h + b on the policy's last hidden state, in float32. Starts at w = 0 (`fresh`
    until its bias is set to the first batch's mean reward: `start_value`)."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.weight = mx.zeros((dims,), dtype=mx.float32)
        self.bias = mx.zeros((1,), dtype=mx.float32)
        self.fresh = True

    def __call__(self, hidden: mx.array) -> mx.array:
        return hidden.astype(mx.float32) @ self.weight + self.bias[0]


def add_value_head(model: nn.Module, split: Split | None) -> None:
    if split is None:
        raise UsageError("rl.advantage gae puts a value head on the model's last hidden state, "
                         "and this model is not a transformer followed by an output head: use "
                         "grpo, rloo or reinforce")
    dims = split.body(mx.array([[1]])).shape[-1]
    model.value_head = ValueHead(dims)


def start_value(model: nn.Module, mean_reward: float) -> None:
    """A fresh value head predicts `mean_reward` everywhere (its weight is 0)."""
    head = model.value_head
    if head.fresh:
        head.bias = mx.array([mean_reward], dtype=mx.float32)
        head.fresh = False


@contextlib.contextmanager
def adapters_loaded(model: nn.Module, adapters: dict[str, mx.array]) -> Iterator[None]:
    """Within the block the LoRA layers carry `adapters` (e.g. a moving reference's); the
    trained ones are put back on exit. Only arrays are swapped: no copy of the model."""
    current = list(adapter_weights(model).items())
    model.update(tree_unflatten(list(adapters.items())))
    try:
        yield
    finally:
        model.update(tree_unflatten(current))


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of `model` holds quantized weights."""
    return any(hasattr(m, "bits") for _, m in model.named_modules())


def add_lora(model: nn.Module, lora: Any, num_layers: int) -> None:
    params = {"rank": lora.rank, "scale": lora.scale, "dropout": lora.dropout}
    if lora.keys:
        params["keys"] = list(lora.keys)
    try:
        linear_to_lora_layers(model, num_layers, params)
    except ValueError as e:
        raise UsageError(f"lora.keys: {e}: pick module keys that exist in the model") from e
    if not lora_layers(model):
        raise UsageError("lora.keys matched no module of the model: leave it empty to adapt every "
                         "linear layer, or name keys like self_attn.q_proj")


@contextlib.contextmanager
def lora_disabled(model: nn.Module) -> Iterator[None]:
    """The frozen base model: within the block each LoRA layer is replaced by the layer it wraps
    (its `linear` or `embedding`), and put back on exit.

    That computes base(x) exactly, with no second copy of the weights for the KL reference, and
    skips the adapters' products (setting their scale to 0 would still compute them).
    """
    with _replaced(model, lambda m: isinstance(m, LORA_TYPES), _wrapped):
        yield


@contextlib.contextmanager
def _replaced(model: nn.Module, which: Any, new: Any) -> Iterator[None]:
    """Within the block, every submodule m with `which(m)` is replaced by `new(m)`; the
    originals are put back on exit."""
    mods = [(n, m) for n, m in model.named_modules() if which(m)]
    model.update_modules(tree_unflatten([(n, new(m)) for n, m in mods]))
    try:
        yield
    finally:
        model.update_modules(tree_unflatten(mods))


def _wrapped(layer: nn.Module) -> nn.Module:
    return layer.embedding if isinstance(layer, LoRAEmbedding) else layer.linear


def fused_lora_bytes(model: nn.Module) -> int | None:
    """Bytes of the weights `lora_fused` would create (None: some adapted layer is quantized, or
    there is no `LoRALinear` to fuse)."""
    mods = [m for _, m in lora_layers(model) if type(m) is LoRALinear]
    if not mods or any(isinstance(m.linear, nn.QuantizedLinear) for m in mods):
        return None
    return sum(m.linear.weight.nbytes for m in mods)


@contextlib.contextmanager
def lora_fused(model: nn.Module, max_bytes: int) -> Iterator[bool]:
    """Within the block, each `LoRALinear` is replaced by a plain layer with the weight
    W + scale * (A B)^T (mlx-lm's `fuse`), when those new weights take at most `max_bytes`;
    the adapters are put back on exit. Yields whether it fused.

    For decoding small models: one matrix product per layer instead of three (and two
    element-wise ops), which is most of a step's cost when a few rows are decoded at a time.
    The copies cost memory, so quantized layers are never fused (that would re-quantize) and
    the threshold keeps large models unfused. The result equals the unfused layers' up to
    float rounding; the LoRA weights themselves are not touched."""
    size = fused_lora_bytes(model)
    if size is None or size > max_bytes:
        yield False
        return
    with _replaced(model, lambda m: type(m) is LoRALinear, lambda m: m.fuse()):
        yield True


def adapter_config_for(policy: Policy) -> dict:
    return adapter_config(policy.lora, policy.base_model, policy.num_layers)
