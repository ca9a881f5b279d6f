"""Tasks that do not fit the model: a prompt whose tokens plus `generation.max_new_tokens` exceed
the model's context is skipped when the run is set up (trainer.py), counted and named in one
line; a run left with no task stops there with a DataError, before anything is written.

Skipped, not truncated: a cut prompt is a different task (its tests may check the part that was
cut). The context is the model config's `max_position_embeddings` (MLX `model.args`, torch
`model.config`); a model that does not state one is not checked.

Not covered: tokenizers whose chat template changes length with the batch, sliding-window models
whose usable context is longer than `max_position_embeddings`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import DataError
from ..records import Task


def context_length(model: Any) -> int | None:
    """The model's context in tokens, from its config; None when it states none."""
    for holder in (getattr(model, "args", None), getattr(model, "config", None)):
        n = getattr(holder, "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
    return None


def fit_context(tasks: list[Task], fmt: Callable[[Task], list[int]], context: int | None,
                max_new_tokens: int, what: str) -> tuple[list[Task], str | None]:
    """(the tasks that fit, a line naming the skipped ones or None). `what` names the task set
    in messages ("training", "held-out"). DataError when none fits."""
    if context is None or not tasks:
        return tasks, None
    room = context - max_new_tokens
    sizes = [len(fmt(t)) for t in tasks]
    kept = [t for t, n in zip(tasks, sizes, strict=True) if n <= room]
    if len(kept) == len(tasks):
        return tasks, None
    long = [f"{t.id} ({n} tokens)" for t, n in zip(tasks, sizes, strict=True) if n > room]
    line = (f"skipped {len(long)} of {len(tasks)} {what} tasks whose prompt + "
            f"generation.max_new_tokens ({max_new_tokens}) exceed the model's context "
            f"({context} tokens): {', '.join(long[:3])}{' ...' if len(long) > 3 else ''}")
    if not kept and what == "training":
        raise DataError(f"{line}; none is left: shorten the prompts or lower "
                        "generation.max_new_tokens")
    return kept, line
