"""Gradient checkpointing per transformer block, for the duration of an update.

Within `checkpointed_blocks(model)` every block of `model.layers` runs under `mx.checkpoint`:
the backward pass keeps only each block's input and recomputes its activations, so activation
memory is one block's worth plus an input per block (mlx-lm's trainer has the same option,
`grad_checkpoint`, which patches the block class for the whole process; here the block
instances change class for the block only, and the decoder never sees it).

The shared-prompt forward (shared_prompt.py) runs each prompt once and lets the completion rows
attend to its keys and values through a `PrefixKV` cache. The prompt pass is left as it is (a
few positions per group); in the completion pass the prompt's keys and values enter the
checkpointed function as inputs, so their gradient reaches the prompt pass as without
checkpointing (tests/test_checkpointing.py).

Not covered: models whose blocks take other arguments than (x, mask, cache).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .shared_prompt import PrefixKV


@functools.cache
def _checkpointed(cls: type) -> type:
    """A subclass of a block class whose call is checkpointed."""

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        call = super(sub, self).__call__
        if isinstance(cache, PrefixKV) and cache.keys is None:  # the prompt pass: as it is
            return call(x, mask, cache)
        held = [cache.keys, cache.values] if isinstance(cache, PrefixKV) else []
        as_input = isinstance(mask, mx.array)

        def inner(params: Any, x: mx.array, *rest: mx.array) -> mx.array:
            self.update(params)
            if held:
                cache.keys, cache.values = rest[-2], rest[-1]
            return call(x, rest[0] if as_input else mask, cache)

        return mx.checkpoint(inner)(self.trainable_parameters(), x,
                                    *([mask] if as_input else []), *held)

    sub = type(f"Checkpointed{cls.__name__}", (cls,), {"__call__": __call__})
    return sub


@contextlib.contextmanager
def checkpointed_blocks(model: nn.Module, on: bool = True) -> Iterator[None]:
    """Within the block, the blocks of `model.layers` are checkpointed (a no-op when not `on`)."""
    layers = list(model.layers) if on else []
    classes = [type(layer) for layer in layers]
    for layer, cls in zip(layers, classes, strict=True):
        layer.__class__ = _checkpointed(cls)
    try:
        yield
    finally:
        for layer, cls in zip(layers, classes, strict=True):
            layer.__class__ = cls
