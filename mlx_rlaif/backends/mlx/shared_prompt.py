"""One forward for a micro-batch of completions, with each prompt computed once.

A GRPO batch holds G completions of each prompt. Forwarding every row in full runs each prompt's
positions G times; here the micro-batch's distinct prompts run once, together (left-padded to a
common length), and their per-layer keys and values are gathered to the completion rows, which
attend to them as to a KV cache. The graph stays differentiable end to end (the gather sums the
G rows' gradients back into the one prompt pass), so the same forward serves the loss, its
gradient and the reference pass, and gives the full forward's log-probs up to float rounding
(tests/test_shared_prompt.py).

Layout (batch.build_shared): `prefix` [P, Lp], the distinct prompts without their last token,
left-padded; `prefix_len` [P]; `group` [N], the prompt of each row; `tokens` [N, W + 1], the
prompt's last token followed by the completion (right-padded), so `logits[:, j]` predicts
completion token j. Left padding shifts a row's positions by a constant, which RoPE's relative
attention does not see; padded keys are masked out.

Covered: mlx-lm models whose prompt cache is made of plain `KVCache` layers and that build their
attention mask from the cache (Llama, Qwen2/3, Mistral, Phi-3, Gemma, ... the common decoder-only
families). Others (sliding-window or rotating caches, state-space layers) are detected by
`supported` and take the full forward. Not covered: sharing a prompt across micro-batches.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache


class PrefixKV:
    """Stands in for one layer's KV cache. The first call (the prompt pass) stores the prompts'
    keys and values; later calls return each row's prompt entries followed by its new ones.
    `make_mask` gives both passes their attention masks (mlx-lm asks the first layer's cache)."""

    def __init__(self, valid: mx.array, group: mx.array) -> None:
        self.valid, self.group = valid, group  # [P, Lp] bool (False on left padding), [N]
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values, self.offset = keys, values, keys.shape[2]
            return keys, values
        return (mx.concatenate([self.keys[self.group], keys], axis=2),
                mx.concatenate([self.values[self.group], values], axis=2))

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None
                  ) -> mx.array:
        causal = mx.tril(mx.ones((n, n), dtype=mx.bool_))
        if self.keys is None:  # the prompt pass: causal over real tokens; a pad sees itself
            keep = causal[None] & self.valid[:, None, :]
            return (keep | mx.eye(n, dtype=mx.bool_)[None])[:, None]
        rows = self.valid[self.group]  # [N, Lp]
        prefix = mx.broadcast_to(rows[:, None, :], (rows.shape[0], n, rows.shape[1]))
        own = mx.broadcast_to(causal[None], (rows.shape[0], n, n))
        return mx.concatenate([prefix, own], axis=-1)[:, None]


def supported(model: nn.Module) -> bool:
    """Whether `model` attends through plain KV caches (so a PrefixKV can stand in for one)."""
    try:
        caches = make_prompt_cache(model)
    except Exception:  # noqa: BLE001  (any model mlx-lm cannot make a cache for)
        return False
    return bool(caches) and all(type(c) is KVCache for c in caches)


def logits(model: nn.Module, mb: dict[str, mx.array], tokens: mx.array) -> mx.array:
    """The model's outputs for `tokens` [N, W] after each row's prompt (mb's prefix/prefix_len/
    group): logits [N, W, V], or hidden states [N, W, D] when `model` is a transformer body
    (`loss.Split.body`)."""
    prefix = mb["prefix"]
    if prefix.shape[1] == 0:
        return model(tokens)
    valid = mx.arange(prefix.shape[1])[None, :] >= (prefix.shape[1] - mb["prefix_len"])[:, None]
    cache = [PrefixKV(valid, mb["group"]) for _ in model.layers]
    model(prefix, cache=cache)  # only the keys and values are used: the head is never evaluated
    return model(tokens, cache=cache)


def batch_logits(model: nn.Module, mb: dict[str, mx.array]) -> mx.array:
    """The model's outputs (as `logits`) for a micro-batch in either layout:
    batch.build_shared's (with `prefix`) or batch.build's (every row in full)."""
    inputs = mb["tokens"][:, :-1]
    return logits(model, mb, inputs) if "prefix" in mb else model(inputs)
