"""A/B of the RL step between two checkouts of mlx-rlaif (a refactor must not slow it down), or
between two settings of one checkout.

    python tools/bench_ab.py --a /path/to/old/checkout --b . [--pairs 6] [--steps 8]
    python tools/bench_ab.py --a . --b . --workload exec \
        --set-a generation.score_while_decoding=false    # scoring after vs while decoding

Each side runs in its own process with its checkout first on the path (PYTHONPATH), through the
public entry point both versions share (`mlx_rlaif.train.train(cfg, hub=...)`), on the same
random-weight model (the benchmark's tiny shape, built once), the same config (P x G = 2 x 4,
64 new tokens, syntax reward, KL on) and the system OpenBLAS preloaded as the CLI does. The
`exec` workload is the shipped tiny-coder on the synthetic suite's Python tasks with the exec
reward in its sandbox (P x G = 8 x 4, 96 new tokens): scoring costs as much as it does in use.
`--set-a` / `--set-b` add config overrides to one side. A
process reports the median `time/step` of its steps after two warm-up steps (compiles, caches).
The sides alternate in pairs (a, b, then b, a), so drifting background load favours neither;
the figure is the median over pairs of b / a. Single runs here differ by 20%: only the paired
median means anything.

Not covered: peak memory (tools/bench.py), other settings than the flags.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "AB-RESULT "

WORKER = r"""
import json, statistics, sys, tempfile
from mlx_rlaif.config import load
from mlx_rlaif.train import train
import mlx_rlaif

PHASES = ("time/step", "time/generate", "time/score", "time/train")

class Hub:
    def __init__(self): self.t = {k: [] for k in PHASES}
    def log_step(self, step, m):
        for k in PHASES: self.t[k].append(m[k])
    def message(self, text): pass
    def set_baseline(self, *a): pass
    def log_samples(self, *a): pass
    def end_epoch(self, *a): return {}
    def stats(self): return {}
    def close(self): return ""

model, steps, tasks, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
extra = json.loads(sys.argv[5])
out = tempfile.mkdtemp(prefix="ab-run-")
common = [f"training.output_dir={out}", "rl.kl_penalty=0.02", "rl.drop_zero_std=false",
          f"training.max_steps={steps}", "training.num_epochs=100", "logging.tensorboard=false",
          "training.learning_rate=1e-5", "training.save_every_epochs=0"]
if workload == "exec":
    sets = ["data.languages=[python]", "data.eval_file=", "training.batch_size=8",
            "generation.num_samples_per_prompt=4", "generation.max_new_tokens=96"]
else:
    sets = [f"model.path={model}", f"data.train_file={tasks}", "training.batch_size=2",
            "generation.num_samples_per_prompt=4", "generation.max_new_tokens=64",
            "reward.type=syntax"]
cfg = load(None, common + sets + extra)
hub = Hub()
train(cfg, hub=hub)
print("AB-RESULT " + json.dumps({"step_s": statistics.median(hub.t["time/step"][2:]),
                                 "phases": {k: statistics.median(v[2:]) for k, v in hub.t.items()},
                                 "package": mlx_rlaif.__file__}), flush=True)
"""


def fast_env(tree: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.cpu.blas import fast_blas_env

    env = fast_blas_env() or dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def run_side(tree: Path, model: Path, steps: int, tasks: Path, workload: str,
             extra: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", WORKER, str(model), str(steps), str(tasks),
                           workload, json.dumps(extra)],
                          env=fast_env(tree), capture_output=True, text=True, cwd=tree)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        raise SystemExit(f"{tree}: the worker failed:\n{proc.stderr[-3000:]}")
    res = json.loads(line[len(MARK):])
    if not res["package"].startswith(str(tree.resolve())):
        raise SystemExit(f"{tree}: imported {res['package']}, not this checkout")
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, type=Path, help="checkout A (the baseline)")
    p.add_argument("--b", required=True, type=Path, help="checkout B")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="steps per process (2 are warm-up)")
    p.add_argument("--workload", choices=["syntax", "exec"], default="syntax")
    p.add_argument("--set-a", action="append", default=[], help="a config override for A")
    p.add_argument("--set-b", action="append", default=[], help="a config override for B")
    p.add_argument("--out", type=Path, default=ROOT / ".bench" / "ab.json")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.testing.randmodel import make_model_dir

    work = ROOT / ".bench"
    model = work / "models" / "tiny"
    if not (model / "config.json").is_file():
        make_model_dir(model, "tiny", seed=0)
    tasks = work / "ab-tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Write a Python function number {i}."})
                             + "\n" for i in range(8)))
    a, b, ratios = [], [], []
    for i in range(args.pairs):
        sides = [(args.a, args.set_a), (args.b, args.set_b)]
        first, second = sides if i % 2 == 0 else sides[::-1]
        r1 = run_side(first[0].resolve(), model, args.steps, tasks, args.workload, first[1])
        r2 = run_side(second[0].resolve(), model, args.steps, tasks, args.workload, second[1])
        ra, rb = (r1, r2) if i % 2 == 0 else (r2, r1)
        a.append(ra["step_s"])
        b.append(rb["step_s"])
        ratios.append(rb["step_s"] / ra["step_s"])
        phases = ", ".join(f"{k.split('/')[1]} {ra['phases'][k]:.3f}/{rb['phases'][k]:.3f}"
                           for k in list(ra["phases"])[1:])
        print(f"pair {i + 1}: a {ra['step_s']:.3f} s, b {rb['step_s']:.3f} s, "
              f"b/a {ratios[-1]:.3f} ({phases})", flush=True)
    result = {"a": str(args.a), "b": str(args.b), "set_a": args.set_a, "set_b": args.set_b,
              "workload": args.workload, "a_step_s": a, "b_step_s": b,
              "ratio_b_over_a": ratios, "median_ratio": statistics.median(ratios),
              "median_a_s": statistics.median(a), "median_b_s": statistics.median(b)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"median step: a {result['median_a_s']:.3f} s, b {result['median_b_s']:.3f} s; "
          f"median of pairs b/a {result['median_ratio']:.3f} ({args.pairs} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
