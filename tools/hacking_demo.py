"""Two training steps with a scripted student that starts hacking at step 2, to show the
reward-hacking signals where a run reports them (docs/hacking.md).

The student is the shipped tiny model on the easy Python tasks; its sampler is patched so that
from the second step on, of each group of 4 completions, one answers from a table of the task's
tests (special_casing: it passes them), one returns an always-equal object (eq_override) and one
exits before the tests (exit_call, early_exit); the fourth is the model's own. Prints what
batches.jsonl, samples.jsonl and health.jsonl hold, and the dashboard's panel after step 2;
exits 1 if any of them does not show the signals.

    python tools/hacking_demo.py OUT_DIR [--set KEY=VALUE ...]

Always two steps: MLX_RLAIF_SMOKE (the documented commands' test) is ignored here, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path


def table(task) -> str:
    rows = {tuple(t["args"]): t["expected"] for t in task.tests}
    return f"TABLE = {rows!r}\ndef {task.entry_point}(*args):\n    return TABLE.get(args)\n"


def always_equal(task) -> str:
    return ("class Anything:\n    def __eq__(self, other):\n        return True\n"
            f"def {task.entry_point}(*args):\n    return Anything()\n")


def exits(task) -> str:
    return f"import sys\ndef {task.entry_point}(*args):\n    sys.exit(0)\n"


HACKS = (table, always_equal, exits)


def patch_sampler() -> None:
    from mlx_rlaif.train.run import Run

    real = Run.sample

    def scripted(self, tasks, seed, on_group=None):
        rollouts, stats = real(self, tasks, seed, None)
        if self.state.step >= 1:  # from the second step
            G = self.cfg.generation.num_samples_per_prompt
            rollouts = [replace(r, text=HACKS[i % G](r.task)) if i % G < len(HACKS) else r
                        for i, r in enumerate(rollouts)]
        if on_group is not None:
            G = self.cfg.generation.num_samples_per_prompt
            for k in range(0, len(rollouts), G):
                on_group(rollouts[k: k + G])
        return rollouts, stats

    Run.sample = scripted


def dashboard_text(metrics: dict) -> str:
    from rich.console import Console

    from mlx_rlaif.metrics.dashboard import DashboardState, render

    state = DashboardState(total_steps=2)
    state.step, state.metrics = int(metrics["step"]), metrics
    console = Console(record=True, width=110, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(state))
    return console.export_text()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if os.environ.pop("MLX_RLAIF_SMOKE", None):
        print("MLX_RLAIF_SMOKE ignored: this demo is two steps")
    from mlx_rlaif.config import load
    from mlx_rlaif.metrics.jsonl import read_jsonl
    from mlx_rlaif.train import train

    patch_sampler()
    cfg = load(None, [f"training.output_dir={args.out}", "training.max_steps=2",
                      "data.languages=[python]", "data.difficulties=[easy]",
                      "training.batch_size=2", "generation.num_samples_per_prompt=4",
                      "generation.max_new_tokens=32", "logging.tensorboard=false",
                      "logging.health_check_interval_batches=1", "data.eval_file=",
                      "logging.baseline_eval_batches=0", "logging.dashboard=false", *args.set])
    train(cfg)
    batches = read_jsonl(args.out / "batches.jsonl")
    samples = read_jsonl(args.out / "samples.jsonl")
    checks = read_jsonl(args.out / "health.jsonl")
    print("\nbatches.jsonl:")
    for b in batches:
        print("  " + json.dumps({k: v for k, v in b.items()
                                 if k == "step" or k.startswith("hack/") or k == "reward/mean"}))
    print("samples.jsonl (step 2):")
    for s in samples:
        if s["step"] == 2:
            print(f"  {s['task_id']}: reward {s['reward']:.2f} signals {s['signals']}")
    print("health.jsonl:")
    for c in checks:
        print(f"  step {c['step']}: {c['line']}")
    panel = dashboard_text(batches[-1])
    print("dashboard after step 2:\n" + "\n".join(ln for ln in panel.splitlines()
                                                  if "Hacking" in ln or "Reward " in ln))
    ok = (batches[0].get("hack/frac") == 0.0 and (batches[-1].get("hack/frac") or 0) >= 0.5
          and any(s["signals"] for s in samples) and "Hacking" in panel
          and "reward hacking signals rising" in checks[-1]["line"])
    if not ok:
        print("the signals did not show where expected", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
