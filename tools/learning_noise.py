"""The learning protocol's own noise: arms run more than once with the same seed (A/A pairs).

    python tools/learning_noise.py [--on dev|eval] [--arm new]

Reads .bench/learning/results.jsonl (tools/learning.py), keeps the runs of one split, and for
every (arm, seed) run at least twice prints each run's gains over the frozen model (pass@1 at
T = 0.7, pass@8, greedy pass@1, in points) and the steps it reached, then per arm the mean and
the largest absolute difference between the first two runs of a seed: the smallest difference
between two arms that is more than the protocol's run-to-run noise. A difference of means over
3 seeds is compared with the A/A spread of means over the same seeds (printed last).

Not covered: a statistical test (3 seeds is too few for one; the table shows the spread).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / ".bench" / "learning" / "results.jsonl"
KEYS = ("pass@1", "pass@8", "greedy")


def pairs(rows: list[dict], on: str) -> dict[tuple[str, int], list[dict]]:
    """(arm, seed) -> its runs on split `on`, in the order they ran, where there are two or more."""
    runs: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        if r["on"] == on:
            runs[(r["arm"], r["seed"])].append(r)
    return {k: v for k, v in runs.items() if len(v) > 1}


def spread(runs: dict[tuple[str, int], list[dict]], arm: str, key: str) -> tuple[float, float, float]:
    """(mean |A - A'| over seeds, largest |A - A'|, |mean over seeds of A - mean of A'|) of the
    first two runs of each seed of `arm`, for gain `key`."""
    d = [r[1][f"gain/{key}"] - r[0][f"gain/{key}"] for (a, _), r in runs.items() if a == arm]
    return (sum(abs(x) for x in d) / len(d), max(abs(x) for x in d), abs(sum(d) / len(d)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--on", default="dev", choices=["dev", "eval"])
    p.add_argument("--arm", default=None, help="only this arm")
    args = p.parse_args(argv)
    if not RESULTS.exists():
        raise SystemExit(f"no {RESULTS}: run tools/learning.py run ARM ... first")
    rows = [json.loads(x) for x in RESULTS.read_text().splitlines() if x.strip()]
    runs = {k: v for k, v in pairs(rows, args.on).items() if args.arm in (None, k[0])}
    if not runs:
        raise SystemExit(f"no arm run twice with the same seed on {args.on}")
    print("| arm | seed | run | steps | pass@1 gain | pass@8 gain | greedy gain |")
    print("|---|---|---|---|---|---|---|")
    for (arm, seed), rs in sorted(runs.items()):
        for i, r in enumerate(rs):
            print(f"| {arm} | {seed} | {i + 1} | {r['steps']} | "
                  + " | ".join(f"{r[f'gain/{k}']:+.1f}" for k in KEYS) + " |")
    print()
    print("| arm | seeds | gain | mean abs A/A difference | largest | difference of 3-seed means |")
    print("|---|---|---|---|---|---|")
    for arm in sorted({a for a, _ in runs}):
        n = len([1 for a, _ in runs if a == arm])
        for k in KEYS:
            mean, top, means = spread(runs, arm, k)
            print(f"| {arm} | {n} | {k} | {mean:.1f} | {top:.1f} | {means:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
