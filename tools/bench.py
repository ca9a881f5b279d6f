"""Benchmarks: mlx-rlaif side by side with mlx-lm's `batch_generate` and the MLX RL trainers'
GRPO (mlx-lm-lora, mlxrl, mlx-tune).

    python tools/bench.py            # full run: 3 rounds per peer, 64-token 0.5B steps (long)
    python tools/bench.py --quick    # about 12 minutes: fewer repetitions, 16-token 0.5B steps
    python tools/bench.py --quick --no-big --group 8    # other P x G x tokens: --prompts, --group,
                                                        # --max-tokens; results in --out (JSON)
    python tools/bench.py --quick --peers mlxrl --big-tokens 64    # one peer; 0.5B at 64 tokens
    python tools/bench.py --scale    # the scale benchmark: tools/bench_scale.py (hours)

What it measures (BENCHMARKS.md explains each figure and has the latest results):
- matmul GFLOP/s (fp32, n x n) with the system OpenBLAS preloaded (1 and 2 threads) and without;
- rollouts on the tiny model: our `backends.mlx.rollout.generate` vs mlx-lm's `batch_generate` at the same
  P x G, sampler and token budget, alternating in one process: tokens/s and decode width;
- our RL step (`train.step.rl_step`: generate / score (syntax reward) / train), training tokens/s of
  one forward+backward of our loss and its ratio to the measured matmul FLOP/s (6 x params
  FLOPs per token), MLX peak memory and process RSS;
- three MLX peers' GRPO steps on the same model, prompts, P, G, max tokens and sampler, each
  installed by this script into its own virtual environment with the same mlx / mlx-lm as ours
  and the same BLAS preload (`PEERS`): mlx-lm-lora 5.10.2 (`train_grpo`, .bench/peer-venv),
  mlxrl 0.2.4 (`inductive-mlxrl`: its batched prefix-cached rollout, `batch_from_rollouts`,
  `optimizer_step`, as its README and its own benchmark run them; .bench/peer-mlxrl) and mlx-tune
  0.6.0 (`GRPOTrainer.train`, one prompt per step, one completion at a time;
  .bench/peer-mlxtune): each alone in its own process (memory; mlx-lm-lora also with 2 OpenBLAS
  threads), then side by side, ours and the peer in one process per round (the peer's
  environment) alternating step by step; one line per peer ends in `speedup over PEER: N.NNx`
  (the peer's step time divided by ours), on the tiny model and on the 0.5B shape;
- our RL step without the fast BLAS, and with 1 vs 2 OpenBLAS threads;
- A/B in one process of choices in losses.py / batch.py / blas.py / cpu_kernels.py /
  backends.mlx: the loss formulation (one pow-based exp pass vs mx.logsumexp + mx.exp), padding
  to 32 vs 8, mx.compile, threads, the shared-prompt forward, the CPU attention and SwiGLU, a
  rollout with the LoRA adapters fused for decoding vs not, and in mlx-lm's `BatchGenerator`;
- on the Qwen2.5-0.5B shape: peak memory with the KL reference on and off, and each peer
  side by side with ours (one warm-up and `--big-reps` steps each; memory from each alone).

Models are random-weight Qwen2s built locally (`mlx_rlaif.testing.randmodel`, cached in
.bench/models).
Every completion is forced to the full token budget: the tokenizer's EOS is set to the id
`vocab_size`, which the model can never sample (both sides, same trick). Each measurement runs in
its own child process (this file with `--worker KIND`), so peak memory is per measurement and the
BLAS setting is fixed at process start.

Not covered here: GPUs and Apple silicon (MLX's Metal backend), long prompts; TRL, quantized
models, real shapes and long completions are `--scale`'s (tools/bench_scale.py). The CPU may be shared: results are medians, ours and theirs interleaved, and the JSON
records the load average around each worker.

One file on purpose (longer than our usual modules): the same script runs as the orchestrator,
as our workers, and inside the peer's virtual environment, where only this file and the
checkout are on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
# peer -> (what pip installs beside our mlx / mlx-lm pins, its virtual environment under .bench)
PEERS = {"mlx-lm-lora": ("mlx-lm-lora==5.10.2", "peer-venv"),
         "mlxrl": ("inductive-mlxrl==0.2.4", "peer-mlxrl"),
         "mlx-tune": ("mlx-tune==0.6.0", "peer-mlxtune")}
MARK = "BENCH-RESULT "
PROMPTS = [
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function is_even(n) that checks whether n is even.",
]

# --- orchestration (no MLX imported here) ---------------------------------------------------------


def fast_env(threads: int | None = None) -> dict[str, str]:
    """Our environment with the system OpenBLAS preloaded (as the CLI does)."""
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.cpu.blas import fast_blas_env

    env = fast_blas_env(_plain_env())
    if env is None:
        raise SystemExit("bench: no OpenBLAS found: apt-get install libopenblas0-pthread")
    if threads:
        env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["MLX_RLAIF_BLAS_REEXEC"] = "1"
    return env


def _plain_env() -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.cpu.blas import without_fast_blas

    return without_fast_blas()


def slow_env() -> dict[str, str]:
    """MLX's bundled reference BLAS."""
    return {**_plain_env(), "MLX_RLAIF_FAST_BLAS": "0"}


def run_worker(kind: str, spec: dict, env: dict[str, str], python: str = sys.executable,
               timeout: float = 1800) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--spec", json.dumps(spec)]
    load0 = os.getloadavg()[0]
    tic = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))
    lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench worker {kind} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}\n{proc.stdout[-1000:]}")
    out = json.loads(lines[-1][len(MARK):])
    out["_wall_s"] = time.perf_counter() - tic
    out["_loadavg_1m"] = [load0, os.getloadavg()[0]]
    print(f"  {kind:<8} {json.dumps(_brief(out))}", flush=True)
    return out


def _brief(out: dict) -> dict:
    keys = ("gflops", "ours_tps", "mlx_lm_tps", "step_s", "generate_s", "train_s",
            "train_tps", "mlx_peak_gb", "rss_peak_gb", "_wall_s")
    return {k: _round(_median(out[k]) if isinstance(out[k], list) else out[k])
            for k in keys if k in out}


