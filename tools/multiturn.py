"""Does training with execution feedback teach self-repair? (issue 24)

    python tools/multiturn.py run base                       # the shipped model, untrained
    python tools/multiturn.py run single|multi --seed S [--minutes 3]
    python tools/multiturn.py report

`single` trains the quickstart recipe on every Python task of the synthetic suite (one answer
per rollout); `multi` the same with `generation.max_turns=2` (a failed answer gets the exec
reward's report on the visible tests and answers again; the last answer is scored on the hidden
tests). Both train for the same wall-clock budget (`training.max_minutes`; loading and
evaluation not counted). Each model is then evaluated on the 96 Python tasks of
`synthetic-eval`, 4 samples per task at T = 0.7, evaluation seed 0, always on the hidden tests:
pass@1 after turn 1 and after turn 2 (`eval --turns 2`), and the single-turn pass@2
(`eval --hidden-tests -n 4`): two independent answers, the fair baseline for a second turn
(Olausson et al., 2023), at no fewer generated tokens than the conversation. Results append to
.bench/multiturn/results.jsonl.

Not covered: more than two turns; the cost per step of K = 2 over K = 1 (tools/bench_ab.py
--workload exec --set-b generation.max_turns=2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from learning import MODEL, QUICKSTART, cli  # noqa: E402

WORK = ROOT / ".bench" / "multiturn"
SAMPLES = 4


def train(arm: str, seed: int, minutes: float, out: Path) -> None:
    args = ["train", "--config", str(QUICKSTART), "--output-dir", str(out), "--no-dashboard",
            "--set", "data.difficulties=[]", "--set", "data.eval_file=",
            "--set", f"training.seed={seed}", "--set", f"training.max_minutes={minutes}",
            "--set", "training.max_steps=0", "--set", "training.num_epochs=100",
            "--set", "training.save_every_batches=0", "--set", "logging.tensorboard=false"]
    if arm == "multi":
        args += ["--set", "generation.max_turns=2"]
    cli(*args, log=out.with_suffix(".log"))


def evaluate(adapter: Path | None, tag: Path) -> dict[str, float]:
    base = ["eval", "--model", MODEL, "--suite", "synthetic-eval", "--languages", "python",
            "--seed", "0", "-n", str(SAMPLES), "--temperature", "0.7"]
    if adapter is not None:
        base += ["--adapter", str(adapter)]
    from mlx_rlaif.train.evaluate import pass_at_k

    res = {}
    for name, extra in (("turns", ["--turns", "2"]), ("single", ["--hidden-tests"])):
        out = tag.with_name(f"{tag.name}-{name}.jsonl")
        cli(*base, *extra, "--out", str(out), log=out.with_suffix(".log"))
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        if name == "turns":
            res["pass@1_turn1"] = _mean([pass_at_k(r["n"], r["correct_turn1"], 1) for r in rows])
            res["pass@1_turn2"] = _mean([pass_at_k(r["n"], r["correct"], 1) for r in rows])
            res["answers_per_conversation"] = _mean([t for r in rows for t in r["turns"]])
        else:
            res["single_pass@1"] = _mean([pass_at_k(r["n"], r["correct"], 1) for r in rows])
            res["single_pass@2"] = _mean([pass_at_k(r["n"], r["correct"], 2) for r in rows])
        res["tasks"] = len(rows)
    return res


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def run(args: argparse.Namespace) -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    out = WORK / "runs" / f"{args.arm}-s{args.seed}"
    out.parent.mkdir(parents=True, exist_ok=True)
    for p in out.parent.glob(f"{out.name}*"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    tic, steps, step_s = time.monotonic(), 0, None
    if args.arm != "base":
        train(args.arm, args.seed, args.minutes, out)
        rows = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "time/step" in r]
        steps = len(rows)
        step_s = sorted(r["time/step"] for r in rows)[len(rows) // 2]
    wall = time.monotonic() - tic
    row = {"arm": args.arm, "seed": args.seed, "minutes": args.minutes, "steps": steps,
           "median_step_s": step_s, "train_wall_s": round(wall, 1),
           **evaluate(out if args.arm != "base" else None, out)}
    with (WORK / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return 0


def report(args: argparse.Namespace) -> int:
    import numpy as np

    rows = [json.loads(x) for x in (WORK / "results.jsonl").read_text().splitlines()]
    keys = ("pass@1_turn1", "pass@1_turn2", "single_pass@2", "answers_per_conversation")
    print("| model | seeds | steps | pass@1 turn 1 | pass@1 turn 2 | single-turn pass@2 | "
          "answers per conversation |")
    print("|---|---|---|---|---|---|---|")
    for arm in ("base", "single", "multi"):
        rs = list({r["seed"]: r for r in rows if r["arm"] == arm}.values())
        if not rs:
            continue
        cells = [f"{np.mean([r[k] for r in rs]):.3f}" + (
            f" ({min(r[k] for r in rs):.3f} to {max(r[k] for r in rs):.3f})" if len(rs) > 1
            else "") for k in keys]
        steps = "/".join(str(r["steps"]) for r in rs)
        print(f"| {arm} | {','.join(str(r['seed']) for r in rs)} | {steps} | "
              + " | ".join(cells) + " |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("arm", choices=["base", "single", "multi"])
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--minutes", type=float, default=3.0)
    sub.add_parser("report")
    args = p.parse_args()
    return {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
