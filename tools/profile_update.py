"""Per-phase profile of the MLX update, and the memory plan checked against it.

    python tools/profile_update.py --shape tiny --tokens 128 --rows 2,8 --json .bench/profile.json
    python tools/profile_update.py --shape 0.5b --dtype bfloat16 --tokens 128,256,512,1024 \
        --rows 1,4 --memory --json OUT      # the plan's bfloat16 check (a GPU)

For each completion length: P x G synthetic rollouts (random tokens after P random prompts of
`--prompt-tokens`, every completion full length) on a random-weight model of the shape
(`mlx_rlaif.testing.randmodel`: `tiny`, or Qwen2.5-0.5B's shape with its 151,936-token
vocabulary), the memory plan resolved as a run resolves it (`train.memory_plan`), then `--steps`
times the reference pass and the update as a step runs them (`backends.ops`): their wall time
and MLX's peak memory each. Unless `--train-only`, one micro-batch is then taken apart: the
transformer's forward, the head's chunked log-probs (no gradient), the micro-batch's forward
and backward (the update's gradient function), the backward (that minus the two forward parts,
derived), the optimizer step; with the chunk count, whether the gradient function is compiled,
and the traces the update made (`compile/traces`, where the code reports it). Each phase's MLX
peak sits beside it; the plan's predicted peaks of the reference pass and the update
(`backends/mlx/memory.py`) beside the measured ones, and the ratio is printed per length
(`--memory`: that check alone, as `--train-only`; tools/gpu_check.py's memory stage).

Results merge into `--json` under `{shape}_{dtype}_{P}x{G}x{T}`, with the device and the code's
commit. Times: the first step is cold (traces, kernel compilation), the rest warm (median).

Not covered: decoding (tools/bench_scale.py, tools/bench.py), real prompts or tokenizers, models
other than the two shapes (`--model-dir` takes any mlx-lm directory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":  # OpenBLAS preloaded on Linux, as the CLI runs (cpu/blas.py)
    from mlx_rlaif.cpu.blas import maybe_reexec_with_fast_blas

    maybe_reexec_with_fast_blas([sys.executable, *sys.argv])

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = {"tiny": "tiny", "0.5b": "qwen0.5b"}
KL, RANK, SCALE = 0.02, 8, 20.0
GB = 2**30


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--tokens", default="128", help="completion lengths, comma-separated")
    ap.add_argument("--rows", default="2,8", help="P,G: prompts and completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3, help="reference + update, each timed")
    ap.add_argument("--train-only", action="store_true", help="no per-phase breakdown")
    ap.add_argument("--memory", action="store_true",
                    help="the memory check: predicted vs measured peak per length, no "
                         "per-phase breakdown (--train-only)")
    ap.add_argument("--reference-once", action="store_true",
                    help="one reference pass, then --steps updates (long CPU runs)")
    ap.add_argument("--budget-gb", type=float, default=0.0, help="0: the device's (memory.py)")
    ap.add_argument("--set", action="append", default=[], help="config overrides (key=value)")
    ap.add_argument("--model-dir", default="", help="a model directory (default: built once)")
    ap.add_argument("--json", default="", help="merge the results into this file")
    a = ap.parse_args(argv)
    a.train_only = a.train_only or a.memory
    return a


def model_dir(a: argparse.Namespace) -> str:
    """The random-weight model of the shape and dtype, built once under .bench/models."""
    if a.model_dir:
        return a.model_dir
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = ROOT / ".bench" / "models" / f"profile-{a.shape}-{a.dtype}"
    if not (path / "model.safetensors").is_file() and not any(path.glob("*.safetensors")):
        make_model_dir(path, SHAPES[a.shape], seed=0, dtype=a.dtype)
    return str(path)


def config(a: argparse.Namespace, path: str, tokens: int) -> Any:
    from mlx_rlaif.config import load

    p, g = rows_of(a)
    return load(None, [
        f"model.path={path}", f"training.output_dir={tempfile.mkdtemp(prefix='profile-')}",
        f"training.batch_size={p}", f"generation.num_samples_per_prompt={g}",
        f"generation.max_new_tokens={tokens}", "generation.temperature=1.0",
        "reward.type=syntax", "rl.drop_zero_std=false", f"rl.kl_penalty={KL}",
        f"lora.rank={RANK}", f"lora.scale={SCALE}", "logging.tensorboard=false",
        "training.learning_rate=1e-5", f"training.max_memory_gb={a.budget_gb}", *a.set])


def rows_of(a: argparse.Namespace) -> tuple[int, int]:
    p, g = (int(x) for x in a.rows.split(","))
    return p, g


def rollouts_of(a: argparse.Namespace, vocab: int, tokens: int) -> list[Any]:
    from mlx_rlaif.records import Rollout, Task

    rng = np.random.default_rng(0)
    p, g = rows_of(a)
    out = []
    for i in range(p):
        prompt = tuple(int(t) for t in rng.integers(3, vocab, a.prompt_tokens))
        for _ in range(g):
            toks = tuple(int(t) for t in rng.integers(3, vocab, tokens))
            out.append(Rollout(Task(f"t{i}", "p"), prompt, toks, (-3.0,) * tokens, "", "length",
                               1.0))
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(seconds, MLX peak in GB during the call, result): the peak reset before."""
    mx.synchronize()
    mx.reset_peak_memory()
    tic = time.perf_counter()
    out = fn()
    mx.synchronize()
    return time.perf_counter() - tic, mx.get_peak_memory() / GB, out


