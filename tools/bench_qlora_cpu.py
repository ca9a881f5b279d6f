"""QLoRA on MLX's CPU build with and without cpu/quantized.py: tests/test_qlora.py's run (the
shipped tiny model, quickstart settings, 16 RL steps on the train tasks of four easy families,
held-out eval of 12 tasks x 8 before and after), each variant in a fresh process, alternately:

- `4-bit, BLAS products`: `model.quantize=4`, the quantized layers multiplying through
  `dequantized_matmuls` (the default);
- `4-bit, quantized_matmul`: the same with no layer eligible (`cpu.quantized.eligible`
  patched: MLX's own kernel, as before it);
- `float32`: `model.quantize=0`, for reference.

Per variant, the best of `--repeat`: the whole run's seconds, its decoding and training seconds
(batches.jsonl's time/generate and time/train, summed), and the held-out pass@1 after. Run it
through the CLI's BLAS: the script re-executes itself with OpenBLAS preloaded, as the CLI does.

Usage: python tools/bench_qlora_cpu.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"4-bit, BLAS products": (4, False), "4-bit, quantized_matmul": (4, True),
            "float32": (0, False)}


def one(bits: int, kernel_only: bool) -> dict:
    """In this process: the run, its times and its pass@1."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_qlora import _run

    from mlx_rlaif.cpu import quantized

    if kernel_only:
        quantized.eligible = lambda layer: False
    t0 = time.perf_counter()
    steps, evals, _ = _run(Path(tempfile.mkdtemp(prefix="bench-qlora-")), bits)
    return {"total_s": time.perf_counter() - t0,
            "generate_s": sum(s["time/generate"] for s in steps),
            "train_s": sum(s["time/train"] for s in steps),
            "pass@1": evals["after"]["pass@1"], "before": evals["before"]["pass@1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT", json.dumps(one(int(args.one[0]), args.one[1] == "1")))
        return
    from mlx_rlaif.cpu.blas import fast_blas_env

    env = fast_blas_env() or dict(os.environ)
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name, (bits, kernel_only) in VARIANTS.items():
            out = subprocess.run([sys.executable, __file__, "--one", str(bits),
                                  "1" if kernel_only else "0"], capture_output=True, text=True,
                                 env=env, cwd=ROOT, check=True)
            r = json.loads(out.stdout.split("RESULT", 1)[1])
            if name not in best or r["total_s"] < best[name]["total_s"]:
                best[name] = r
    print(f"load average {os.getloadavg()[0]:.2f}; best of {args.repeat}\n")
    print("| variant | run s | decoding s | training s | held-out pass@1 before -> after |")
    print("|---|---|---|---|---|")
    for name, r in best.items():
        print(f"| {name} | {r['total_s']:.1f} | {r['generate_s']:.1f} | {r['train_s']:.1f} | "
              f"{r['before']:.3f} -> {r['pass@1']:.3f} |")


if __name__ == "__main__":
    main()
