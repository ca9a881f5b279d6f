"""One forward for the G completions of a prompt, with the prompt computed once.

A GRPO batch holds G completions of each prompt. Forwarding every row in full runs the prompt's
positions G times; here the prompt runs once (one row) and its per-layer keys and values are
broadcast to the G completion rows, which attend to them as to a KV cache. The graph stays
differentiable end to end (the broadcast sums the G rows' gradients back into the one prompt
pass), so the same forward serves the loss, its gradient and the reference pass, and gives the
same log-probs as the full forward up to float rounding (tests/test_shared_prompt.py).

Row layout: `prefix` [1, Lp - 1] is the prompt without its last token; `tokens` [G, W + 1] is
that last token followed by each completion (right-padded), so `logits(tokens[:, :-1])[:, j]`
predicts completion token j.

Covered: mlx-lm models whose prompt cache is made of plain `KVCache` layers (Llama, Qwen2/3,
Mistral, Phi-3, Gemma 1/2, ... the common decoder-only families). Other models (sliding-window
or rotating caches, state-space layers) are detected by `supported` and take the full forward.
Not covered: sharing across micro-batches (each micro-batch recomputes its prompt).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache


class PrefixKV:
    """Stands in for one layer's KV cache: the first call stores the prompt's keys and values,
    later calls return them broadcast to the batch and concatenated with the new ones."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values, self.offset = keys, values, keys.shape[2]
            return keys, values
        n = keys.shape[0]
        k = mx.broadcast_to(self.keys, (n, *self.keys.shape[1:]))
        v = mx.broadcast_to(self.values, (n, *self.values.shape[1:]))
        return mx.concatenate([k, keys], axis=2), mx.concatenate([v, values], axis=2)


def supported(model: nn.Module) -> bool:
    """Whether `model` attends through plain KV caches (so a PrefixKV can stand in for one)."""
    try:
        caches = make_prompt_cache(model)
    except Exception:  # noqa: BLE001  (any model mlx-lm cannot make a cache for)
        return False
    return bool(caches) and all(type(c) is KVCache for c in caches)


def logits(model: nn.Module, prefix: mx.array, tokens: mx.array) -> mx.array:
    """Logits of `tokens` [G, W] after the shared `prefix` [1, Lp] (Lp may be 0): [G, W, V]."""
    if prefix.shape[1] == 0:
        return model(tokens)
    cache = [PrefixKV() for _ in model.layers]
    model(prefix, cache=cache)  # only the keys and values are used: the head's output is dropped
    return model(tokens, cache=cache)
