"""The cost of on-policy distillation (issue 58): seconds and MLX peak memory per RL step with and
without a teacher, at a small random-weight shape, each variant a fresh `mlx-rlaif train`
process (the CLI's BLAS setup), one after the other:

- `no teacher`: GRPO on the `tiny` shape (4 layers, width 256, vocab 4096);
- `teacher, float`: the same with `distill.kind: teacher`, the teacher a random `tiny-teacher`
  shape (6 layers, width 512: about 4x the student's weights, the same toy tokenizer);
- `teacher, 4-bit`: the teacher quantized to 4 bits at load (`distill.teacher_quantize: 4`).

Syntax reward (no sandbox), P x G = 2 x 4 completions of up to `--tokens` tokens, `--steps`
steps. Per variant: the median of time/step over the steps after the first (the first compiles
its shapes), the median of distill/seconds (the teacher's pass), and memory/mlx_peak_gb (the
process's MLX peak over the run).

Not covered: the real shapes (0.5B student, 1.5B teacher in 4 bits: issue 58's part 5), Metal.

Usage: python tools/bench_distill.py [--steps 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"no teacher": None, "teacher, float": 0, "teacher, 4-bit": 4}


def run(student: Path, teacher: Path, out: Path, steps: int, tokens: int, quantize: int | None
        ) -> dict[str, float]:
    """One variant's CLI run; its per-step figures from batches.jsonl."""
    sets = ["reward.type=syntax", "generation.num_samples_per_prompt=4", "training.batch_size=2",
            f"generation.max_new_tokens={tokens}", "rl.drop_zero_std=false",
            "logging.tensorboard=false", "logging.collect_dataset=false",
            "training.save_every_epochs=0", "data.train_file=suite:synthetic-train",
            "data.languages=[python]", "data.eval_file="]
    if quantize is not None:
        sets += ["distill.kind=teacher", f"distill.teacher={teacher}",
                 f"distill.teacher_quantize={quantize}"]
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(student),
           "--output-dir", str(out), "--max-steps", str(steps), "--no-dashboard",
           *(a for s in sets for a in ("--set", s))]
    tic = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
    lines = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    later = lines[1:] or lines
    return {"step_s": statistics.median(m["time/step"] for m in later),
            "first_step_s": lines[0]["time/step"],
            "distill_s": statistics.median(m.get("distill/seconds", 0.0) for m in later),
            "peak_gb": lines[-1].get("memory/mlx_peak_gb", float("nan")),
            "run_s": time.perf_counter() - tic}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    from mlx_rlaif.testing.randmodel import make_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        student = make_model_dir(root / "student", "tiny", seed=4)
        teacher = make_model_dir(root / "teacher", "tiny-teacher", seed=5)
        print(f"student tiny, teacher tiny-teacher; P x G = 2 x 4, {args.tokens} tokens, "
              f"{args.steps} steps")
        print("| variant | s/step (median, steps 2..) | first step s | teacher pass s | "
              "MLX peak GB |")
        print("|---|---|---|---|---|")
        for name, q in VARIANTS.items():
            r = run(student, teacher, root / name.replace(" ", "").replace(",", "-"),
                    args.steps, args.tokens, q)
            print(f"| {name} | {r['step_s']:.3f} | {r['first_step_s']:.2f} | "
                  f"{r['distill_s']:.3f} | {r['peak_gb']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