def plan_of(cfg: Any, model: Any, prompt: int) -> dict:
    """The plan the run takes (its config resolved) and its predicted peaks, in GB."""
    from mlx_rlaif.backends.mlx import memory
    from mlx_rlaif.train import memory_plan

    budget, _ = memory.device_budget(cfg.training.max_memory_gb)
    plan, shape = memory_plan.make_plan(cfg, model, prompt, budget)
    run_cfg = memory_plan.resolved(cfg, plan, budget)
    work = memory_plan.work_of(run_cfg, prompt)
    rows = run_cfg.training.micro_batch_size or work.rows
    ck = run_cfg.training.grad_checkpoint == "on"
    fixed = memory.fixed_bytes(shape)
    pred = {"budget_gb": budget / GB, "micro_batch": rows, "checkpoint": ck,
            "predicted_peak_gb": plan.peak / GB,
            "predicted_reference_gb": (fixed + memory.reference_bytes(shape, work, rows)) / GB,
            "predicted_update_gb": (fixed + memory.update_bytes(shape, work, rows, ck)) / GB,
            "weights_gb": shape.weight_bytes / GB}
    return {"cfg": run_cfg, **pred}


def steps(a: argparse.Namespace, ops: Any, policy: Any, optimizer: Any, cfg: Any,
          rollouts: list[Any]) -> dict:
    """`--steps` reference passes and updates, as a step runs them: times and peaks."""
    adv = np.linspace(-1, 1, len(rollouts))
    out: dict[str, list] = {"reference_s": [], "update_s": [], "reference_peak_gb": [],
                            "update_peak_gb": [], "traces": []}
    ref = None
    for i in range(a.steps):
        if i == 0 or not a.reference_once:
            s, peak, ref = timed(lambda: ops.reference(policy, rollouts, cfg))
            out["reference_s"].append(s)
            out["reference_peak_gb"].append(peak)
        s, peak, (m, _) = timed(lambda ref=ref: ops.update(policy, optimizer, rollouts, adv, ref,
                                                           cfg, KL))
        out["update_s"].append(s)
        out["update_peak_gb"].append(peak)
        out["traces"].append(m.get("compile/traces"))
    return out


def breakdown(policy: Any, optimizer: Any, cfg: Any, rollouts: list[Any]) -> dict:
    """One micro-batch taken apart: body forward, head (log-probs), forward + backward,
    optimizer step; times (median of 3 after a warm-up) and peaks."""
    from mlx_rlaif.backends.mlx import loss, shared_prompt, update
    from mlx_rlaif.backends.mlx.checkpointing import checkpointed_blocks
    from mlx_rlaif.cpu.kernels import training_fast_paths

    model, split = policy.model, policy.split
    rows, shared = update.micro_batches(model, rollouts, cfg)[0]
    mb = update.build(rollouts, rows, np.linspace(-1, 1, len(rollouts)),
                      [1.0 / len(rollouts)] * len(rollouts), [r.logprobs for r in rollouts],
                      shared)
    mx.eval(mb)
    T = cfg.generation.temperature
    grad = update.grad_fn(model, cfg, split)
    penalty = mx.array(KL, dtype=mx.float32)
    hidden = None

    def body() -> Any:
        nonlocal hidden
        hidden = shared_prompt.batch_logits(split.body, mb)
        mx.eval(hidden)

    def head() -> Any:
        mx.eval(head_logprobs(loss, split, hidden, mb, T))

    def fb() -> Any:
        mx.eval(grad(mb, penalty))

    def opt() -> Any:
        (_, aux), g = grad(mb, penalty)
        mx.eval(g, aux)
        return update.apply_update(model, optimizer, g, aux["loss"], 1.0)

    out = {}
    with training_fast_paths(model), checkpointed_blocks(model,
                                                         cfg.training.grad_checkpoint == "on"):
        for name, fn in (("forward", body), ("head", head), ("forward_backward", fb)):
            fn()  # warm-up: traces, kernels
            runs = [timed(fn) for _ in range(3)]
            out[f"{name}_s"] = statistics.median(r[0] for r in runs)
            out[f"{name}_peak_gb"] = max(r[1] for r in runs)
        opt()
        s, peak, _ = timed(lambda: update.apply_update(model, optimizer, zero_grads(model),
                                                       mx.array(0.0), 1.0))
        out["optimizer_s"], out["optimizer_peak_gb"] = s, peak
    out["backward_s"] = out["forward_backward_s"] - out["forward_s"] - out["head_s"]
    n, width = mb["tokens"].shape
    out.update(micro_batch_rows=n, positions=n * (width - 1),
               head_chunks=chunk_count(loss, split, n * (width - 1)),
               compiled=is_compiled(update, model, mb, cfg))
    return out


