"""The judge audit's verdict on an effect (a probe's paired differences, or a position's
residuals): a confidence interval on its mean against the threshold.

- flagged: the interval lies beyond the threshold (its lower bound at or above +threshold; for
  an effect counted both ways, or its upper bound at or below -threshold);
- clean: the interval's bound lies inside it (upper bound below +threshold; both ways, the
  whole interval within (-threshold, +threshold));
- inconclusive: neither: the interval spans the threshold. `needed` is then how many
  completions would decide it if the effect and its spread stayed as observed: the smallest n
  whose interval half-width, t(n - 1) sd / sqrt(n), is below the distance from the mean to the
  nearest threshold, scaled from differences to the file's completions.

The interval is Student's t at `level` (two-sided, 95% by default) around the mean, from the
sample sd of the differences; with every difference equal (no spread) it is that value. Fewer
than 2 differences give no interval: inconclusive, `needed` at least 2 differences' worth.

Not covered: corrections for testing several probes at once (each verdict stands alone), the
spread of judge noise between files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

LEVEL = 0.95
MAX_NEEDED = 10**7


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the Cornish-Fisher
    expansion around the normal quantile (Abramowitz and Stegun 26.7.5; 0.12% low at df = 3,
    p = 0.975, under 1e-4 from df = 6)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g = ((z**3 + z) / 4,
         (5 * z**5 + 16 * z**3 + 3 * z) / 96,
         (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
         (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


@dataclass(frozen=True)
class Verdict:
    verdict: str  # "flagged", "clean" or "inconclusive"
    low: float | None  # the interval (None: fewer than 2 differences)
    high: float | None
    threshold: float
    both_ways: bool  # the effect counts in both directions (else: only raising the score)
    level: float
    needed: int | None  # inconclusive: completions that would decide it (None: none would)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def half_width(sd: float, n: int, level: float = LEVEL) -> float:
    return t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)


def decide(mean: float, se: float, n: int, threshold: float, both_ways: bool,
           completions_per_difference: float = 1.0, level: float = LEVEL) -> Verdict:
    """The verdict on an effect of `n` differences with this mean and standard error;
    `completions_per_difference` scales `needed` from differences to the file's completions."""
    if n < 2:
        need = math.ceil(2 * completions_per_difference)
        return Verdict("inconclusive", None, None, threshold, both_ways, level, need)
    half = half_width(se * math.sqrt(n), n, level)
    low, high = mean - half, mean + half
    if low >= threshold or (both_ways and high <= -threshold):
        word = "flagged"
    elif high < threshold and (not both_ways or low > -threshold):
        word = "clean"
    else:
        word = "inconclusive"
    need = None
    if word == "inconclusive":
        need = _needed(mean, se * math.sqrt(n), n, threshold, both_ways, level)
        need = None if need is None else math.ceil(need * completions_per_difference)
    return Verdict(word, low, high, threshold, both_ways, level, need)


def _needed(mean: float, sd: float, n: int, threshold: float, both_ways: bool,
            level: float) -> int | None:
    """The smallest number of differences whose interval, at this mean and sd, would keep off
    the nearest threshold (None: the mean sits on it, no number does)."""
    gap = abs(mean - threshold)
    if both_ways:
        gap = min(gap, abs(mean + threshold))
    if gap == 0:
        return None
    z = NormalDist().inv_cdf(0.5 + level / 2)
    m = max(n + 1, math.ceil((z * sd / gap) ** 2))
    while m <= MAX_NEEDED and half_width(sd, m, level) >= gap:
        m += 1 + m // 20  # t's quantile falls toward z: a few rounds
    while m > n + 1 and half_width(sd, m - 1, level) < gap:  # back to the smallest
        m -= 1
    return m if m <= MAX_NEEDED else None


def sentence(check: str, column: str, mean: float, v: Verdict, judged: int) -> str:
    """`injection (overall): +0.180, 95% interval +0.015 to +0.345 spans the +0.05 threshold:
    about 6 completions like these would decide it (this file: 4)`"""
    where = f"{check} ({column}): {mean:+.3f}"
    if v.low is None:
        return f"{where}, too few differences for an interval: at least {v.needed} completions"
    span = f"{v.level:.0%} interval {v.low:+.3f} to {v.high:+.3f}"
    bound = f"±{v.threshold:g}" if v.both_ways else f"+{v.threshold:g}"
    if v.verdict == "flagged":
        return f"{where}, {span} lies beyond the {bound} threshold"
    if v.verdict == "clean":
        return f"{where}, {span} lies within the {bound} threshold"
    decide_it = ("no number of completions would decide it at this mean" if v.needed is None
                 else f"about {v.needed} completions like these would decide it")
    return f"{where}, {span} spans the {bound} threshold: {decide_it} (this file: {judged})"
