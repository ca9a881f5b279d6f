"""How far the sampler's log-probs are from the trainer's (issue 37), per model dtype and decoding
path: `mlx-rlaif train` with the quickstart recipe on the shipped tiny model for a few steps per
setting, and the gap every step measured for free (policy/sampler_kl, .._logp_absdiff_max,
.._far_frac: algo/correction.py) read back from batches.jsonl.

    python tools/bench_agreement.py [--steps 8] [--dtypes float32,bfloat16,q4,q4-bfloat16]
                                    [--kernels on,off] [--out .bench/agreement]

Settings: dtype float32 (as shipped), bfloat16 (the model converted once with `mlx-rlaif convert
--dtype bfloat16`), q4 and q4-bfloat16 (model.quantize 4 on the float32 or the bfloat16
weights: QLoRA, computing in the scales' dtype; quantized layers are never fused, so their two
decoding rows are the same path); decoding fused (the LoRA folded into a
copy of the weights, generation.fuse_lora_max_mb 256, the default) or unfused (0); the CPU
kernels on (this build's default) or off (MLX_RLAIF_CPU_KERNELS=0: mlx-lm's own code, the path
Metal and CUDA run). Prints one markdown row per setting: the mean and largest sampler_kl over
the steps, the largest |log-prob gap| of any token, the mean share of tokens past ln 2 (weight
outside [1/2, 2]) and kl/sample_train (k2 of the same gap).

Not covered: other models and shapes (pass none: edit MODEL), timing (see tools/bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "builtin:tiny-coder"


def cli(args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], stdout=out,
                              stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"mlx-rlaif {args[0]} failed ({proc.returncode}): see {log}")


def model_for(dtype: str, work: Path) -> tuple[str, list[str]]:
    """(model.path, extra overrides) of a dtype setting."""
    if dtype.startswith("q4"):  # q4: of the float32 weights; q4-bfloat16: of the bfloat16 ones
        path = model_for(dtype.partition("-")[2] or "float32", work)[0]
        return path, ["model.quantize=4"]
    if dtype == "float32":
        return MODEL, []
    out = work / f"model-{dtype}"
    if not (out / "config.json").is_file():
        sys.path.insert(0, str(ROOT))
        from mlx_rlaif.assets import resolve_model

        cli(["convert", "--hf-path", resolve_model(MODEL), "--mlx-path", str(out), "--dtype",
             dtype], work / f"model-{dtype}.log")
    return str(out), []


def run(dtype: str, fused: bool, kernels: bool, steps: int, work: Path) -> list[dict]:
    path, extra = model_for(dtype, work)
    name = f"{dtype}-{'fused' if fused else 'unfused'}-kernels{'on' if kernels else 'off'}"
    out = work / name
    subprocess.run(["rm", "-rf", str(out)], check=True)
    sets = [f"model.path={path}", *extra, f"training.max_steps={steps}", "data.eval_file=",
            "logging.tensorboard=false", "training.save_every_batches=0",
            "training.save_every_epochs=0", f"generation.fuse_lora_max_mb={256 if fused else 0}"]
    args = ["train", "--config", "configs/quickstart.yaml", "--output-dir", str(out),
            "--no-dashboard"]
    for s in sets:
        args += ["--set", s]
    cli(args, work / f"{name}.log", {} if kernels else {"MLX_RLAIF_CPU_KERNELS": "0"})
    return [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]


def row(dtype: str, fused: bool, kernels: bool, rows: list[dict]) -> str:
    def col(key: str) -> list[float]:
        return [r[key] for r in rows if isinstance(r.get(key), (int, float))]

    kl, far, k2 = col("policy/sampler_kl"), col("policy/sampler_far_frac"), col("kl/sample_train")
    top = col("policy/sampler_logp_absdiff_max")
    return (f"| {dtype} | {'fused' if fused else 'unfused'} | {'on' if kernels else 'off'} | "
            f"{len(kl)} | {sum(kl) / len(kl):.2e} | {max(kl):.2e} | {max(top):.2e} | "
            f"{100 * sum(far) / len(far):.3f}% | {sum(k2) / len(k2):.2e} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dtypes", default="float32,bfloat16,q4,q4-bfloat16")
    p.add_argument("--kernels", default="on,off")
    p.add_argument("--out", default=str(ROOT / ".bench" / "agreement"))
    args = p.parse_args()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    print("| model | decoding | CPU kernels | steps | sampler_kl mean | sampler_kl max | "
          "max abs gap (nats) | tokens past ln 2 | kl/sample_train mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kernels in (k == "on" for k in args.kernels.split(",")):
        for dtype in args.dtypes.split(","):
            for fused in (True, False):
                print(row(dtype, fused, kernels, run(dtype, fused, kernels, args.steps, work)),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
