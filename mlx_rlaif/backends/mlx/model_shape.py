"""A loaded mlx-lm model's sizes as the memory model needs them, read from the model itself:
its text model's `args` (nested `text_config` included: Qwen3.5, Mistral 3), what each block
keeps per position for the backward pass, and what its caches hold per position and per row.

- `text_args(model)`: the text model's arguments (`language_model.args`, or the `text_config`
  of the wrapper's `args`).
- `layer_elems(model, top_k, swiglu)`: per block, the activation elements kept per position,
  summed over the block's own layers: every linear layer's output (an expert layer's times
  the experts active per token, `top_k`; a convolution's channels), the block's input, its
  two norms' outputs and its residual (4 x hidden), and the gated product beside each `up`
  projection (`swiglu` of them: 1 with the CPU kernels, 3 with mlx-lm's SwiGLU). For a dense
  block (Qwen2) that is exactly memory.block_bytes's 7 hidden + 2 kv + 3 intermediate; an
  MoE block counts its router and its active experts, an SSM / linear-attention / convolution
  block its own projections.
- `cache_sizes(model)`: (key and value elements per position summed over the layers that keep
  a KV cache, bytes of recurrent state per row: SSM, convolution and linear-attention caches),
  read from mlx-lm's own prompt cache after one token.
- `once(model, name, make)`: what needs a forward pass (the caches' sizes, whether the head
  splits off) is measured once per loaded model, not at every step's memory limit.

Not covered: the scan's internal states of an SSM block beyond its projections' outputs (they
are recomputed or of the order of one projection), sliding-window caches (counted as full).
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

EXPERTS = (SwitchLinear, QuantizedSwitchLinear)
LINEAR = (nn.Linear, nn.QuantizedLinear, nn.Conv1d)  # their outputs: weight.shape[0]


def text_args(model: nn.Module) -> Any:
    """The text model's arguments: the innermost `language_model`'s `args`, else the model's,
    a nested `text_config` (a dict or an object) taking their place."""
    lm = model
    while isinstance(getattr(lm, "language_model", None), nn.Module):
        lm = lm.language_model
    args = getattr(lm, "args", None) or getattr(model, "args", None)
    nested = getattr(args, "text_config", None)
    if isinstance(nested, dict):
        return types.SimpleNamespace(**nested)
    return nested if nested is not None else args


def output_width(name: str, m: nn.Module, top_k: int) -> tuple[int, int]:
    """(elements per position that layer `m` outputs, those that are a gated `up` product's)."""
    if isinstance(m, EXPERTS):
        width = m.weight.shape[1] * top_k
    elif isinstance(m, LINEAR):
        width = m.weight.shape[0]
    else:
        return 0, 0
    own = name.removesuffix(".linear")  # LoRA's wrapped layer
    return width, width if own.rsplit(".", 1)[-1] == "up_proj" else 0


def layer_elems(model: nn.Module, hidden: int, top_k: int, swiglu: int) -> tuple[int, ...]:
    """Per block of `model.layers`: activation elements kept per position (module docstring)."""
    out = []
    for block in model.layers:
        widths = [output_width(n, m, top_k) for n, m in block.named_modules()]
        out.append(4 * hidden + sum(w for w, _ in widths) + swiglu * sum(u for _, u in widths))
    return tuple(out)


def cache_sizes(model: nn.Module) -> tuple[int, int]:
    """(KV elements per position over all layers, recurrent state bytes per row), from mlx-lm's
    prompt cache after a one-token forward of one row."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1]]), cache=cache))
    return sizes_of(cache)


def sizes_of(cache: list[Any]) -> tuple[int, int]:
    """`cache_sizes` of mlx-lm's prompt cache of one row after a forward pass through it."""
    kv, state = 0, 0
    for c in flat(cache):
        keys, values = getattr(c, "keys", None), getattr(c, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array):
            kv += keys.shape[1] * keys.shape[-1] + values.shape[1] * values.shape[-1]
        else:
            state += sum(a.nbytes for a in getattr(c, "cache", None) or []
                         if isinstance(a, mx.array))
    return kv, state


def flat(caches: list[Any]) -> list[Any]:
    """mlx-lm's caches with the lists of caches (CacheList) opened."""
    out = []
    for c in caches:
        inner = getattr(c, "caches", None)
        out.extend(flat(list(inner)) if isinstance(inner, (list, tuple)) else [c])
    return out


_MEASURED: dict[tuple[int, str], tuple[weakref.ref, Any]] = {}


def once(model: nn.Module, name: str, make: Callable[[], Any]) -> Any:
    """`make()`, computed once per live `model` object and `name` (held weakly: a model that is
    gone is forgotten, and a new one at the same address is measured again)."""
    hit = _MEASURED.get((id(model), name))
    if hit is not None and hit[0]() is model:
        return hit[1]
    for key in [k for k, (ref, _) in _MEASURED.items() if ref() is None]:
        del _MEASURED[key]
    value = make()
    _MEASURED[(id(model), name)] = (weakref.ref(model), value)
    return value
