"""Where a 4-bit (QLoRA) step fails on a GPU: the pieces of the update one at a time, each in its
own process, so a kernel that faults (and poisons its CUDA context) takes down only its own stage.

    python tools/q4_probe.py --json OUT.json            # the matrix below, at the 0.5B shape
    python tools/q4_probe.py --stage head --rows 110    # one stage, its result as one JSON line
    python tools/q4_probe.py --shape micro --json OUT   # the same at a small shape (the CPU test)

Stages (Qwen2.5-0.5B's shape: width 896, vocabulary 151,936, MLP 4,864; bfloat16, LoRA rank 8):
- `head`: the tied head alone, quantized: `QuantizedEmbedding.as_linear` on `rows` hidden states
  (110 = the loss's chunk of positions at this vocabulary), forward then the gradient with
  respect to the hidden states (a quantized matmul with the weight not transposed);
- `lora`: one quantized linear layer with mlx-lm's LoRA on it, forward and backward over
  2 x 8 x 256 rows;
- `chunks`: the loss's chunked log-probs and their gradient (`loss.head_logprobs`, in its own
  chunks of 110 positions) through the quantized head over [16, 256] positions;
- `probe`: the model quantized at load, the reference pass and one update on 2 x 8 synthetic
  completions of 256 tokens (tools/bench_scale.py's train-only probe);
- `step`: one whole RL step (decoding included) of the same.
The matrix varies the rows (110, 128), the group size (32, 64, 128) and the bits (4, 8) of the
head, the failing piece's neighbours in turn. Each stage runs with `CUDA_LAUNCH_BLOCKING=1` and
`MLX_USE_CUDA_GRAPHS=0` (so the fault is reported at the kernel that made it) unless
`--default-env`; `--sanitize STAGE` runs one stage under compute-sanitizer's memcheck as well.
The GPU check (tools/gpu_check.py) runs this as one of its stages.

Not covered: the fix (where the cause is in MLX, the upstream issue and a workaround are in
BENCHMARKS.md, "On an accelerator").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gpu_check import marked_result  # noqa: E402 (a sibling script: its children's results)

MARK = "Q4-RESULT "
SHAPES = {"0.5b": dict(width=896, vocab=151936, mlp=4864, model="qwen0.5b", P=2, G=8, T=256),
          "micro": dict(width=64, vocab=512, mlp=128, model="micro", P=1, G=2, T=16)}
MATRIX = (  # (stage, options): the crash's pieces, then the head's neighbours
    ("head", {"rows": 110}), ("head", {"rows": 128}), ("head", {"rows": 110, "group": 32}),
    ("head", {"rows": 110, "group": 128}), ("head", {"rows": 110, "bits": 8}),
    ("lora", {}), ("chunks", {}), ("probe", {}), ("step", {}),
)


def quantized(module: Any, bits: int, group: int) -> Any:
    import mlx.nn as nn

    return nn.quantize(module, group_size=group, bits=bits) or module


def stage_head(s: dict, rows: int, bits: int, group: int) -> dict:
    import mlx.core as mx
    import mlx.nn as nn

    emb = nn.Embedding(s["vocab"], s["width"])
    emb.set_dtype(mx.bfloat16)
    q = nn.QuantizedEmbedding.from_embedding(emb, group_size=group, bits=bits)
    h = mx.random.normal((rows, s["width"])).astype(mx.bfloat16)
    y = q.as_linear(h)
    mx.eval(y)
    _, (dh,) = mx.vjp(lambda x: q.as_linear(x), [h], [mx.ones_like(y)])
    mx.eval(dh)
    return {"logits": list(y.shape), "dh_finite": bool(mx.isfinite(dh).all().item())}


def stage_lora(s: dict, bits: int, group: int) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.lora import LoRALinear

    lin = nn.Linear(s["width"], s["mlp"])
    lin.set_dtype(mx.bfloat16)
    q = nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits)
    layer = LoRALinear.from_base(q, r=8, scale=20.0)
    layer.freeze()
    layer.unfreeze(keys=["lora_a", "lora_b"], strict=False)
    x = mx.random.normal((s["P"] * s["G"] * s["T"], s["width"])).astype(mx.bfloat16)
    loss, grads = nn.value_and_grad(layer, lambda m, x: m(x).astype(mx.float32).sum())(layer, x)
    mx.eval(loss, grads)
    return {"loss_finite": bool(mx.isfinite(loss).item())}


def stage_chunks(s: dict, bits: int, group: int) -> dict:
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_rlaif.backends.mlx.loss import Split, chunk_slices, head_logprobs

    emb = nn.Embedding(s["vocab"], s["width"])
    emb.set_dtype(mx.bfloat16)
    q = nn.QuantizedEmbedding.from_embedding(emb, group_size=group, bits=bits)
    split = Split(nn.Identity(), q.as_linear, s["vocab"])
    n, w = s["P"] * s["G"], s["T"]
    # the loss's own chunks (110 positions at the 0.5B shape), or four where it makes one
    limit_mb = None if len(chunk_slices(split, n * w)) > 1 \
        else 4 * s["vocab"] * (n * w // 4) / 2**20
    hidden = mx.random.normal((n, w, s["width"])).astype(mx.bfloat16)
    targets = mx.random.randint(0, s["vocab"], (n, w))

    def stats(h: mx.array) -> tuple[mx.array, mx.array]:
        return head_logprobs(split, h, targets, 1.0, limit_mb)

    (logp, ent), (dh,) = mx.vjp(stats, [hidden], [mx.ones((n, w)), mx.zeros((n, w))])
    mx.eval(logp, dh)
    return {"chunks": len(chunk_slices(split, n * w, limit_mb)),
            "logp_finite": bool(mx.isfinite(logp).all().item()),
            "dh_finite": bool(mx.isfinite(dh).all().item())}


def model_dir(s: dict) -> str:
    """A random bfloat16 model of the shape (Qwen2.5's tokenizer at 0.5B), built once."""
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = Path(tempfile.gettempdir()) / f"q4-probe-{s['model']}-bf16"
    if not (path / "config.json").is_file():
        make_model_dir(path, s["model"], dtype="bfloat16",
                       tokenizer="qwen" if s["vocab"] > 100000 else "toy")
    return str(path)


def stage_train(s: dict, bits: int, kind: str) -> dict:
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_scale

    spec = {"model": model_dir(s), "T": s["T"], "q": bits, "P": s["P"], "G": s["G"], "steps": 1}
    out = (bench_scale.w_probe if kind == "probe" else bench_scale.w_ours)(spec)
    return {k: v for k, v in out.items() if isinstance(v, (int, float, str))}


def run_stage(name: str, shape: str, rows: int, bits: int, group: int) -> dict:
    import mlx.core as mx

    s = SHAPES[shape]
    mx.random.seed(0)
    tic = time.perf_counter()
    if name == "head":
        out = stage_head(s, rows, bits, group)
    elif name == "lora":
        out = stage_lora(s, bits, group)
    elif name == "chunks":
        out = stage_chunks(s, bits, group)
    else:
        out = stage_train(s, bits, name)
    return {**out, "seconds": time.perf_counter() - tic,
            "mlx_peak_gb": mx.get_peak_memory() / 2**30}


def spawn(name: str, opts: dict, shape: str, blocking: bool, timeout: float,
          sanitize: bool = False) -> dict:
    """One stage in its own process: ok with its result, or how it ended and its last lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if blocking:
        env.update(CUDA_LAUNCH_BLOCKING="1", MLX_USE_CUDA_GRAPHS="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--shape", shape,
           *[f"--{k}={v}" for k, v in opts.items()]]
    if sanitize:
        cmd = [shutil.which("compute-sanitizer") or "compute-sanitizer", "--tool", "memcheck",
               "--print-limit", "5", *cmd]
    tic = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-1500:]
        return {"status": f"over {timeout:.0f} s", "stderr": tail.decode(errors="replace")
                if isinstance(tail, bytes) else tail}
    except FileNotFoundError as e:
        return {"status": f"not run: {e}"}
    out, _ = marked_result(done, MARK, tic)
    if out["status"] != "ok" or sanitize:
        out["stderr"] = "\n".join((done.stderr + done.stdout).splitlines()[-25:])[-3000:]
    return out


def matrix(shape: str, out_path: Path | None, blocking: bool, timeout: float,
           sanitize: str, budget_s: float) -> dict:
    """Every stage of MATRIX (each written to `out_path` as it ends), then `sanitize`'s."""
    results: dict[str, Any] = {"shape": shape, "blocking": blocking, "stages": {}}
    start = time.perf_counter()
    for name, opts in MATRIX:
        key = name + "".join(f"_{k}{v}" for k, v in opts.items())
        if SHAPES[shape]["width"] % opts.get("group", 64):
            continue  # a group wider than the small shape's rows
        if time.perf_counter() - start > budget_s:
            results["stages"][key] = {"status": "skipped (time budget)"}
            continue
        results["stages"][key] = spawn(name, opts, shape, blocking, timeout)
        print(f"q4_probe: {key}: {results['stages'][key]['status']}", flush=True)
        write(out_path, results)
    if sanitize and time.perf_counter() - start < budget_s:
        results["sanitized"] = {sanitize: spawn(sanitize, {}, shape, True, timeout, True)}
        write(out_path, results)
    return results


def write(path: Path | None, results: dict) -> None:
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=2))
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=("head", "lora", "chunks", "probe", "step"))
    ap.add_argument("--shape", choices=tuple(SHAPES), default="0.5b")
    ap.add_argument("--rows", type=int, default=110)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--json", type=Path, help="write the matrix's results here")
    ap.add_argument("--default-env", action="store_true",
                    help="stages without CUDA_LAUNCH_BLOCKING=1 and MLX_USE_CUDA_GRAPHS=0")
    ap.add_argument("--sanitize", default="", help="also run this stage under compute-sanitizer")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per stage")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for the whole matrix")
    a = ap.parse_args(argv)
    if a.stage:
        sys.path.insert(0, str(ROOT))
        print(MARK + json.dumps(run_stage(a.stage, a.shape, a.rows, a.bits, a.group)),
              flush=True)
        return 0
    res = matrix(a.shape, a.json, not a.default_env, a.timeout, a.sanitize, a.budget)
    return 0 if all(v["status"] == "ok" for v in res["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
