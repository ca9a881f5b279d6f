"""DAPO's soft overlong penalty (Yu et al. 2025, "DAPO", section 3.4): a completion that uses the
last `buffer` tokens before the limit loses reward linearly in how far it went,

    penalty(L) = P * clip((L - (L_max - buffer)) / buffer, 0, 1)

L the completion's length in tokens, L_max = generation.max_new_tokens, P = rl.overlong_penalty
in reward units (DAPO's rewards span -1..1 and its penalty reaches 1; ours span 0..1, so the
same share of the range is P = 0.5). A completion cut at the limit has L = L_max: the whole P.

Order in a step (train/step.py): the rewards are scored, then shaped here, then turned into
advantages; `rl.mask_truncated` then leaves the truncated completions out of the loss (they
still count, shaped, in their group's baseline). The test for signal (dynamic sampling's
groups, drop_zero_std) reads the unshaped reward: length differences alone must not make a
group whose answers all fail look like signal. A reward that could not be scored (None) stays
None.

Not covered: per-turn lengths of a conversation (refused with generation.max_turns > 1).
"""

from __future__ import annotations

from collections.abc import Sequence


def penalty(length: int, max_tokens: int, buffer: int, size: float) -> float:
    """The penalty of a completion of `length` tokens (0 below max_tokens - buffer)."""
    if size <= 0 or buffer <= 0:
        return 0.0
    return size * min(max(length - (max_tokens - buffer), 0) / buffer, 1.0)


def shape(values: Sequence[float | None], lengths: Sequence[int], max_tokens: int, buffer: int,
          size: float) -> list[float | None]:
    """The rewards less each completion's penalty (None stays None)."""
    return [None if v is None else v - penalty(n, max_tokens, buffer, size)
            for v, n in zip(values, lengths, strict=True)]
