"""Loss aggregation: the per-token weight of each sequence, computed once over the whole rollout
batch, so the loss divisor is global and the gradient does not depend on the micro-batch size.

    token     w = 1 / (completion tokens in the whole batch)             (DAPO, default)
    sequence  w = 1 / (len(completion) * sequences in the batch)          (GRPO)
    constant  w = 1 / (max_new_tokens * sequences of the configured batch) (Dr. GRPO)

`rl.loss_agg: auto` (the default) is `sequence` with GSPO's sequence-level ratios (the paper's
1/G: each sequence counts once, whatever its length) and `token` with token-level ratios;
`loss_aggregation` resolves it, and every reader of the aggregation (both backends) calls it.

Dr. GRPO's divisor is a constant: the configured batch's sequence count (P x G), not the number
left after zero-variance groups are dropped, which changes from step to step.

With several ranks (data parallel) each rank weighs its own sequences with the whole step's
counts (`total_tokens`, `total_sequences`, summed over the ranks by the caller), so the ranks'
gradients add up to the one-process gradient of the whole batch.

Not covered: reducing the counts (train/distributed.py does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def loss_aggregation(rl: Any) -> str:
    """The aggregation of the RL config section `rl`: its `loss_agg`, with `auto` resolved by
    the ratio level (sequence ratios: `sequence`, token ratios: `token`)."""
    if rl.loss_agg != "auto":
        return rl.loss_agg
    return "sequence" if rl.ratio_level == "sequence" else "token"


def aggregation_weights(lengths: Sequence[int], agg: str, max_new_tokens: int,
                        batch_sequences: int = 0, total_tokens: int | None = None,
                        total_sequences: int | None = None) -> list[float]:
    """The per-token weight of each sequence (all its completion tokens share it).
    `batch_sequences`: the configured batch's sequence count, the constant divisor's (0: the
    sequences given). `total_tokens`, `total_sequences`: the whole step's kept completion tokens
    and sequences when `lengths` are one rank's part of it (None: `lengths` are the whole)."""
    n = len(lengths)
    if n == 0:
        return []
    seqs = n if total_sequences is None else total_sequences
    if agg == "token":
        total = sum(lengths) if total_tokens is None else total_tokens
        return [1.0 / total if total else 0.0] * n
    if agg == "sequence":
        return [1.0 / (max(length, 1) * seqs) for length in lengths]
    if agg != "constant":  # "auto" unresolved (`loss_aggregation`) or a typo: never a default
        raise ValueError(f"unknown loss aggregation {agg!r}: resolve rl.loss_agg with "
                         "loss_aggregation(rl)")
    return [1.0 / (max_new_tokens * (batch_sequences or seqs))] * n
