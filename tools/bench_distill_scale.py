"""The cost of on-policy distillation at the issue's shapes (issue 58, part 5): seconds and MLX
peak memory per RL step of a Qwen2.5-0.5B-shape student, without a teacher and with a
Qwen2.5-1.5B-shape teacher quantized to 4 bits at load (`distill.teacher_quantize: 4`), random
weights at the real shapes (mlx_rlaif/testing/randmodel.py; the 1.5B shape added here), each
variant a fresh `mlx-rlaif train` process, one after the other, on MLX's CPU build.

    python tools/bench_distill_scale.py [--steps 3] [--tokens 32] [--prompts 1] [--group 4]
    python tools/bench_distill_scale.py --why [--rows 2] [--length 64]

Syntax reward (no sandbox), `--prompts` x `--group` completions of `--tokens` tokens (random
weights rarely stop early), `--steps` steps. Per variant: the median of time/step over the
steps after the first (the first compiles its shapes), the first step's, the median of
distill/seconds (the teacher's pass) and memory/mlx_peak_gb (the process's MLX peak).

`--why`: one teacher forward (`--rows` x `--length` tokens) of the tiny-teacher and the 1.5B
shapes, timed three ways in this process (re-executed with OpenBLAS preloaded, as the CLI
runs; without it, MLX's bundled BLAS took 2.0 s for the tiny teacher's float forward): float32, 4-bit through this project's CPU path (the
products `x @ dequantize(W).T`: cpu/quantized.py, which the teacher's pass uses) and 4-bit
through MLX's own `quantized_matmul` kernel; the median of 2 after one warm-up.

Not covered: Metal (the shapes' cost there is another question), a trained teacher's stop
tokens (real completions end early; these run to `--tokens`), float teachers at 1.5B.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Qwen2.5-1.5B's shape (its config.json): 28 layers, width 1536, 12 heads, 2 KV heads, tied
QWEN_1_5B = dict(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936)


def models(root: Path) -> tuple[Path, Path]:
    """The student (qwen0.5b) and the teacher (1.5B) model directories, written once."""
    from mlx_rlaif.testing import randmodel

    randmodel.SHAPES.setdefault("qwen1.5b", QWEN_1_5B)
    dirs = (root / "student-0.5b", root / "teacher-1.5b")
    for path, shape, seed in zip(dirs, ("qwen0.5b", "qwen1.5b"), (4, 5), strict=True):
        if not (path / "config.json").is_file():
            randmodel.make_model_dir(path, shape, seed=seed)
    return dirs


def run(student: Path, teacher: Path | None, out: Path, args: argparse.Namespace
        ) -> dict[str, float]:
    """One variant's CLI run; its per-step figures from batches.jsonl."""
    sets = ["reward.type=syntax", f"generation.num_samples_per_prompt={args.group}",
            f"training.batch_size={args.prompts}", f"generation.max_new_tokens={args.tokens}",
            "rl.drop_zero_std=false", "logging.tensorboard=false",
            "logging.collect_dataset=false", "training.save_every_epochs=0",
            "data.train_file=suite:synthetic-train", "data.languages=[python]",
            "data.eval_file="]
    if teacher is not None:
        sets += ["distill.kind=teacher", f"distill.teacher={teacher}",
                 "distill.teacher_quantize=4"]
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(student),
           "--output-dir", str(out), "--max-steps", str(args.steps), "--no-dashboard",
           *(a for s in sets for a in ("--set", s))]
    subprocess.run(["rm", "-rf", str(out)], check=True)
    tic = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
    lines = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    later = lines[1:] or lines
    return {"step_s": statistics.median(m["time/step"] for m in later),
            "first_step_s": lines[0]["time/step"],
            "generate_s": statistics.median(m["time/generate"] for m in later),
            "train_s": statistics.median(m["time/train"] for m in later),
            "distill_s": statistics.median(m.get("distill/seconds", 0.0) for m in later),
            "peak_gb": lines[-1].get("memory/mlx_peak_gb", float("nan")),
            "run_s": time.perf_counter() - tic}


def forward_seconds(model: object, rows: int, length: int, swap: bool) -> float:
    """The median of 2 timed forwards (after one warm-up) of `rows` x `length` random ids;
    `swap`: inside this project's CPU fast paths (quantized layers through BLAS)."""
    import contextlib

    import mlx.core as mx

    from mlx_rlaif.cpu.kernels import training_fast_paths

    ids = mx.random.randint(0, 4000, (rows, length))
    times = []
    for i in range(3):
        with training_fast_paths(model) if swap else contextlib.nullcontext():
            tic = time.perf_counter()
            mx.eval(model(ids))
            if i:
                times.append(time.perf_counter() - tic)
    return statistics.median(times)


def why(root: Path, args: argparse.Namespace) -> None:
    """One teacher forward, float32 against 4-bit through BLAS and through MLX's kernel."""
    import mlx.core as mx
    from mlx_lm.utils import load_model, quantize_model

    from mlx_rlaif.testing.randmodel import make_model_dir

    tiny = root / "teacher-tiny"
    if not (tiny / "config.json").is_file():
        make_model_dir(tiny, "tiny-teacher", seed=5)
    print(f"one forward of {args.rows} x {args.length} tokens, seconds (the median of 2 after a warm-up)")
    print("| teacher shape | float32 | 4-bit, BLAS products (the teacher's pass) | "
          "4-bit, MLX quantized_matmul |")
    print("|---|---|---|---|")
    for name, path in (("tiny-teacher", tiny), ("Qwen2.5-1.5B", models(root)[1])):
        model, _ = load_model(path)
        model.eval()
        f32 = forward_seconds(model, args.rows, args.length, swap=True)
        quantize_model(model, {}, None, 4)
        mx.eval(model.parameters())
        blas = forward_seconds(model, args.rows, args.length, swap=True)
        kernel = forward_seconds(model, args.rows, args.length, swap=False)
        print(f"| {name} | {f32:.3f} | {blas:.3f} | {kernel:.3f} |")
        del model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompts", type=int, default=1)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--why", action="store_true")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--work", default=str(ROOT / ".bench" / "distill-scale"))
    args = p.parse_args()
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    if args.why:  # in this process: MLX's matmuls through the BLAS the trainer preloads
        from mlx_rlaif.cpu.blas import maybe_reexec_with_fast_blas

        maybe_reexec_with_fast_blas([sys.executable, *sys.argv])
        why(root, args)
        return
    student, teacher = models(root)
    print(f"student Qwen2.5-0.5B shape (float32), teacher Qwen2.5-1.5B shape (4-bit at load); "
          f"P x G = {args.prompts} x {args.group}, {args.tokens} tokens, {args.steps} steps")
    print("| variant | s/step (median, steps 2..) | first step s | generate s | train s | "
          "teacher pass s | MLX peak GB |")
    print("|---|---|---|---|---|---|---|")
    for name, t in (("no teacher", None), ("teacher 1.5B, 4-bit", teacher)):
        r = run(student, t, root / name.replace(" ", "-").replace(",", ""), args)
        print(f"| {name} | {r['step_s']:.2f} | {r['first_step_s']:.2f} | {r['generate_s']:.2f} "
              f"| {r['train_s']:.2f} | {r['distill_s']:.2f} | {r['peak_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