def _round(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return round(x, 4) if isinstance(x, float) else x


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def ensure_peer_venv(venv: Path, package: str = PEERS["mlx-lm-lora"][0]) -> str:
    """A virtual environment with `package` (a pip requirement) and the same mlx / mlx-lm as
    ours (every peer's own pins allow them: mlx-lm-lora and mlx-tune ask for mlx / mlx-lm >=
    0.31, mlxrl for mlx >= 0.32.2 and mlx-lm >= 0.32.0, on macOS arm64 only)."""
    python, done_mark = venv / "bin" / "python", venv / "bench-installed"
    if not done_mark.is_file() or done_mark.read_text() != package:
        from importlib.metadata import version

        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # psutil: our step reads RSS, and the side-by-side worker runs our step there too
        pins = [package, f"mlx[cpu]=={version('mlx')}", f"mlx-lm=={version('mlx-lm')}",
                f"psutil=={version('psutil')}"]
        print(f"bench: installing {' '.join(pins)} into {venv}", flush=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *pins],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench: pip install into {venv} failed:\n{done.stderr[-2000:]}")
        done_mark.write_text(package)
    return str(python)


def ensure_models(models: Path, shapes: list[str]) -> dict[str, str]:
    paths = {s: models / s for s in shapes}
    missing = [s for s, p in paths.items() if not (p / "config.json").is_file()]
    if missing:
        print(f"bench: building random-weight models {missing} in {models}", flush=True)
        run_worker("build", {"paths": {s: str(paths[s]) for s in missing}}, fast_env())
    return {s: str(p) for s, p in paths.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker, json.loads(args.spec))
    if args.scale:  # real shapes, long completions, 4-bit, TRL: tools/bench_scale.py
        scale = Path(__file__).resolve().with_name("bench_scale.py")
        return subprocess.call([sys.executable, str(scale),
                                *(sys.argv[1:] if argv is None else argv)])
    plan = make_plan(args)
    command = "python tools/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {"settings": plan, "command": command.strip(), "machine": machine()}
    models = ensure_models(BENCH / "models", ["tiny"] + (["qwen0.5b"] if plan["big"] else []))
    common = {"P": plan["P"], "G": plan["G"], "max_tokens": plan["max_tokens"],
              "prompts": PROMPTS}
    print("bench: matmul", flush=True)
    results["matmul"] = bench_matmul(plan)
    print("bench: rollouts (ours vs mlx-lm batch_generate)", flush=True)
    results["rollout"] = run_worker("rollout", {**common, "model": models["tiny"],
                                                "reps": plan["rollout_reps"]}, fast_env())
    print(f"bench: RL step, ours vs {', '.join(plan['peers']) or 'no peer'} (interleaved)",
          flush=True)
    results["rl"] = bench_rl_vs_peer(plan, common, models["tiny"], args)
    print("bench: design choices, A/B in one process (loss formulation, padding, compile, threads)",
          flush=True)
    results["micro"] = run_worker("micro", {**common, "model": models["tiny"], "kl": 0.02,
                                            "reps": plan["micro_reps"]}, fast_env())
    if plan["blas_rounds"]:
        print("bench: our RL step: reference BLAS, OpenBLAS 1 and 2 threads", flush=True)
        results["blas"] = bench_blas_rl(plan, common, models["tiny"])
    if plan["big"]:
        print("bench: Qwen2.5-0.5B shape: memory with KL on and off; the peers side by side",
              flush=True)
        results["qwen0.5b"] = bench_big(plan, common, models["qwen0.5b"], args)
    results["summary"] = summarize(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out)
    print(json.dumps(results["summary"], indent=2))
    print(f"bench: wrote {out}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few minutes: 1 round, short 0.5B run")
    p.add_argument("--out", default=str(BENCH / "results.json"), help="JSON results file")
    p.add_argument("--rounds", type=int, default=None, help="side-by-side processes (default 3, quick 1)")
    p.add_argument("--reps", type=int, default=None, help="measured steps per process (default 3)")
    p.add_argument("--prompts", type=int, default=2, help="P")
    p.add_argument("--group", type=int, default=4, help="G")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per completion")
    p.add_argument("--no-peer", action="store_true", help="skip the peers")
    p.add_argument("--peers", default=",".join(PEERS), help="peers to run, comma-separated "
                   f"(default all: {', '.join(PEERS)})")
    p.add_argument("--no-big", action="store_true", help="skip the 0.5B-shaped model")
    p.add_argument("--big-tokens", type=int, default=None, help="0.5B shape: new tokens per "
                   "completion (default --max-tokens; quick 16)")
    p.add_argument("--big-reps", type=int, default=1, help="0.5B shape: measured steps of each "
                   "side per side-by-side process (after one warm-up step each)")
    p.add_argument("--peer-venv", default=str(BENCH / "peer-venv"), help="mlx-lm-lora's")
    p.add_argument("--scale", action="store_true", help="the scale benchmark instead "
                   "(tools/bench_scale.py: 0.5B shape, 256-1,024 tokens, 4-bit, TRL; hours)")
    p.add_argument("--only", default="", help="--scale: parts to run, comma-separated "
                   "(peer, trl, lengths, q4, model; default all)")
    p.add_argument("--time-cap", type=float, default=None, help="--scale: wall-clock cap of "
                   "each run in seconds (default 1800; the peer's 0.5B steps 1500)")
    p.add_argument("--fresh", action="store_true", help="--scale: run settings already in --out "
                   "again (default: keep them)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> dict:
    q = args.quick
    return {
        "P": args.prompts, "G": args.group, "max_tokens": args.max_tokens, "quick": q,
        "rounds": args.rounds or (1 if q else 3), "reps": args.reps or 3,
        "rollout_reps": 6 if q else 12, "matmul_n": [1024] if q else [512, 1024, 2048],
        "blas_rounds": 0 if q else 2, "micro_reps": 3 if q else 7, "big": not args.no_big, "big_reps": args.big_reps,
        "peers": [] if args.no_peer else peer_names(args.peers),
        "big_max_tokens": args.big_tokens or (16 if q else args.max_tokens),
        "openblas_threads": fast_env()["OPENBLAS_NUM_THREADS"],
    }


def peer_names(text: str) -> list[str]:
    """`--peers`' comma-separated names, checked against `PEERS`."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in PEERS]
    if unknown:
        raise SystemExit(f"bench: unknown peers {unknown}; known: {', '.join(PEERS)}")
    return names


def machine() -> dict:
    from importlib.metadata import version

    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.cpu.blas import find_fast_blas

    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "mlx": version("mlx"), "mlx_lm": version("mlx-lm"),
            "openblas": find_fast_blas(), "loadavg_at_start": os.getloadavg(),
            # both sides run with these (OPENBLAS_CORETYPE picks OpenBLAS's kernels)
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}}


def bench_matmul(plan: dict) -> dict:
    spec = {"sizes": plan["matmul_n"], "reps": 3}
    return {"openblas_1_thread": run_worker("matmul", spec, fast_env(1)),
            "openblas_2_threads": run_worker("matmul", spec, fast_env(2)),
            "reference_blas": run_worker("matmul", {**spec, "sizes": [1024]}, slow_env())}


def bench_rl_vs_peer(plan: dict, common: dict, model: str, args: argparse.Namespace) -> dict:
    """Memory and throughput of each alone (one process each), then step times side by side:
    `rounds` processes per peer that alternate our step and theirs."""
    spec = {**common, "model": model, "reps": plan["reps"], "kl": 0.02, "train_reps": 3}
    out: dict[str, Any] = {"ours": run_worker("rl", spec, fast_env()), "peers": {}}
    for name in plan["peers"]:
        out["peers"][name] = one_peer(name, {**spec, "peer": name}, plan["rounds"], args,
                                      two_threads=name == "mlx-lm-lora")
        print_speedup(name, out["peers"][name], "tiny")
    return out


def one_peer(name: str, spec: dict, rounds: int, args: argparse.Namespace,
             two_threads: bool = False, timeout: float = 1800) -> dict:
    """A peer alone (its memory), then `rounds` side-by-side processes; an error is kept, not
    raised, so that the other peers still run."""
    out: dict[str, Any] = {}
    try:
        python = ensure_peer_venv(peer_venv(name, args), PEERS[name][0])
        alone = {**spec, **spec.get("alone", {})}
        out["alone"] = run_worker("peer", alone, fast_env(), python=python, timeout=timeout)
        if two_threads:  # the peer with OpenBLAS at 2 threads throughout (ours: 2 to train)
            out["alone_2_threads"] = run_worker("peer", alone, fast_env(2), python=python,
                                                timeout=timeout)
        duels = [run_worker("duel", spec, fast_env(), python=python, timeout=timeout)
                 for _ in range(rounds)]
    except (RuntimeError, SystemExit, subprocess.SubprocessError) as e:
        print(f"bench: {name} could not run: {e}", flush=True)
        out["error"] = str(e)
        return out
    out["duel"] = {"ours": merge([d["ours"] for d in duels]),
                   "peer": merge([d["peer"] for d in duels]),
                   "ratio": [x for d in duels for x in d["ratio"]], "processes": len(duels)}
    return out


def peer_venv(name: str, args: argparse.Namespace) -> Path:
    return Path(args.peer_venv) if name == "mlx-lm-lora" else BENCH / PEERS[name][1]


def speedup_line(name: str, shape: str, ours_s: float, peer_s: float, ratio: float) -> str:
    """The line `--quick` prints per peer: medians of the side-by-side steps and of their
    per-pair ratios (the peer's step time divided by ours)."""
    return (f"bench: {shape} RL step side by side: ours {ours_s:.3f} s, {name} {peer_s:.3f} s; "
            f"speedup over {name}: {ratio:.2f}x")


def print_speedup(name: str, peer: dict, shape: str) -> None:
    if "duel" not in peer:
        print(f"bench: {shape}: {name} could not run (see the JSON's error); no speedup",
              flush=True)
        return
    d = peer["duel"]
    print(speedup_line(name, shape, _median(d["ours"]["step_s"]), _median(d["peer"]["step_s"]),
                       _median(d["ratio"])), flush=True)


def bench_blas_rl(plan: dict, common: dict, model: str) -> dict:
    """Our RL step with the reference BLAS and with OpenBLAS at 1 and 2 threads, interleaved."""
    spec = {**common, "model": model, "reps": 3, "kl": 0.02}
    envs = {"reference_blas": slow_env, "openblas_1_thread": lambda: fast_env(1),
            "openblas_2_threads": lambda: fast_env(2)}
    runs: dict[str, list] = {k: [] for k in envs}
    for _ in range(plan["blas_rounds"]):
        for k, env in envs.items():
            runs[k].append(run_worker("rl", spec, env()))
    return {k: merge(v) for k, v in runs.items()}


def bench_big(plan: dict, common: dict, model: str, args: argparse.Namespace) -> dict:
    """One RL step each with KL on and off, each in a fresh process (its own peak memory); then
    each peer: one step alone in a fresh process (its peak memory), and one side-by-side process
    (one warm-up step each, then `big_reps` alternating steps each)."""
    spec = {**common, "model": model, "reps": 1, "warmup": 0, "train_reps": 0,
            "max_tokens": plan["big_max_tokens"]}
    out: dict[str, Any] = {
        "kl_off": run_worker("rl", {**spec, "kl": 0.0}, fast_env(), timeout=3600),
        "kl_on": run_worker("rl", {**spec, "kl": 0.02}, fast_env(), timeout=3600), "peers": {}}
    for name in plan["peers"]:
        peer_spec = {**spec, "kl": 0.02, "peer": name, "reps": plan["big_reps"], "warmup": 1,
                     "alone": {"reps": 1, "warmup": 0}}
        out["peers"][name] = one_peer(name, peer_spec, 1, args, timeout=3600)
        print_speedup(name, out["peers"][name], "0.5B")
    return out


def merge(runs: list[dict]) -> dict:
    """Concatenate the per-step lists of several worker processes; keep the rest of the last."""
    out = dict(runs[-1])
    for k, v in runs[-1].items():
        if isinstance(v, list):
            out[k] = [x for r in runs for x in r[k]]
    for k in ("mlx_peak_gb", "rss_peak_gb"):
        if k in out:
            out[k] = max(r[k] for r in runs)
    out["processes"] = len(runs)
    return out


STEP_KEYS = ("step_s", "generate_s", "score_s", "train_s")


def summarize(r: dict) -> dict:
    m = statistics.median
    s: dict[str, Any] = {}
    mm = r["matmul"]
    s["matmul_gflops"] = {k: v["gflops"] for k, v in mm.items()}
    s["openblas_speedup_matmul_1024"] = (max(mm["openblas_1_thread"]["gflops"]["1024"],
                                             mm["openblas_2_threads"]["gflops"]["1024"])
                                         / mm["reference_blas"]["gflops"]["1024"])
    peak = max(g for v in mm.values() for g in v["gflops"].values())
    ro = r["rollout"]
    s["rollout_tps"] = {"ours": m(ro["ours_tps"]), "mlx_lm_batch_generate": m(ro["mlx_lm_tps"])}
    s["rollout_ratio_ours_over_mlx_lm"] = m(ro["ratio"])
    s["decode_width_ours"] = max(ro["decode_width"])
    ours = r["rl"]["ours"]
    s["step_s_ours_alone"] = {k: m(ours[k]) for k in STEP_KEYS}
    s["train_tps_ours"] = m(ours["train_tps"])
    # 6 x params per token as asked; with the base frozen (LoRA) the backward skips the weight
    # gradients, so the work actually done is nearer 4 x params: the second figure
    s["train_mfu_like"] = m(ours["train_positions_per_s"]) * ours["flops_per_token"] / (peak * 1e9)
    s["train_mfu_like_4n"] = s["train_mfu_like"] * 4 / 6
    s["matmul_peak_gflops"] = peak
    s["mlx_peak_gb_tiny"] = {"ours": ours["mlx_peak_gb"]}
    s["peers"] = {name: peer_summary(p) for name, p in r["rl"].get("peers", {}).items()}
    for name, p in s["peers"].items():
        if "alone" in p:
            s["mlx_peak_gb_tiny"][name] = p["alone"]["mlx_peak_gb"]
    if "speedup" in s["peers"].get("mlx-lm-lora", {}):  # the key earlier rounds reported
        s["step_speedup_ours_vs_peer"] = s["peers"]["mlx-lm-lora"]["speedup"]
    if "blas" in r:
        s["step_s_by_blas"] = {k: {x: m(v[x]) for x in STEP_KEYS} for k, v in r["blas"].items()}
    if "qwen0.5b" in r:
        on, off = r["qwen0.5b"]["kl_on"], r["qwen0.5b"]["kl_off"]
        s["qwen0.5b"] = {
            "mlx_peak_gb": {"kl_on": on["mlx_peak_gb"], "kl_off": off["mlx_peak_gb"]},
            "rss_peak_gb": {"kl_on": on["rss_peak_gb"], "kl_off": off["rss_peak_gb"]},
            "weights_gb": on["weights_gb"],
            "peak_ratio_kl_on_over_off": on["mlx_peak_gb"] / off["mlx_peak_gb"],
            "step_s": {"kl_on": {k: on[k][0] for k in STEP_KEYS},
                       "kl_off": {k: off[k][0] for k in STEP_KEYS}},
            "gen_tps": {"kl_on": on["gen_tps"][0], "kl_off": off["gen_tps"][0]},
            # KL off: the train phase is one forward+backward plus the optimizer step
            "train_mfu_like_kl_off": off["train_positions"] * 6 * off["params"]
            / off["train_s"][0] / (peak * 1e9),
            "peers": {name: peer_summary(p)
                      for name, p in r["qwen0.5b"].get("peers", {}).items()}}
    if "micro" in r:
        s["ab_ms"] = r["micro"]["ms"]
    s["targets"] = targets(s)
    return s


def peer_summary(p: dict) -> dict:
    """Medians of one peer's runs: side by side (both sides, the ratio), alone (phases and
    peak memory), and what the peer ran (its `note`)."""
    m = statistics.median
    if "duel" not in p:
        return {"error": p.get("error", "")[-500:]}
    duel, alone = p["duel"], p["alone"]
    out = {"speedup": m(duel["ratio"]), "pairs": [min(duel["ratio"]), max(duel["ratio"])],
           "side_by_side": {side: {k: m(duel[side][k]) for k in STEP_KEYS if duel[side].get(k)}
                            for side in ("ours", "peer")},
           "alone": {**{k: m(alone[k]) for k in STEP_KEYS if alone.get(k)},
                     "mlx_peak_gb": alone["mlx_peak_gb"], "rss_peak_gb": alone["rss_peak_gb"]},
           "decode_width": alone.get("decode_width"), "note": alone.get("note", "")}
    for k in ("old_ref_s", "update_s"):
        if duel["peer"].get(k):
            out["side_by_side"]["peer"][k] = m(duel["peer"][k])
    if "alone_2_threads" in p:
        out["alone_2_threads_step_s"] = m(p["alone_2_threads"]["step_s"])
    return out


def targets(s: dict) -> dict:
    t = {"rollout >= 0.9x mlx-lm batch_generate": s["rollout_ratio_ours_over_mlx_lm"] >= 0.9}
    if "step_speedup_ours_vs_peer" in s:
        t["RL step >= 3x faster than mlx-lm-lora"] = s["step_speedup_ours_vs_peer"] >= 3.0
    ours_gb = s["mlx_peak_gb_tiny"]["ours"]
    for shape, peers, mine in (("tiny", s.get("peers", {}), ours_gb),
                               ("0.5B", s.get("qwen0.5b", {}).get("peers", {}),
                                s.get("qwen0.5b", {}).get("mlx_peak_gb", {}).get("kl_on"))):
        for name, p in peers.items():
            if "speedup" in p:
                t[f"{shape}: RL step >= 1.5x faster than {name}"] = p["speedup"] >= 1.5
                t[f"{shape}: MLX peak <= {name}'s"] = mine <= p["alone"]["mlx_peak_gb"]
    if "qwen0.5b" in s:
        t["0.5B peak memory KL on <= 1.1x off"] = s["qwen0.5b"]["peak_ratio_kl_on_over_off"] <= 1.1
    return t


# --- workers (run in child processes) -------------------------------------------------------------


def worker(kind: str, spec: dict) -> int:
    fn = {"build": w_build, "matmul": w_matmul, "rollout": w_rollout, "rl": w_rl,
          "peer": w_peer, "duel": w_duel,
          "micro": w_micro}[kind]
    out = fn(spec)
    out["blas_preload"] = os.environ.get("LD_PRELOAD", "")
    out["openblas_threads"] = os.environ.get("OPENBLAS_NUM_THREADS", "")
    print(MARK + json.dumps(out), flush=True)
    return 0


def w_build(spec: dict) -> dict:
    from mlx_rlaif.testing.randmodel import make_model_dir

    for shape, path in spec["paths"].items():
        make_model_dir(path, shape, seed=0)
    return {"built": sorted(spec["paths"])}


def w_matmul(spec: dict) -> dict:
    import mlx.core as mx

    gflops = {}
    for n in spec["sizes"]:
        a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
        mx.eval(a, b, a @ b)
        times = []
        for _ in range(spec["reps"]):
            tic = time.perf_counter()
            mx.eval(a @ b)
            times.append(time.perf_counter() - tic)
        gflops[str(n)] = 2 * n**3 / _median(times) / 1e9
    return {"gflops": gflops}


def _force_length(tokenizer: Any, model: Any) -> int:
    """Make EOS an id the model cannot sample, so every completion runs to the budget."""
    vocab = model.args.vocab_size
    tokenizer.eos_token_ids = {vocab}
    return vocab


def _chat_prompts(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                               add_generation_prompt=True)) for p in prompts]


def _memory() -> dict:
    import resource

    import mlx.core as mx

    return {"mlx_peak_gb": mx.get_peak_memory() / 1e9,
            "rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def w_rollout(spec: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    from mlx_rlaif.backends.mlx.policy import load_policy
    from mlx_rlaif.backends.mlx.rollout import generate
    from mlx_rlaif.backends.sampling import SamplingParams

    policy = load_policy(spec["model"])
    model, tok = policy.model, policy.tokenizer
    eos = _force_length(tok, model)
    prompts, G, T = _chat_prompts(tok, spec["prompts"]), spec["G"], spec["max_tokens"]
    params = SamplingParams(temperature=1.0, max_new_tokens=T)
    flat = [p for p in prompts for _ in range(G)]

    def ours() -> tuple[float, float]:
        tic = time.perf_counter()
        seqs, stats = generate(model, prompts, G, params, [eos])
        return sum(len(s["tokens"]) for s in seqs) / (time.perf_counter() - tic), \
            stats["gen/decode_width"]

    def theirs() -> float:
        tic = time.perf_counter()
        r = batch_generate(model, tok, flat, max_tokens=T, sampler=make_sampler(1.0),
                           return_token_ids=True)
        return sum(len(t) for t in r.token_ids) / (time.perf_counter() - tic)

    mx.random.seed(0)
    ours(), theirs()  # warm-up
    out: dict[str, list] = {"ours_tps": [], "mlx_lm_tps": [], "decode_width": [], "ratio": []}
    for i in range(spec["reps"]):
        # alternate who goes first, so drifting background load favours neither
        if i % 2:
            b = theirs()
            a, w = ours()
        else:
            a, w = ours()
            b = theirs()
        out["ours_tps"].append(a)
        out["mlx_lm_tps"].append(b)
        out["decode_width"].append(w)
        out["ratio"].append(a / b)
    out["prompt_tokens"] = [len(p) for p in prompts]
    return out


def _rl_config(spec: dict, run_dir: str) -> Any:
    from mlx_rlaif.config import load

    return load(None, [
        f"model.path={spec['model']}", f"training.output_dir={run_dir}",
        f"training.batch_size={spec['P']}", f"generation.num_samples_per_prompt={spec['G']}",
        f"generation.max_new_tokens={spec['max_tokens']}", "generation.temperature=1.0",
        "reward.type=syntax", "rl.drop_zero_std=false", f"rl.kl_penalty={spec['kl']}",
        "logging.tensorboard=false", "training.learning_rate=1e-5"])


_OURS_KEYS = (("step_s", "time/step"), ("generate_s", "time/generate"),
              ("score_s", "time/score"), ("train_s", "time/train"),
              ("gen_tps", "gen/tokens_per_sec"), ("decode_width", "gen/decode_width"),
              ("completion_len", "gen/completion_len_mean"))


class Ours:
    """Our `train.step.rl_step` on a `Run` built as `train.train` builds it (syntax reward)."""

    def __init__(self, spec: dict) -> None:
        from mlx_rlaif.artifacts.checkpoint import LoopState
        from mlx_rlaif.backends.ops import mlx_ops
        from mlx_rlaif.backends.sampling import prompt_formatter
        from mlx_rlaif.records import Task
        from mlx_rlaif.rewards.base import SyntaxReward
        from mlx_rlaif.train.run import Run

        cfg = _rl_config(spec, tempfile.mkdtemp(prefix="bench-run-"))
        ops = mlx_ops()
        policy = ops.load(cfg)
        _force_length(policy.tokenizer, policy.model)
        self.run = Run(cfg, ops, policy, ops.optimizer(policy, cfg, 1000), SyntaxReward(),
                       Path(cfg.training.output_dir), LoopState(kl_penalty=spec["kl"]),
                       prompt_formatter(policy.tokenizer, cfg.model))
        self.tasks = [Task(f"t{i}", p) for i, p in enumerate(spec["prompts"])]
        self.t: dict[str, list] = {k: [] for k, _ in (*_OURS_KEYS, ("reference_pass", ""))}

    def train(self, iters: int) -> None:
        from mlx_rlaif.train.step import rl_step

        for _ in range(iters):
            m, _ = rl_step(self.run, lambda n, **_: self.tasks[:n])
            for k, key in _OURS_KEYS:
                self.t[k].append(m[key])
            self.t["reference_pass"].append("kl/mean" in m)  # the LoRA-off forward ran

    def results(self, skip: int) -> dict:
        from mlx_rlaif.backends.batch import round_up

        out: dict[str, Any] = {k: v[skip:] for k, v in self.t.items()}
        prompts = [len(self.run.format(t)) for t in self.tasks]
        G = self.run.cfg.generation.num_samples_per_prompt
        # positions the training forward runs: each prompt once, then its G completions
        width = round_up(int(max(self.t["completion_len"])), 8)
        positions = sum(p - 1 for p in prompts) + len(prompts) * G * width
        out.update(prompt_tokens=prompts, train_positions=positions,
                   params=sum(v.size for v in _leaves(self.run.policy.model.parameters())))
        return out


def w_rl(spec: dict) -> dict:
    """Ours alone in its process: step times, training throughput, peak memory."""
    ours = Ours(spec)
    warm = spec.get("warmup", 1)
    ours.train(warm + spec["reps"])
    out = {**ours.results(warm), **_memory()}
    if spec.get("train_reps", 0):
        out.update(_train_throughput(ours.run, ours.tasks, spec["train_reps"]))
    out["weights_gb"] = sum(v.nbytes for v in _leaves(ours.run.policy.model.parameters())) / 1e9
    out["kl"] = spec["kl"]
    return out


def _leaves(tree: Any) -> list:
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(tree)]


def _train_throughput(run: Any, tasks: list, reps: int) -> dict:
    """Forward + backward of our loss on one rollout batch, micro-batched as `update` runs it
    (each prompt computed once for its completions, the CPU kernels and the training threads)."""
    import mlx.core as mx
    import numpy as np

    from mlx_rlaif.algo.aggregation import aggregation_weights
    from mlx_rlaif.backends.mlx.update import build, grad_fn, micro_batches, reference_logprobs
    from mlx_rlaif.cpu.kernels import training_fast_paths

    cfg, model = run.cfg, run.policy.model
    rollouts, _ = run.sample(tasks, None)
    ref = reference_logprobs(model, rollouts, cfg) if run.state.kl_penalty > 0 else None
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    adv = np.linspace(-1, 1, len(rollouts))
    mbs = [build(rollouts, rows, adv, w, ref, shared)
           for rows, shared in micro_batches(model, rollouts, cfg)]
    # compiled, as update runs it
    grad, penalty = grad_fn(model, cfg), mx.array(run.state.kl_penalty)

    def fwd_bwd() -> None:
        with training_fast_paths(model):
            mx.eval([grad(mb, penalty) for mb in mbs])

    fwd_bwd()
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        fwd_bwd()
        times.append(time.perf_counter() - tic)
    params = sum(v.size for v in _leaves(model.parameters()))
    positions = sum(mb["tokens"].shape[0] * (mb["tokens"].shape[1] - 1)
                    + (mb["prefix"].size if "prefix" in mb else 0) for mb in mbs)
    tokens = sum(float(mb["mask"].sum().item()) for mb in mbs)
    return {"train_tps": [tokens / t for t in times],
            "train_positions_per_s": [positions / t for t in times],
            "train_fwd_bwd_s": times, "params": params, "flops_per_token": 6 * params,
            "train_positions": positions,
            "train_batch_shapes": [list(mb["tokens"].shape) for mb in mbs]}


def w_micro(spec: dict) -> dict:
    """In-process A/B of choices made in losses.py, batch.py and blas.py, cases alternating
    round-robin: the loss formulation (one pow-based exp pass vs mx.logsumexp + mx.exp, the
    formulation before), padding to 32 vs 8, mx.compile of forward+backward, the shared-prompt
    forward (each prompt once for its group) vs every row in full, 1 vs 2 OpenBLAS threads, exp
    vs pow over a logits-sized array, cpu_kernels.py's attention softmax and SwiGLU (alone, with
    the 2 training threads, and compiled with them: as `update` runs it), and a rollout with the
    LoRA adapters fused for decoding vs not, and in mlx-lm's `BatchGenerator` (decode.py's loop
    vs the one before)."""
    from dataclasses import replace
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    from mlx_rlaif.algo.aggregation import aggregation_weights
    from mlx_rlaif.backends import batch as batching
    from mlx_rlaif.backends.mlx import loss as losses
    from mlx_rlaif.backends.mlx.rollout import sample
    from mlx_rlaif.backends.mlx.update import grad_fn, reference_logprobs
    from mlx_rlaif.cpu.blas import openblas_thread_fns
    from mlx_rlaif.cpu.kernels import fast_cpu_kernels

    def as_mx(arrays: dict) -> dict:
        return {k: mx.array(v) for k, v in arrays.items()}

    ours = Ours(spec)
    run, cfg = ours.run, ours.run.cfg
    model = run.policy.model
    rollouts, _ = run.sample(ours.tasks, None)
    ref = reference_logprobs(model, rollouts, cfg)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    adv = np.linspace(-1, 1, len(rollouts))
    mbs = {p: as_mx(batching.build(rollouts, adv, w, ref, pad_to=p)) for p in (32, 8)}
    shared = as_mx(batching.build_shared(rollouts, adv, w, ref))
    vg = nn.value_and_grad(model, partial(losses.rl_loss, rl=cfg.rl, kl_penalty=0.02,
                                          temperature=1.0))
    state = [model.state]
    compiled = mx.compile(lambda mb: vg(model, mb), inputs=state, outputs=state)
    grad, kl = grad_fn(model, cfg), mx.array(0.02)  # compiled as `update` runs it
    x = mx.random.normal((8, 128, 4096)) * 4
    fns = openblas_thread_fns()
    set_threads = fns[1] if fns is not None else None  # OpenBLAS's, where it is loaded

    def old_formulation() -> Any:
        new, losses.logprobs_and_entropy = losses.logprobs_and_entropy, _mx_exp_logprobs
        try:
            return vg(model, mbs[32])
        finally:
            losses.logprobs_and_entropy = new

    def threads(n: int, mb: dict | None = None) -> Any:
        set_threads(n)
        return vg(model, mbs[8] if mb is None else mb)

    def kernels(n: int | None = None) -> Any:
        with fast_cpu_kernels(model):
            return vg(model, shared) if n is None else threads(n, shared)  # graph built here

    def as_update(n: int) -> Any:
        set_threads(n)
        with fast_cpu_kernels(model):
            return grad(shared, kl)

    def rollout(fuse_mb: int) -> Any:
        params = replace(run.sampling, fuse_lora_max_mb=fuse_mb)
        sample(model, run.policy.tokenizer, ours.tasks, params,
               cfg.generation.num_samples_per_prompt, run.format)
        return mx.array(0)

    def rollout_batch_generator() -> Any:
        _batch_generator_rollout(model, [run.format(t) for t in ours.tasks],
                                 cfg.generation.num_samples_per_prompt, run.sampling,
                                 sorted(run.policy.tokenizer.eos_token_ids))
        return mx.array(0)

    cases = {"fwd_bwd_pad32_mx_exp_formulation": old_formulation,
             "fwd_bwd_pad32": lambda: vg(model, mbs[32]), "fwd_bwd_pad8": lambda: vg(model, mbs[8]),
             "fwd_bwd_pad8_compiled": lambda: compiled(mbs[8]),
             "fwd_bwd_pad8_shared_prompt": lambda: vg(model, shared),
             "fwd_bwd_pad8_shared_prompt_cpu_kernels": kernels,
             "rollout_lora_unfused": lambda: rollout(0),
             "rollout_lora_fused": lambda: rollout(256),
             "rollout_mlx_lm_batch_generator": rollout_batch_generator,
             "exp_8x128x4096": lambda: mx.exp(x),
             "pow2_8x128x4096": lambda: mx.power(2.0, x * 1.4426950408889634)}
    default = int(os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    if set_threads is not None:
        cases.update({"fwd_bwd_pad8_openblas_1_thread": lambda: threads(1),
                      "fwd_bwd_pad8_openblas_2_threads": lambda: threads(2),
                      "fwd_bwd_pad8_shared_prompt_cpu_kernels_2_threads": lambda: kernels(2),
                      "fwd_bwd_pad8_shared_prompt_cpu_kernels_2_threads_compiled":
                          lambda: as_update(2)})
    times: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(spec["reps"] + 1):  # round 0 is the warm-up
        for k, f in cases.items():
            if set_threads is not None:
                set_threads(default)  # the thread cases set their own
            tic = time.perf_counter()
            mx.eval(f())
            if i:
                times[k].append(time.perf_counter() - tic)
    return {"ms": {k: 1e3 * _median(v) for k, v in times.items()}, "times_s": times,
            "shapes": {p: list(mb["tokens"].shape) for p, mb in mbs.items()}}


def _batch_generator_rollout(model: Any, prompts: list, G: int, params: Any, eos: list) -> int:
    """Our rollout as it was built on mlx-lm's `BatchGenerator` (the same prefilled caches, fused
    adapters and CPU kernels; its logsumexp and Gumbel sampler, one row slice per log-prob):
    the A/B for decode.py's own loop. Returns the number of tokens."""
    import numpy as np
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlx_rlaif.backends.mlx.policy import lora_fused
    from mlx_rlaif.backends.mlx.rollout import prefill
    from mlx_rlaif.cpu.kernels import decode_rope, fast_cpu_kernels

    n = 0
    with lora_fused(model, params.fuse_lora_max_mb * 2**20), fast_cpu_kernels(model), \
            decode_rope(model):
        gen = BatchGenerator(model, max_tokens=params.max_new_tokens,
                             stop_tokens=[[int(e)] for e in eos],
                             sampler=make_sampler(params.temperature))
        caches = [prefill(model, p) for p in prompts]
        gen.insert([[p[-1]] for p in prompts for _ in range(G)],
                   caches=[c for c in caches for _ in range(G)],
                   all_tokens=[list(p[:-1]) for p in prompts for _ in range(G)])
        try:
            while responses := gen.next_generated():
                n += len([float(np.asarray(r.logprobs)[r.token]) for r in responses])
        finally:
            gen.close()
    return n


def _mx_exp_logprobs(logits: Any, targets: Any, temperature: float) -> tuple:
    """rl_loss's formulation before this benchmark (backends.mlx.loss.token_logprobs):
    mx.logsumexp, then mx.exp again for the entropy."""
    import mlx.core as mx

    logits = logits.astype(mx.float32)
    if temperature != 1.0:
        logits = logits / temperature
    lse = mx.logsumexp(logits, axis=-1)
    logp = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    probs = mx.exp(logits - lse[..., None])
    return logp, lse - mx.sum(probs * logits, axis=-1)


class Peer:
    """mlx-lm-lora's GRPO as its CLI drives it (`train_grpo`, a second model loaded as the
    reference), on our prompts. Only timers are wrapped around its own module functions."""

    def __init__(self, spec: dict) -> None:
        import mlx.optimizers as optim
        from mlx_lm import load
        from mlx_lm_lora.trainer import grpo_trainer as gt
        from mlx_lm_lora.utils import from_pretrained

        self.spec, self.gt = spec, gt
        self.model, self.tok, _ = from_pretrained(model=spec["model"], lora_config={
            "rank": 8, "scale": 20.0, "dropout": 0.0, "num_layers": -1})
        self.ref_model = load(spec["model"])[0].freeze()  # as mlx_lm_lora.train does
        _force_length(self.tok, self.model)
        self.prompts = _chat_prompts(self.tok, spec["prompts"])
        self.data = [(p, self.tok.encode("x"), text, "x")
                     for p, text in zip(self.prompts, spec["prompts"], strict=True)]
        self.optimizer = optim.AdamW(learning_rate=1e-5)
        self.t: dict[str, list] = {"step_s": [], "generate_s": [], "score_s": [], "widths": []}
        _wrap_timer(gt, "generate_grpo", self.t["generate_s"])
        _wrap_timer(gt, "_rollout_rewards", self.t["score_s"])
        gt.BatchGenerator = _width_recorder(gt.BatchGenerator, self.t["widths"])
        self.tmp = tempfile.mkdtemp(prefix="bench-peer-")

    def train(self, iters: int) -> None:
        """`iters` GRPO steps; each step's time is what train_grpo itself reports (1 / it/s)."""
        from mlx_lm.tuner.callbacks import TrainingCallback

        steps = self.t["step_s"]

        class Timing(TrainingCallback):
            def on_train_loss_report(self, info: dict) -> None:
                steps.append(1.0 / info["iterations_per_second"])

        s, gt = self.spec, self.gt
        args = gt.GRPOTrainingArgs(
            batch_size=s["P"], group_size=s["G"], iters=iters,
            max_completion_length=s["max_tokens"], beta=s["kl"], temperature=1.0, top_p=1.0,
            top_k=0, min_p=0.0, epsilon=0.2, epsilon_high=0.28, grpo_loss_type="bnpo",
            steps_per_report=1, steps_per_eval=10**9, steps_per_save=10**9,
            adapter_file=str(Path(self.tmp) / "adapters.safetensors"))
        gt.train_grpo(self.model, self.ref_model, self.tok, self.optimizer, self.data,
                      val_dataset=None, reward_funcs=[python_syntax], args=args,
                      training_callback=Timing(), end_answer_token="")

    def results(self, skip: int) -> dict:
        from importlib.metadata import version

        step, gen, score = (self.t[k][skip:] for k in ("step_s", "generate_s", "score_s"))
        return {"step_s": step, "generate_s": gen, "score_s": score,
                "train_s": [a - b - c for a, b, c in zip(step, gen, score, strict=True)],
                "decode_width": max(self.t["widths"]), "mlx_lm_lora": version("mlx-lm-lora"),
                "mlx": version("mlx"), "mlx_lm": version("mlx-lm"),
                "prompt_tokens": [len(p) for p in self.prompts]}


def make_peer(spec: dict) -> Any:
    return {"mlx-lm-lora": Peer, "mlxrl": MlxRL, "mlx-tune": MlxTune}[
        spec.get("peer", "mlx-lm-lora")](spec)


def w_peer(spec: dict) -> dict:
    """The peer alone in its process: its step times and its peak memory."""
    import mlx.core as mx

    mx.random.seed(0)
    peer = make_peer(spec)
    warm = spec.get("warmup", 1)
    peer.train(warm + spec["reps"])
    return {**peer.results(warm), **_memory()}


def w_duel(spec: dict) -> dict:
    """Ours and the peer in one process (the peer's virtual environment, which holds the same
    mlx and mlx-lm versions as ours; our package is imported from this checkout), alternating
    step by step so that background load hits both alike. A peer whose own trainer runs the
    loop (mlx-tune) calls our step between its steps, outside its timers."""
    sys.path.insert(0, str(ROOT))
    import mlx.core as mx

    mx.random.seed(0)
    ours, peer = Ours(spec), make_peer(spec)
    warm = spec.get("warmup", 1)
    if getattr(peer, "owns_loop", False):
        peer.train(warm + spec["reps"], between=lambda: ours.train(1))
    else:
        for i in range(warm + spec["reps"]):
            for side in ((ours, peer) if i % 2 == 0 else (peer, ours)):
                side.train(1)
    a, b = ours.results(warm), peer.results(warm)
    return {"ours": a, "peer": b,
            "ratio": [x / y for x, y in zip(b["step_s"], a["step_s"], strict=True)]}


class MlxRL:
    """mlxrl 0.2.4's GRPO step as its README's import API and its own benchmark
    (`benchmarks/run_phase4.py`, `run_mlxrl_worker`) run it: `load_policy_with_lora`, Adam,
    `GRPOAlgorithm`, the prefix-cached rollout with every P x G row decoding together
    (`batch_groups=True`, `compile_decode_step=True`), then `batch_from_rollouts` (a full
    forward for the old policy's log-probs, and one with the adapters disabled for the
    reference) and `optimizer_step` (forward + backward + Adam). Its CLI's `train` decodes one
    completion at a time instead (`generate_group_rollouts`), which is slower. The only change:
    its EOS set is our unsampleable id (it also reads the tokenizer's `eos_token_id`)."""

    def __init__(self, spec: dict) -> None:
        import mlx.optimizers as optim
        from mlxrl.algo.grpo import GRPOAlgorithm
        from mlxrl.policy.logprobs import pad_token_id_from_tokenizer
        from mlxrl.policy.model import LoRAConfig, load_policy_with_lora
        from mlxrl.rollout import optimized
        from mlxrl.rollout.naive import SamplingConfig

        self.spec = spec
        self.model, self.tok, _ = load_policy_with_lora(
            model_id=spec["model"], config=LoRAConfig(rank=8, scale=20.0, dropout=0.0))
        eos = frozenset({_force_length(self.tok, self.model)})
        optimized.eos_token_ids_from_tokenizer = lambda _tok: eos
        self.pad = pad_token_id_from_tokenizer(self.tok)
        self.optimizer = optim.Adam(learning_rate=1e-5)
        self.algorithm = GRPOAlgorithm()
        self.sampling = SamplingConfig(max_tokens=spec["max_tokens"], temperature=1.0, top_p=1.0,
                                       min_p=0.0, top_k=0)
        self.t: dict[str, list] = {k: [] for k in (*STEP_KEYS, "old_ref_s", "update_s")}

    def train(self, iters: int) -> None:
        from mlxrl.rollout.optimized import generate_prefix_cached_group_rollouts
        from mlxrl.train.grpo import batch_from_rollouts, optimizer_step

        s = self.spec
        for _ in range(iters):
            t0 = time.perf_counter()
            done = generate_prefix_cached_group_rollouts(
                model=self.model, tokenizer=self.tok, prompts=s["prompts"], group_size=s["G"],
                config=self.sampling, compile_decode_step=True, batch_groups=True)
            t1 = time.perf_counter()
            rewards = python_syntax(s["prompts"], [c.text for c in done], [])
            t2 = time.perf_counter()
            batch = batch_from_rollouts(
                model=self.model, completions=done, rewards=rewards, group_size=s["G"],
                pad_token_id=self.pad, algorithm=self.algorithm, compute_reference=s["kl"] != 0)
            t3 = time.perf_counter()
            optimizer_step(model=self.model, optimizer=self.optimizer, batch=batch,
                           beta=s["kl"], pad_token_id=self.pad, algorithm=self.algorithm)
            t4 = time.perf_counter()  # optimizer_step returns floats: synchronized
            for k, v in (("step_s", t4 - t0), ("generate_s", t1 - t0), ("score_s", t2 - t1),
                         ("train_s", t4 - t2), ("old_ref_s", t3 - t2), ("update_s", t4 - t3)):
                self.t[k].append(v)
            self.lengths = [len(c.completion_tokens) for c in done]
            self.prompt_tokens = sorted({len(c.prompt_tokens) for c in done})

    def results(self, skip: int) -> dict:
        from importlib.metadata import version

        return {**{k: v[skip:] for k, v in self.t.items()}, "decode_width": len(self.lengths),
                "completion_len": self.lengths, "prompt_tokens": self.prompt_tokens,
                "mlxrl": version("inductive-mlxrl"), "mlx": version("mlx"),
                "mlx_lm": version("mlx-lm"),
                "note": "old-policy forward + reference forward (adapters off) + forward/"
                        "backward each step; Adam; GRPOAlgorithm (unclipped ratio)"}


class MlxTune:
    """mlx-tune 0.6.0's `GRPOTrainer` as its README runs it: `FastLanguageModel.from_pretrained`,
    `get_peft_model` (rank 8, alpha 160 = our scale 20; its default targets, all 7 projections),
    `GRPOConfig` with our G, token budget and temperature, `trainer.train()`. Its loop takes one
    prompt per step and samples the G completions one after another (mlx-lm's `stream_generate`
    on a fork of a prompt cache built once per prompt), then one compiled forward + backward of
    -advantage x sequence log-prob with AdamW: no reference model or KL (`beta` is not read), no
    ratio or clip. One of our steps (P prompts x G) is compared with P of its steps (the same
    P x G completions). It skips the update of a group whose rewards are all equal, and random
    weights never write parsing Python, so its reward is the syntax reward plus 1e-6 x the
    completion's index in the step (ours trains every group: `rl.drop_zero_std=false`). Timers
    wrap its module's `build_shared_prompt_cache` (a step starts), `generate_with_log_probs`
    and the reward; our step runs inside the step-start hook, outside its timers."""

    owns_loop = True

    def __init__(self, spec: dict) -> None:
        from mlx_tune import FastLanguageModel

        self.spec = spec
        model, self.tok = FastLanguageModel.from_pretrained(model_name=spec["model"],
                                                            max_seq_length=2048)
        self.model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=160,
                                                      lora_dropout=0.0)
        _force_length(self.tok, self.model.model)
        self.texts = [self.tok.apply_chat_template([{"role": "user", "content": p}],
                                                   add_generation_prompt=True, tokenize=False)
                      for p in spec["prompts"]]
        self.sub: dict[str, list] = {"step_s": [], "generate_s": [], "score_s": []}
        self.lengths: list[int] = []
        self.tmp = tempfile.mkdtemp(prefix="bench-mlxtune-")

    def train(self, iters: int, between: Any = None) -> None:
        """`iters` of our steps' worth: P x `iters` of its steps, in one `trainer.train()`;
        `between()` runs before every P of them (untimed)."""
        import mlx_tune.rl_trainers as rt
        from mlx_tune import GRPOConfig, GRPOTrainer

        s, sub, P = self.spec, self.sub, len(self.texts)
        clock = {"start": None, "n": 0, "gen": 0.0, "score": 0.0}

        def close_step() -> None:
            if clock["start"] is not None:
                sub["step_s"].append(time.perf_counter() - clock["start"])
                sub["generate_s"].append(clock["gen"])
                sub["score_s"].append(clock["score"])

        def step_start(*a: Any, **k: Any) -> Any:
            close_step()
            if between is not None and clock["n"] % P == 0:
                between()
            clock.update(start=time.perf_counter(), n=clock["n"] + 1, gen=0.0, score=0.0)
            tic = time.perf_counter()
            out = build(*a, **k)
            clock["gen"] += time.perf_counter() - tic
            return out

        def generate(*a: Any, **k: Any) -> Any:
            tic = time.perf_counter()
            out = gen(*a, **k)
            clock["gen"] += time.perf_counter() - tic
            self.lengths.append(int(out[1].shape[0]))  # its sampled log-probs: one a token
            return out

        def finished(*a: Any, **k: Any) -> Any:
            close_step()
            clock["start"] = None
            return save(*a, **k)

        def reward(text: str, answer: str) -> float:
            tic = time.perf_counter()
            r = python_syntax([], [text], [])[0] + 1e-6 * (clock["k"] % s["G"])
            clock["k"] = clock.get("k", 0) + 1
            clock["score"] += time.perf_counter() - tic
            return r

        clock["k"] = 0
        build, gen, save = (rt.build_shared_prompt_cache, rt.generate_with_log_probs,
                            rt._save_adapters_and_config)
        rt.build_shared_prompt_cache, rt.generate_with_log_probs = step_start, generate
        rt._save_adapters_and_config = finished
        try:
            args = GRPOConfig(loss_type="grpo", beta=s["kl"], num_generations=s["G"],
                              temperature=1.0, max_completion_length=s["max_tokens"],
                              output_dir=self.tmp, learning_rate=1e-5,
                              max_steps=P * iters, logging_steps=1, save_steps=10**9)
            data = [{"prompt": t, "answer": ""} for t in self.texts]
            GRPOTrainer(model=self.model, train_dataset=data, tokenizer=self.tok,
                        reward_fn=reward, args=args).train()
        finally:
            rt.build_shared_prompt_cache, rt.generate_with_log_probs = build, gen
            rt._save_adapters_and_config = save

    def results(self, skip: int) -> dict:
        from importlib.metadata import version

        P = len(self.texts)
        per = {k: [sum(v[i:i + P]) for i in range(0, len(v) - P + 1, P)]
               for k, v in self.sub.items()}  # P of its steps = one of ours
        out = {k: v[skip:] for k, v in per.items()}
        out["train_s"] = [a - b - c for a, b, c in zip(out["step_s"], out["generate_s"],
                                                       out["score_s"], strict=True)]
        return {**out, "decode_width": 1, "substep_s": self.sub["step_s"][skip * P:],
                "completion_len": sorted(set(self.lengths)),
                "prompt_tokens": [len(self.tok.encode(t)) for t in self.texts],
                "mlx_tune": version("mlx-tune"), "mlx": version("mlx"),
                "mlx_lm": version("mlx-lm"),
                "note": "one prompt per step, completions one at a time; no reference/KL, "
                        "no ratio/clip; AdamW with cosine decay"}


def python_syntax(prompts: list, completions: list[str], answer: list, types: Any = None
                  ) -> list[float]:
    """The peer's reward: 1.0 when the completion parses as Python (same work as ours)."""
    import ast

    def ok(text: str) -> float:
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):
            return 0.0
        return 1.0

    return [ok(c) for c in completions]


def _wrap_timer(module: Any, name: str, sink: list[float]) -> None:
    fn = getattr(module, name)

    def timed(*a: Any, **k: Any) -> Any:
        tic = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            sink.append(time.perf_counter() - tic)

    setattr(module, name, timed)


def _width_recorder(base: type, sink: list[int]) -> type:
    class Recording(base):  # type: ignore[misc,valid-type]
        def next_generated(self):  # noqa: ANN202
            out = super().next_generated()
            sink.append(len(out))
            return out

    return Recording


if __name__ == "__main__":
    sys.exit(main())
