"""What your own reward components cost per step: a trivial Python function (in its worker
processes) and a local reward server (`mlx-rlaif serve-reward` on 127.0.0.1), each beside the
syntax reward, on one step's batch of 32 completions (4 prompts x 8), against the syntax reward
alone. Not a test: BENCHMARKS.md has the figures and this command.

    python tools/bench_reward_components.py --repeats 30

For each setup: the median, min and max seconds of one `score` call over `--repeats` calls
after one warm-up call (the worker processes start at build time; the warm-up absorbs their
imports), and the overhead over the syntax reward alone (the difference of the medians). The
first call's seconds are printed apart: with a function, it waits for the workers to be ready.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlx_rlaif.records import Task
from mlx_rlaif.rewards.base import SyntaxReward
from mlx_rlaif.rewards.custom.components import ComponentsReward, Custom
from mlx_rlaif.rewards.custom.pool import WorkerPool
from mlx_rlaif.rewards.custom.server import ServerClient
from mlx_rlaif.rewards.custom.spec import load_function

TRIVIAL = "def trivial(completion):\n    return float(len(completion) % 2)\n"


def batch(prompts: int = 4, group: int = 8) -> tuple[list[Task], list[str]]:
    tasks = [Task(id=f"t{p}", prompt=f"def f{p}(x):\n") for p in range(prompts)
             for _ in range(group)]
    texts = [f"```python\ndef f{i // group}(x):\n    return x + {i}\n```" for i in
             range(prompts * group)]
    return tasks, texts


def timed(reward: ComponentsReward, tasks: list[Task], texts: list[str], repeats: int) -> dict:
    t0 = time.perf_counter()
    reward.score(tasks, texts)
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reward.score(tasks, texts)
        runs.append(time.perf_counter() - t0)
    reward.close()
    return {"first_s": first, "median_s": statistics.median(runs), "min_s": min(runs),
            "max_s": max(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    tasks, texts = batch()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "fns.py").write_text(TRIVIAL)
    spec = f"{tmp / 'fns.py'}:trivial"
    results = {"completions": len(texts), "repeats": args.repeats, "workers": args.workers}
    results["syntax alone"] = timed(ComponentsReward([("syntax", 1.0, SyntaxReward())], []),
                                    tasks, texts, args.repeats)
    fn = load_function(spec, {}, None)
    pool = WorkerPool(spec, {}, False, args.workers, 8, 30.0)
    function = Custom("trivial", 0.3, pool.run, spec, fn.batched, close=pool.close)
    results["syntax + function"] = timed(
        ComponentsReward([("syntax", 1.0, SyntaxReward())], [function]), tasks, texts,
        args.repeats)
    server = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward", spec,
                               "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://\S+/", server.stdout.readline()).group(0)
        client = ServerClient(url, "mlx-rlaif", {}, 30.0)
        results["syntax + server"] = timed(
            ComponentsReward([("syntax", 1.0, SyntaxReward())],
                             [Custom("rm", 0.3, client.score, url)]), tasks, texts,
            args.repeats)
    finally:
        server.terminate()
        server.wait(30)
    base = results["syntax alone"]["median_s"]
    for name in ("syntax + function", "syntax + server"):
        results[name]["overhead_ms"] = 1000 * (results[name]["median_s"] - base)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
