"""Step time with the live dashboard on vs off, as a ratio (BENCHMARKS.md).

Runs `mlx-rlaif train` twice per repetition on the same random-weight tiny model, task file and
seed: once inside a pseudo-terminal (`script`), so the rich dashboard renders, and once with
`--no-dashboard`. Step times come from each run's batches.jsonl (`time/step`); the first step of
each run is dropped as warm-up. Repetitions alternate which mode goes first.

    python tools/bench_dashboard.py [--steps 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_rlaif.testing.randmodel import make_model_dir


def _tasks(path: Path, n: int = 16) -> Path:
    lines = [{"prompt": f"Write a Python function f{i}(x) that returns x + {i}.",
              "language": "python"} for i in range(n)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _run(model: Path, tasks: Path, out: Path, steps: int, dashboard: bool) -> list[float]:
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(model),
           "--train-file", str(tasks), "--output-dir", str(out), "--max-steps", str(steps),
           "--set", "reward.type=syntax", "--set", "generation.max_new_tokens=32",
           "--set", "training.num_epochs=100", "--set", "logging.tensorboard=false"]
    if dashboard:  # a pseudo-terminal, so stdout.isatty() and the live view renders
        cmd = ["script", "-qec", shlex.join(cmd), "/dev/null"]
    else:
        cmd.append("--no-dashboard")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    return [r["time/step"] for r in rows[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_model_dir(root / "model", "tiny")
        tasks = _tasks(root / "tasks.jsonl")
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(args.repeat):
            for dashboard in ((True, False) if rep % 2 == 0 else (False, True)):
                out = root / f"run-{rep}-{int(dashboard)}"
                times[dashboard] += _run(model, tasks, out, args.steps, dashboard)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(json.dumps({"step_s_dashboard_on": on, "step_s_dashboard_off": off,
                      "ratio_on_over_off": on / off, "steps_each": len(times[True]),
                      "command": " ".join(sys.argv)}, indent=2))


if __name__ == "__main__":
    main()
