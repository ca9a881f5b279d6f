"""All-pairs covering arrays for the option-combination tests: rows of option values such that
every pair of two options' values appears in at least one row, except the pairs a constraint
refuses (each of those is returned, to be tested as a refusal). Greedy and seeded: the same
rows on every run.

Not covered: constraints over three or more options (a row is valid when none of its pairs is
refused), minimal arrays (greedy is within a few rows of them at these sizes).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Pair = tuple[str, Any, str, Any]


def pairs_of(row: Mapping[str, Any]) -> set[Pair]:
    names = sorted(row)
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def covering_rows(factors: Mapping[str, Sequence[Any]], refused: Callable[[Pair], bool],
                  seed: int = 0, tries: int = 300) -> tuple[list[dict[str, Any]], list[Pair]]:
    """(rows, refused pairs): every pair of values that `refused` allows is in a row, and no row
    holds a refused pair."""
    names = sorted(factors)
    every = [(a, x, b, y) for a, b in itertools.combinations(names, 2)
             for x in factors[a] for y in factors[b]]
    bad = [p for p in every if refused(p)]
    todo = [p for p in every if not refused(p)]
    uncovered, rows, rng = set(todo), [], random.Random(seed)
    for target in todo:
        if target not in uncovered:
            continue
        best, gain = None, 0
        for _ in range(tries):
            row = {n: rng.choice(list(factors[n])) for n in names}
            row[target[0]], row[target[2]] = target[1], target[3]
            held = pairs_of(row)
            if any(refused(p) for p in held):
                continue
            if len(held & uncovered) > gain:
                best, gain = row, len(held & uncovered)
        if best is None:
            raise AssertionError(f"no valid row found for {target}: a constraint over three "
                                 "options?")
        rows.append(best)
        uncovered -= pairs_of(best)
    return rows, bad
