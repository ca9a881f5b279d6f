"""Rollouts -> padded numpy arrays of a micro-batch, the layout both backends train on (each
converts them to its own arrays), and the row bookkeeping shared by both.

A row is prompt + completion, right-padded to a multiple of `pad_to` (default 8): a wide
multiple such as mlx-lm's 32 only adds work, 8 keeps shapes SIMD-friendly and wastes at most 7
positions per row (BENCHMARKS.md measures 32 vs 8). `bucketed` (the MLX update and reference
pass, whose compiled functions trace once per shape) rounds the shapes further to a few buckets
(`bucket_length`, and the rows to `rows_to`, `bucket`): at most 1/8 more positions than the
multiple of 8, so a run traces a handful of shapes instead of one per length. A shared prompt,
computed once per group of G rows, takes coarser buckets (`PROMPT_BITS`: at most 50% over, a
few percent of a step's positions). Padded positions and rows carry mask and weight 0 (their
gradient is zero). Target position j predicts tokens[j + 1];
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


def bucket(n: int, bits: int = 3) -> int:
    """`n` rounded up to `bits` significant binary digits (every n up to 2**bits is its own
    bucket): at most 1 / 2**(bits - 1) over it. bits=3: 1..8, 10, 12, 14, 16, 20, 24, ..."""
    shift = max(n.bit_length() - bits, 0)
    return -(-n >> shift) << shift


def bucket_length(n: int, pad_to: int = 8, bits: int = 4) -> int:
    """A padded length: the multiple of `pad_to`, then `bits` significant binary digits (4: 8
    buckets per doubling, 64, 72, ..., 128, 144, ...: at most 12.5% more positions)."""
    return round_up(bucket(round_up(n, pad_to), bits), pad_to)


PROMPT_BITS = 2  # a shared prompt's length: 32, 48, 64, 96, 128, ... (computed once per group)


def pad_rows(arrays: dict[str, np.ndarray], rows: int | None, per_prompt: tuple[str, ...] = ()
             ) -> dict[str, np.ndarray]:
    """Every array but those `per_prompt` padded with zero rows to `rows` (None: as they are):
    a padded row has mask and weight 0."""
    if rows is None:
        return arrays
    return {k: v if k in per_prompt or v.shape[0] >= rows else
            np.concatenate([v, np.zeros((rows - v.shape[0], *v.shape[1:]), v.dtype)])
            for k, v in arrays.items()}


def build(rollouts: Sequence[Rollout], adv: Sequence[Any], weights: Sequence[float],
          ref_logprobs: Sequence[Sequence[float]] | None = None, pad_to: int = 8,
          fields: Mapping[str, Sequence[Sequence[float]]] | None = None,
          bucketed: bool = False, rows_to: int | None = None) -> dict[str, np.ndarray]:
    """Arrays for a set of rows: tokens [N, T+1]; mask, weights, old_logp (and ref_logp) [N, T];
    adv [N] (or [N, T] where each rollout's advantage is per token). `ref_logprobs[i]` are the
    reference log-probs of rollout i's completion tokens; `fields` more per-token arrays (a
    critic's returns and old values), each [N, T] under its name. `bucketed`: T rounded up to
    `bucket_length`; `rows_to`: N padded to it with zero-weight rows."""
    rows = [list(r.prompt_tokens) + list(r.tokens) for r in rollouts]
    length = max(len(x) for x in rows) - 1
    width = (bucket_length(length, pad_to) if bucketed else round_up(length, pad_to)) + 1
    tokens = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    starts = [len(r.prompt_tokens) - 1 for r in rollouts]
    return pad_rows({"tokens": tokens, **_targets(rollouts, starts, width - 1, adv, weights,
                                                  ref_logprobs, fields)}, rows_to)


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
    # the tokens sampled at the trainer's weights (a carried group's were not: records.Rollout)
    out["sampled"] = mask * np.asarray([r.behind == 0 for r in rollouts], np.float32)[:, None]
    if "adv" not in out:
        out["adv"] = np.asarray(adv, dtype=np.float32)
    return out


def chunks(n: int, size: int) -> list[slice]:
    """Row ranges of each micro-batch (size 0: one batch)."""
    size = size or max(n, 1)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def even_chunks(n: int, size: int) -> list[slice]:
    """Row ranges of as few micro-batches of at most `size` rows as hold `n` (size 0: one),
    of sizes differing by at most one (16 rows at most 6: 6, 5, 5)."""
    k = -(-n // size) if size and n else 1
    cuts = [-(-i * n // k) for i in range(k + 1)]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def prompt_groups(rollouts: Sequence[Rollout]) -> list[list[int]]:
    """Indices of the rollouts that share a prompt (same tokens), in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(tuple(r.prompt_tokens), []).append(i)
    return list(groups.values())


def build_shared(rollouts: Sequence[Rollout], adv: Sequence[Any], weights: Sequence[float],
                 ref_logprobs: Sequence[Sequence[float]] | None = None, pad_to: int = 8,
                 fields: Mapping[str, Sequence[Sequence[float]]] | None = None,
                 bucketed: bool = False, rows_to: int | None = None) -> dict[str, np.ndarray]:
    """Arrays for rows whose prompts are held once (shared_prompt.py): prefix [P, Lp] (the
    distinct prompts without their last token, left-padded), prefix_len [P], group [N]; tokens
    [N, W + 1] (the prompt's last token, then the completion); mask, weights, old_logp (and
    ref_logp) [N, W]; adv [N]. `bucketed`: W and Lp rounded up to `bucket_length`, P to
    `bucket` (empty prompts, which no row reads); `rows_to`: N padded with zero-weight rows."""
    prompts: dict[tuple[int, ...], int] = {}
    group = [prompts.setdefault(tuple(r.prompt_tokens), len(prompts)) for r in rollouts]
    lp = max(len(q) - 1 for q in prompts)
    lp = bucket_length(lp, pad_to, PROMPT_BITS) if bucketed and lp else lp
    prefix = np.zeros((bucket(len(prompts)) if bucketed else len(prompts), lp), dtype=np.int32)
    lengths = np.zeros(len(prefix), dtype=np.int32)
    for q, g in prompts.items():
        lengths[g] = len(q) - 1
        if len(q) > 1:
            prefix[g, lp - len(q) + 1:] = q[:-1]
    longest = max(max(len(r.tokens) for r in rollouts), 1)
    width = bucket_length(longest, pad_to) if bucketed else round_up(longest, pad_to)
    tokens = np.zeros((len(rollouts), width + 1), dtype=np.int32)
    for i, r in enumerate(rollouts):
        tokens[i, 0] = r.prompt_tokens[-1]
        tokens[i, 1:len(r.tokens) + 1] = r.tokens
    return pad_rows({"prefix": prefix, "prefix_len": lengths,
                     "group": np.asarray(group, dtype=np.int32), "tokens": tokens,
                     **_targets(rollouts, [0] * len(rollouts), width, adv, weights, ref_logprobs,
                                fields)}, rows_to, per_prompt=("prefix", "prefix_len"))
