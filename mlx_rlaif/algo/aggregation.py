"""Loss aggregation: the per-token weight of each sequence, computed once over the whole rollout
batch, so the loss divisor is global and the gradient does not depend on the micro-batch size.

    token     w = 1 / (completion tokens in the whole batch)             (DAPO, default)
    sequence  w = 1 / (len(completion) * sequences in the batch)          (GRPO)
    constant  w = 1 / (max_new_tokens * sequences of the configured batch) (Dr. GRPO)

Dr. GRPO's divisor is a constant: the configured batch's sequence count (P x G), not the number
left after zero-variance groups are dropped, which changes from step to step.

Not covered: divisors reduced across ranks (the caller passes the global counts).
"""

from __future__ import annotations

from collections.abc import Sequence


def aggregation_weights(lengths: Sequence[int], agg: str, max_new_tokens: int,
                        batch_sequences: int = 0) -> list[float]:
    """The per-token weight of each sequence (all its completion tokens share it).
    `batch_sequences`: the configured batch's sequence count, the constant divisor's (0: the
    sequences given)."""
    n = len(lengths)
    if n == 0:
        return []
    if agg == "token":
        total = sum(lengths)
        return [1.0 / total if total else 0.0] * n
    if agg == "sequence":
        return [1.0 / (max(length, 1) * n) for length in lengths]
    return [1.0 / (max_new_tokens * (batch_sequences or n))] * n
