"""A run's held-out gain with its standard error, paired by task.

    python tools/gain.py RUN_DIR [RUN_DIR ...]

For each run: the held-out evaluation the trainer ran before and after training (the run's
config.yaml: data.eval_file, its language and difficulty filters, data.eval_samples samples per
task at data.eval_temperature, evaluation seed training.seed), repeated through `mlx-rlaif eval`
on the base model and on the run's final adapters, per task. The gain's standard error is that
of the mean over tasks of (pass rate after - pass rate before): paired by task, it counts both
the sampling noise and how unlike the tasks are, where a binomial error over all samples would
pretend the samples independent. The figures printed first are checked against the run's own
eval.json (the same seeds give the same samples).

Not covered: runs without a held-out set, multi-turn evaluations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml


def eval_rows(run: Path, cfg: dict, adapter: Path | None, out: Path) -> list[dict]:
    d = cfg["data"]
    spec = d["eval_file"]
    suite = spec.split(":", 1)[1] if spec.startswith("suite:") else spec
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "eval", "--model", cfg["model"]["path"],
           "--suite", suite, "-n", str(d["eval_samples"]),
           "--temperature", str(d["eval_temperature"]), "--seed", str(cfg["training"]["seed"]),
           "--config", str(run / "config.yaml"), "--out", str(out)]
    if d.get("languages"):
        cmd += ["--languages", ",".join(d["languages"])]
    if d.get("difficulties"):
        cmd += ["--difficulties", ",".join(d["difficulties"])]
    if adapter is not None:
        cmd += ["--adapter", str(adapter)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"eval failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return [json.loads(x) for x in out.read_text().splitlines()]


def paired(before: list[dict], after: list[dict]) -> tuple[float, float, float, float]:
    """(pass@1 before, after, gain, standard error of the gain), per-task rates paired by id."""
    b = {r["id"]: r["correct"] / r["n"] for r in before}
    a = {r["id"]: r["correct"] / r["n"] for r in after}
    ids = sorted(b)
    diff = np.array([a[i] - b[i] for i in ids])
    return (float(np.mean([b[i] for i in ids])), float(np.mean([a[i] for i in ids])),
            float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff))))


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    print("| run | pass@1 before | after | gain (points) | standard error | gain / SE |")
    print("|---|---|---|---|---|---|")
    for name in argv:
        run = Path(name)
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        before = eval_rows(run, cfg, None, run / "gain-before.jsonl")
        after = eval_rows(run, cfg, run, run / "gain-after.jsonl")
        b, a, g, se = paired(before, after)
        logged = json.loads((run / "eval.json").read_text())
        if abs(logged["before"]["pass@1"] - b) > 1e-9 or abs(logged["after"]["pass@1"] - a) > 1e-9:
            print(f"note: {run}: eval.json says {logged['before']['pass@1']:.4f} -> "
                  f"{logged['after']['pass@1']:.4f}, this evaluation {b:.4f} -> {a:.4f}")
        print(f"| {run.name} | {b:.3f} | {a:.3f} | {100 * g:+.1f} | {100 * se:.1f} | "
              f"{g / se if se > 0 else float('inf'):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
