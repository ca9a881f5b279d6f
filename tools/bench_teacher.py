"""Benchmark the teacher reward against the local fake API server (tests/fake_api.py).

Measures, with the real SDK clients over HTTP on 127.0.0.1 and the server (in its own process,
so it does not share our GIL) answering every request after a fixed delay (default 50 ms, a
stand-in for API latency):
1. scored completions per second at concurrency 1, 4 and 16 (judging only, fresh in-memory
   cache for every run, every completion distinct, so every completion is one API call);
2. the cache hit rate of a resumed run: a run scores the first half of its steps (references on)
   and stops; a new TeacherReward on the same cache file then scores all the steps again.

Not covered: real API latency distributions, rate limits, token throughput.

    python tools/bench_teacher.py [--provider openai|anthropic] [--n 128] [--delay-ms 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlx_rlaif.config import TeacherConfig  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402
from mlx_rlaif.rewards.teacher import TeacherReward  # noqa: E402

G = 4  # completions per task


def batch(n: int, salt: str = "") -> tuple[list[Task], list[str]]:
    """n distinct completions, G per task."""
    tasks = [Task(f"t{i // G}", f"Write f{i // G}(x) returning x + {i // G}.") for i in range(n)]
    codes = [f"def f{i // G}(x):\n    # variant {i}{salt}\n    return x + {i // G}"
             for i in range(n)]
    return tasks, codes


@contextmanager
def fake_server(delay_ms: float):
    """tests/fake_api.py in a subprocess; yields its port."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_api.py"),
                             "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def config(port: int, provider: str, **kw) -> TeacherConfig:
    url = f"http://127.0.0.1:{port}" + ("/v1" if provider == "openai" else "")
    return TeacherConfig(provider=provider, model="bench-judge", base_url=url, max_retries=0,
                         **kw)


def throughput(server: int, provider: str, n: int, concurrency: int) -> dict:
    tasks, codes = batch(n, salt=f" c{concurrency}")
    with TeacherReward(config(server, provider, concurrency=concurrency, reference=False)) as t:
        start = time.perf_counter()
        rewards = t.score(tasks, codes)
        seconds = time.perf_counter() - start
        calls = t.metrics()["teacher/calls"]
    scored = sum(r.value is not None for r in rewards)
    return {"concurrency": concurrency, "completions": n, "scored": scored, "calls": calls,
            "seconds": round(seconds, 3), "completions_per_s": round(scored / seconds, 1)}


def resumed(server: int, provider: str, n: int, steps: int, cache: Path) -> dict:
    batches = [batch(n, salt=f" step{s}") for s in range(steps)]
    cfg = config(server, provider, concurrency=16, reference=True, cache_path=str(cache))
    with TeacherReward(cfg) as first:
        for tasks, codes in batches[: steps // 2]:
            first.score(tasks, codes)
    with TeacherReward(cfg) as again:
        for tasks, codes in batches:
            again.score(tasks, codes)
        m = again.metrics()
    asked = m["teacher/calls"] + m["teacher/cache_hits"]
    return {"steps_first_run": steps // 2, "steps_resumed_run": steps,
            "resumed_calls": m["teacher/calls"], "resumed_cache_hits": m["teacher/cache_hits"],
            "hit_rate": round(m["teacher/cache_hits"] / asked, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    ap.add_argument("--n", type=int, default=128, help="completions per measured batch")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="server latency per request")
    ap.add_argument("--steps", type=int, default=4, help="steps of the resumed-run measurement")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "bench-key")
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
    with fake_server(args.delay_ms) as server, tempfile.TemporaryDirectory() as tmp:
        rows = [throughput(server, args.provider, args.n, c) for c in (1, 4, 16)]
        resume = resumed(server, args.provider, 16, args.steps, Path(tmp) / "cache.db")
    print(f"teacher benchmark: provider {args.provider}, fake server latency {args.delay_ms:g} ms")
    print(f"{'concurrency':>11} {'completions':>11} {'seconds':>8} {'completions/s':>13}")
    for r in rows:
        print(f"{r['concurrency']:>11} {r['scored']:>11} {r['seconds']:>8.2f} "
              f"{r['completions_per_s']:>13.1f}")
    print(f"resumed run: {resume['steps_first_run']} of {resume['steps_resumed_run']} steps cached "
          f"-> cache hit rate {resume['hit_rate']:.1%} ({resume['resumed_cache_hits']:.0f} hits, "
          f"{resume['resumed_calls']:.0f} calls)")
    if args.json:
        args.json.write_text(json.dumps({"throughput": rows, "resumed": resume}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
