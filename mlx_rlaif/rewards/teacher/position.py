"""Position bias in rank mode: the order a group is shown in, and the judge's own position
statistics to score against (`reward.teacher.rank_debias`).

A judge that favours the first candidate it reads pays for a position, not for code. With the
order shuffled per call, no candidate keeps a position, so the bias turns into noise; subtracting
the judge's mean score at each position (less its mean over all positions), estimated from every
shuffled call it has answered in this run, removes that noise as well:
`corrected = raw - (mean at this position - mean over positions)`, clipped to [0, 1]. Under random
orders a position's mean differs from the overall mean only by the judge's bias there, so the
correction is unbiased once the means are estimated.

Covered: `shuffled(n, seed)`: a permutation drawn from a sha256 of the seed text (the same group
and sample get the same order, so cached answers stay valid); `PositionStats`: running sums per
(group size, position, criterion); no correction for a group size until each of its positions has
`min_count` judgements (the estimate is noise before that).

Not covered: keeping the statistics across a resume (they start again, and correct nothing for
the first `min_count` judgements per position), interactions between position and candidate.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

MIN_COUNT = 20


def shuffled(n: int, seed: str) -> tuple[int, ...]:
    """`order[k]` is the index of the candidate shown at position k."""
    rng = random.Random(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    order = list(range(n))
    rng.shuffle(order)
    return tuple(order)


def rotation(n: int, k: int) -> tuple[int, ...]:
    """The identity order rotated by k: over k = 0..n-1 every candidate takes every position
    once (a Latin square)."""
    return tuple((i + k) % n for i in range(n))


class PositionStats:
    def __init__(self, min_count: int = MIN_COUNT) -> None:
        self.min_count = min_count
        self._sum: dict[tuple[int, int, str], float] = {}
        self._count: dict[tuple[int, int], int] = {}

    def update(self, n: int, pos: int, scores: Mapping[str, float]) -> None:
        self._count[(n, pos)] = self._count.get((n, pos), 0) + 1
        for name, v in scores.items():
            self._sum[(n, pos, name)] = self._sum.get((n, pos, name), 0.0) + v

    def ready(self, n: int) -> bool:
        return all(self._count.get((n, p), 0) >= self.min_count for p in range(n))

    def effect(self, n: int, pos: int, name: str) -> float:
        """The mean score at `pos` less the mean over positions (0 until ready)."""
        if not self.ready(n):
            return 0.0
        means = [self._sum.get((n, p, name), 0.0) / self._count[(n, p)] for p in range(n)]
        return means[pos] - sum(means) / n

    def correct(self, n: int, pos: int, scores: Mapping[str, float]) -> dict[str, float]:
        return {k: min(1.0, max(0.0, v - self.effect(n, pos, k))) for k, v in scores.items()}

    def max_abs_effect(self) -> float | None:
        """The largest |effect| over ready group sizes, positions and criteria (the
        `teacher/position_bias` metric), None before any group size is ready."""
        names = {k[2] for k in self._sum}
        sizes = [n for n in {k[0] for k in self._count} if self.ready(n)]
        found = [abs(self.effect(n, p, c)) for n in sizes for p in range(n) for c in names]
        return max(found) if found else None
