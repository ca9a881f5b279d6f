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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..records import Rollout


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build(rollouts: Sequence[Rollout], adv: Sequence[Any], weights: Sequence[float],
          ref_logprobs: Sequence[Sequence[float]] | None = None, pad_to: int = 8,
          fields: Mapping[str, Sequence[Sequence[float]]] | None = None
          ) -> dict[str, np.ndarray]:
    """Arrays for a set of rows: tokens [N, T+1]; mask, weights, old_logp (and ref_logp) [N, T];
    adv [N] (or [N, T] where each rollout's advantage is per token). `ref_logprobs[i]` are the
    reference log-probs of rollout i's completion tokens; `fields` more per-token arrays (a
    critic's returns and old values), each [N, T] under its name."""
    rows = [list(r.prompt_tokens) + list(r.tokens) for r in rollouts]
    width = round_up(max(len(x) for x in rows) - 1, pad_to) + 1
    tokens = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    starts = [len(r.prompt_tokens) - 1 for r in rollouts]
    return {"tokens": tokens,
            **_targets(rollouts, starts, width - 1, adv, weights, ref_logprobs, fields)}


def _targets(rollouts: Sequence[Rollout], starts: Sequence[int], width: int,
             adv: Sequence[Any], weights: Sequence[float],
             ref_logprobs: Sequence[Sequence[float]] | None,
             fields: Mapping[str, Sequence[Sequence[float]]] | None) -> dict[str, np.ndarray]:
    """mask, weights, old_logp (ref_logp, the `fields`) [N, width], rollout i's completion at
    columns starts[i]..; adv [N], or [N, width] when given per token."""
    per_token = {"old_logp": [r.logprobs for r in rollouts], **dict(fields or {})}
    if ref_logprobs is not None:
        per_token["ref_logp"] = ref_logprobs
    if len(adv) and np.ndim(adv[0]) > 0:
        per_token["adv"] = adv
    n = len(rollouts)
    mask = np.zeros((n, width), dtype=np.float32)
    out = {k: np.zeros((n, width), dtype=np.float32) for k in per_token}
    for i, (r, start) in enumerate(zip(rollouts, starts, strict=True)):
        stop = start + len(r.tokens)
        mask[i, start:stop] = 1.0 if r.mask is None else r.mask  # feedback tokens: 0
        for k, values in per_token.items():
            out[k][i, start:stop] = values[i]
    out["mask"], out["weights"] = mask, mask * np.asarray(weights, dtype=np.float32)[:, None]
    if "adv" not in out:
        out["adv"] = np.asarray(adv, dtype=np.float32)
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


def build_shared(rollouts: Sequence[Rollout], adv: Sequence[Any], weights: Sequence[float],
                 ref_logprobs: Sequence[Sequence[float]] | None = None, pad_to: int = 8,
                 fields: Mapping[str, Sequence[Sequence[float]]] | None = None
                 ) -> dict[str, np.ndarray]:
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
            **_targets(rollouts, [0] * len(rollouts), width, adv, weights, ref_logprobs, fields)}
