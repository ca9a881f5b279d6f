"""Rollouts -> padded numpy arrays of a micro-batch, the layout both backends train on (each
converts them to its own arrays), and the row bookkeeping shared by both.

A row is prompt + completion, right-padded to a multiple of `pad_to` (default 8): a wide
multiple such as mlx-lm's 32 only adds work, 8 keeps shapes SIMD-friendly and wastes at most 7
positions per row (BENCHMARKS.md measures 32 vs 8). Target position j predicts tokens[j + 1];
the completion's targets are the positions [len(prompt) - 1, len(prompt) - 1 + len(completion)).
The weights of each row (`algo.aggregation`) multiply its mask.

`build_shared` is the layout of `backends/mlx/shared_prompt.py` (each distinct prompt held once,
the rows hold completions only): targets start at column 0, so every [N, W] array covers
completion tokens only.

Not covered: packing several sequences into one row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..records import Rollout


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build(rollouts: Sequence[Rollout], adv: Sequence[float], weights: Sequence[float],
          ref_logprobs: Sequence[Sequence[float]] | None = None,
          pad_to: int = 8) -> dict[str, np.ndarray]:
    """Arrays for a set of rows: tokens [N, T+1]; mask, weights, old_logp (and ref_logp) [N, T];
    adv [N]. `ref_logprobs[i]` are the reference log-probs of rollout i's completion tokens."""
    rows = [list(r.prompt_tokens) + list(r.tokens) for r in rollouts]
    width = round_up(max(len(x) for x in rows) - 1, pad_to) + 1
    tokens = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    starts = [len(r.prompt_tokens) - 1 for r in rollouts]
    return {"tokens": tokens,
            **_targets(rollouts, starts, width - 1, adv, weights, ref_logprobs)}


def _targets(rollouts: Sequence[Rollout], starts: Sequence[int], width: int,
             adv: Sequence[float], weights: Sequence[float],
             ref_logprobs: Sequence[Sequence[float]] | None) -> dict[str, np.ndarray]:
    """mask, weights, old_logp (and ref_logp) [N, width], rollout i's completion at columns
    starts[i]..; adv [N]."""
    n = len(rollouts)
    mask = np.zeros((n, width), dtype=np.float32)
    old = np.zeros((n, width), dtype=np.float32)
    ref = np.zeros((n, width), dtype=np.float32) if ref_logprobs is not None else None
    for i, (r, start) in enumerate(zip(rollouts, starts, strict=True)):
        stop = start + len(r.tokens)
        mask[i, start:stop] = 1.0
        old[i, start:stop] = r.logprobs
        if ref is not None:
            ref[i, start:stop] = ref_logprobs[i]
    w = mask * np.asarray(weights, dtype=np.float32)[:, None]
    out = {"mask": mask, "weights": w, "old_logp": old, "adv": np.asarray(adv, dtype=np.float32)}
    if ref is not None:
        out["ref_logp"] = ref
    return out


def chunks(n: int, size: int) -> list[slice]:
    """Row ranges of each micro-batch (size 0: one batch)."""
    size = size or max(n, 1)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def prompt_groups(rollouts: Sequence[Rollout]) -> list[list[int]]:
    """Indices of the rollouts that share a prompt (same tokens), in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(tuple(r.prompt_tokens), []).append(i)
    return list(groups.values())


def build_shared(rollouts: Sequence[Rollout], adv: Sequence[float], weights: Sequence[float],
                 ref_logprobs: Sequence[Sequence[float]] | None = None,
                 pad_to: int = 8) -> dict[str, np.ndarray]:
    """Arrays for rows whose prompts are held once (shared_prompt.py): prefix [P, Lp] (the
    distinct prompts without their last token, left-padded), prefix_len [P], group [N]; tokens
    [N, W + 1] (the prompt's last token, then the completion); mask, weights, old_logp (and
    ref_logp) [N, W]; adv [N]."""
    prompts: dict[tuple[int, ...], int] = {}
    group = [prompts.setdefault(tuple(r.prompt_tokens), len(prompts)) for r in rollouts]
    lp = max(len(q) - 1 for q in prompts)
    prefix = np.zeros((len(prompts), lp), dtype=np.int32)
    for q, g in prompts.items():
        if len(q) > 1:
            prefix[g, lp - len(q) + 1:] = q[:-1]
    width = round_up(max(max(len(r.tokens) for r in rollouts), 1), pad_to)
    tokens = np.zeros((len(rollouts), width + 1), dtype=np.int32)
    for i, r in enumerate(rollouts):
        tokens[i, 0] = r.prompt_tokens[-1]
        tokens[i, 1:len(r.tokens) + 1] = r.tokens
    return {"prefix": prefix, "prefix_len": np.array([len(q) - 1 for q in prompts], dtype=np.int32),
            "group": np.asarray(group, dtype=np.int32), "tokens": tokens,
            **_targets(rollouts, [0] * len(rollouts), width, adv, weights, ref_logprobs)}