def head_logprobs(loss: Any, split: Any, hidden: Any, mb: dict, T: float) -> Any:
    targets = mb["tokens"][:, 1:]
    if hasattr(loss, "head_logprobs"):  # the one-pass code
        return loss.head_logprobs(split, hidden, targets, T)
    return loss.head_stats(split, hidden, targets, T)


def zero_grads(model: Any) -> Any:
    from mlx.utils import tree_map

    return tree_map(mx.zeros_like, model.trainable_parameters())


def chunk_count(loss: Any, split: Any, positions: int) -> int:
    return len(loss.chunk_slices(split, positions))


def is_compiled(update: Any, model: Any, mb: dict, cfg: Any) -> bool:
    """Whether the update's gradient function takes its compiled path for this micro-batch."""
    if hasattr(update, "compiles"):
        return bool(update.compiles(model, mb, update.budget_of(cfg)))
    n, width = mb["tokens"].shape
    vocab = model.args.vocab_size
    return n * (width - 1) * vocab * 4 <= update.COMPILE_MAX_LOGITS_MB * 2**20 and \
        n * (width - 1) <= 64 * 2**20 // (4 * vocab)


def profile_length(a: argparse.Namespace, path: str, tokens: int) -> dict:
    from mlx_rlaif.backends.mlx.policy import load_policy
    from mlx_rlaif.backends.ops import OPS

    cfg = config(a, path, tokens)
    ops = OPS["mlx"]()
    policy = load_policy(path, cfg.lora, seed=0)
    planned = plan_of(cfg, policy.model, a.prompt_tokens + 1)
    cfg = planned.pop("cfg")
    optimizer = ops.optimizer(policy, cfg, 100)
    rollouts = rollouts_of(a, policy.model.args.vocab_size, tokens)
    mx.reset_peak_memory()
    out: dict[str, Any] = {**planned, **steps(a, ops, policy, optimizer, cfg, rollouts)}
    for k in ("reference_s", "update_s"):
        warm = out[k][1:] or out[k]
        out[k.replace("_s", "_cold_s")] = out[k][0]
        out[k.replace("_s", "_warm_s")] = statistics.median(warm)
    out["train_peak_gb"] = max(out["reference_peak_gb"] + out["update_peak_gb"])
    out["predicted_over_measured"] = out["predicted_peak_gb"] / out["train_peak_gb"]
    if not a.train_only:
        out["breakdown"] = breakdown(policy, optimizer, cfg, rollouts)
    return out


def device() -> dict:
    from mlx_rlaif import cpu

    info = {k: v for k, v in mx.device_info().items() if isinstance(v, (str, int, float))}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"mlx": mx.__version__, "device": str(mx.default_device()), "info": info,
            "cpu_gate": cpu.active(), "commit": commit, "cores": os.cpu_count()}


def line(key: str, r: dict) -> str:
    b = r.get("breakdown", {})
    parts = [f"{key}: reference {r['reference_warm_s']:.3f} s (cold {r['reference_cold_s']:.3f}),"
             f" update {r['update_warm_s']:.3f} s (cold {r['update_cold_s']:.3f}),"
             f" micro-batch {r['micro_batch']}, checkpointing {'on' if r['checkpoint'] else 'off'},"
             f" traces {r['traces']}"]
    if b:
        parts.append(f"  one micro-batch of {b['micro_batch_rows']}: forward {b['forward_s']:.3f}"
                     f" s, head {b['head_s']:.3f} s ({b['head_chunks']} chunks), forward+backward"
                     f" {b['forward_backward_s']:.3f} s (backward {b['backward_s']:.3f} s),"
                     f" optimizer {b['optimizer_s']:.4f} s, compiled {b['compiled']}")
    parts.append(f"  memory: measured peak {r['train_peak_gb']:.2f} GB (reference "
                 f"{max(r['reference_peak_gb']):.2f}, update {max(r['update_peak_gb']):.2f}); "
                 f"predicted {r['predicted_peak_gb']:.2f} GB (reference "
                 f"{r['predicted_reference_gb']:.2f}, update {r['predicted_update_gb']:.2f}): "
                 f"predicted / measured {r['predicted_over_measured']:.2f}")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    a = parse(argv)
    path = model_dir(a)
    p, g = rows_of(a)
    results = {}
    for tokens in (int(t) for t in a.tokens.split(",")):
        key = f"{a.shape}_{a.dtype}_{p}x{g}x{tokens}"
        results[key] = {**profile_length(a, path, tokens), "device": device(),
                        "command": "python tools/profile_update.py " + " ".join(argv)}
        print(line(key, results[key]), flush=True)
        if a.json:
            out = Path(a.json)
            merged = json.loads(out.read_text()) if out.is_file() else {}
            merged.update(results)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(merged, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
