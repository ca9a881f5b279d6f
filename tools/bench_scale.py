"""The scale benchmark (`python tools/bench.py --scale`): real model shapes, long completions,
4-bit bases, peers side by side, each run in its own process under a memory cap.

    python tools/bench.py --scale                      # everything below (hours on 2 cores)
    python tools/bench.py --scale --only peer,lengths  # some parts (or setting keys, e.g.
                                                       # ours_0.5b_2x8x256); results merge into
                                                       # --out (.bench/scale.json)

Parts (`--only`), all P x G = 2 x 8, KL on (0.02), LoRA rank 8 on every linear layer, the
syntax reward, every completion forced to its full length (EOS set to an id the model cannot
sample; TRL: `min_new_tokens`), zero-variance groups kept (`rl.drop_zero_std=false`) so every
run trains all 16 sequences, which it prints:
- `peer`: the Qwen2.5-0.5B shape (float32, random weights, Qwen2.5's real tokenizer built
  offline), completions of 256 and 512 tokens: our RL step and mlx-lm-lora 5.10.2's GRPO (its
  own virtual environment, as tools/bench.py's side by side), each alone in its process, one
  after the other: step time, generate / train split, MLX peak memory and peak RSS;
- `trl`: our MLX step, our torch backend's and TRL's `GRPOTrainer` on torch CPU (TRL in its own
  virtual environment, torch from the system's site packages) at the tiny and 0.5B shapes;
- `lengths`: our peak memory at 128, 256, 512 and 1,024 tokens (0.5B), full steps, 1 x 4;
  `lengths_ck` the same with per-block checkpointing on (`training.grad_checkpoint: on`);
- `q4`: the 0.5B shape quantized to 4 bits at load: one full step at 32 tokens (memory) and
  train-only probes (synthetic rollouts through the reference pass and the update, as a step
  runs them, without decoding) at 1 x 2 x 256 and 1 x 1 x 1,024 tokens;
- `calibrate`: train-only probes at 2 x 8 x 256 (0.5B) with the micro-batch size and
  checkpointing forced (4 off, 16 on, 4 on): the measurements the memory model's constants
  come from (not part of the default run);
- `model`: the memory model (backends/mlx/memory.py) against every measured 0.5B peak, then the
  expected peak of the 1.5B, 3B and 7B shapes (Qwen2.5's), 4-bit, bfloat16 activations, at
  2 x 8 x 256, 512 and 1,024 with a 64-token prompt, planned for a 16 GB budget (and with
  checkpointing on): an estimate (no such run is possible here).

Each run is a child process (`--worker KIND`) in its own memory cgroup (`memory.limit_in_bytes`,
cgroup v1; else `prlimit --as`) and under a wall-clock cap: an out-of-memory kill or the cap is
recorded as that run's result. Results are written after every run (JSON, `--out`).

Not covered: Metal (MLX's GPU backend): the CPU build's times do not carry over; memory mostly
does (BENCHMARKS.md says which).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
MARK = "BENCH-RESULT "
TRL_SPEC = "trl==1.16.0"
P, G, KL, RANK, SCALE = 2, 8, 0.02, 8, 20.0
CAP_GB = 14.0  # memory cap of one run (the machine: 24 GB, shared)
TIME_CAP_S = 1800
LOAD_PEAK: dict[str, float] = {}  # MLX's peak while a worker loaded its model (_run)
PARTS = ("peer", "trl", "lengths", "lengths_ck", "q4", "calibrate", "model")
SHAPES_7B = {  # Qwen2.5's shapes (config.json of each)
    "1.5B": dict(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936,
                 tied=True),
    "3B": dict(layers=36, hidden=2048, intermediate=11008, heads=16, kv_heads=2, vocab=151936,
               tied=True),
    "7B": dict(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064,
               tied=False),
}

# --- orchestration ---------------------------------------------------------------------------------


def main(args: Any) -> int:
    sys.path.insert(0, str(ROOT / "tools"))
    import bench

    parts = args.only.split(",") if args.only else [p for p in PARTS if p != "calibrate"]
    out = Path(args.out if args.out != str(BENCH / "results.json") else BENCH / "scale.json")
    results = json.loads(out.read_text()) if out.is_file() else {}
    results.update(command="python tools/bench.py " + " ".join(sys.argv[1:]),
                   machine=bench.machine())
    models = ensure_models()
    if "model" in parts:
        parts = [p for p in parts if p != "model"] + ["model"]  # last: it reads the runs

    def record(key: str, value: dict) -> None:
        results.setdefault("runs", {})[key] = value
        save(out, results)

    chosen = [x for x in settings(list(PARTS), models, "peer", "trl")
              if x[0] in parts or part_of(x[0]) in parts]
    peer_py = bench.ensure_peer_venv(Path(args.peer_venv)) if any(
        x[3] == "peer" for x in chosen) else ""
    trl_py = ensure_trl_venv(BENCH / "trl-venv") if any(x[3] == "trl" for x in chosen) else ""
    for key, kind, spec, python in chosen:
        python = {"peer": peer_py, "trl": trl_py}.get(python, python)
        if key in results.get("runs", {}) and not args.fresh:
            print(f"bench: {key}: kept from {out}", flush=True)
            continue
        record(key, capped(kind, spec, python=python or sys.executable,
                           time_cap=args.time_cap or spec.get("time_cap", TIME_CAP_S)))
    if "model" in parts:
        results["model"] = model_check(results.get("runs", {}), models["0.5b"])
        save(out, results)
    print(json.dumps(results.get("model", {}), indent=2))
    print(f"bench: wrote {out}")
    return 0


def settings(parts: list[str], models: dict, peer_py: str, trl_py: str) -> list[tuple]:
    """(key, worker, spec, python) of every run of the chosen parts, cheapest first within the
    order peer 256, TRL tiny, lengths, 4-bit, TRL 0.5B, peer 512."""
    big, tiny, out = models["0.5b"], models["tiny"], []
    trl = {shape: [(f"ours_{shape}_2x8x128", "ours", {"model": path, "T": 128, "steps": n}, ""),
                   (f"torch_{shape}_2x8x128", "ours",
                    {"model": path, "T": 128, "steps": n, "backend": "torch"}, ""),
                   (f"trl_{shape}_2x8x128", "trl", {"model": path, "T": 128, "steps": n},
                    trl_py)]
           for shape, path, n in (("tiny", tiny, 2), ("0.5b", big, 1))}
    peer = {T: [(f"ours_0.5b_2x8x{T}", "ours", {"model": big, "T": T}, ""),
                (f"peer_0.5b_2x8x{T}", "peer", {"model": big, "T": T, "time_cap": 1500}, peer_py)]
            for T in (256, 512)}
    if "peer" in parts:
        out += peer[256]
    if "trl" in parts:
        out += trl["tiny"]
    if "lengths" in parts:  # P x G x T from 512 to 4,096 completion tokens: main's 1 x 4 sweep
        out += [(f"ours_0.5b_1x4x{T}", "ours", {"model": big, "T": T, "P": 1, "G": 4}, "")
                for T in (128, 256, 512, 1024)]
    if "lengths_ck" in parts:  # the same with per-block checkpointing on: bounded activations
        out += [(f"ours_0.5b_1x4x{T}_ck", "ours", {"model": big, "T": T, "P": 1, "G": 4,
                                                   "set": ["training.grad_checkpoint=on"]}, "")
                for T in (128, 256, 512, 1024)]
    if "q4" in parts:
        out.append(("ours_0.5b_q4_1x4x32", "ours", {"model": big, "T": 32, "q": 4, "P": 1,
                                                   "G": 4}, ""))
        # a 4-bit update runs at about 2 tokens/s on this CPU: the probes' rows kept few
        out += [(f"probe_0.5b_q4_1x{g}x{T}", "probe",
                 {"model": big, "T": T, "q": 4, "P": 1, "G": g}, "")
                for g, T in ((2, 256), (1, 1024))]
    if "calibrate" in parts:  # the memory model's constants: train-only, settings forced
        out += [(f"calibrate_0.5b_2x8x256_m{m}_{ck}", "probe",
                 {"model": big, "T": 256, "set": [f"training.micro_batch_size={m}",
                                                  f"training.grad_checkpoint={ck}"]}, "")
                for m, ck in ((4, "off"), (16, "on"), (4, "on"))]
    if "trl" in parts:
        out += trl["0.5b"]
    if "peer" in parts:
        out += peer[512]
    return out


def part_of(key: str) -> str:
    """The part a setting's key belongs to."""
    if key.startswith(("peer_", "ours_0.5b_2x8x2", "ours_0.5b_2x8x5")):
        return "peer"
    if "_2x8x128" in key:
        return "trl"
    if key.startswith("calibrate"):
        return "calibrate"
    if key.endswith("_ck"):
        return "lengths_ck"
    return "q4" if "q4" in key else "lengths"


def save(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out)


def ensure_models() -> dict[str, str]:
    """The tiny shape and the 0.5B shape with Qwen2.5's real tokenizer, built once."""
    paths = {"tiny": BENCH / "models" / "tiny", "0.5b": BENCH / "models" / "qwen0.5b-qt"}
    for shape, path in paths.items():
        if not (path / "config.json").is_file():
            sys.path.insert(0, str(ROOT))
            from mlx_rlaif.testing.randmodel import make_model_dir

            print(f"bench: building {path}", flush=True)
            make_model_dir(path, "tiny" if shape == "tiny" else "qwen0.5b", seed=0,
                           tokenizer="toy" if shape == "tiny" else "qwen")
    return {k: str(v) for k, v in paths.items()}


def ensure_trl_venv(venv: Path) -> str:
    """TRL in its own virtual environment, with the system's site packages (torch 2.13's CPU
    build, transformers, peft: no CUDA build downloaded)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)
        print(f"bench: installing {TRL_SPEC} into {venv}", flush=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", TRL_SPEC],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench: pip install {TRL_SPEC} failed:\n{done.stderr[-2000:]}")
    return str(python)


def cgroup(cap_gb: float) -> Path | None:
    """A fresh memory cgroup (v1) limited to `cap_gb`, or None where none can be made."""
    base = Path("/sys/fs/cgroup/memory")
    group = base / f"mlx-rlaif-bench-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(int(cap_gb * 2**30)))
    except OSError:
        return None
    return group


def capped(kind: str, spec: dict, python: str = sys.executable, cap_gb: float = CAP_GB,
           time_cap: float = TIME_CAP_S) -> dict:
    """One worker under the memory and time caps: its result, or what stopped it."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench

    env = bench.fast_env()
    env["PYTHONPATH"] = str(ROOT)
    group = cgroup(cap_gb)
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--spec", json.dumps(spec)]
    if group is None:
        cmd = ["prlimit", f"--as={int(cap_gb * 2**30)}", *cmd]

    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    tic, load0 = time.perf_counter(), os.getloadavg()[0]
    print(f"bench: {kind} {json.dumps(spec)}", flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=enter,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=time_cap)
        status = "ok" if proc.returncode == 0 else (
            "out of memory (killed)" if proc.returncode in (-9, 137) else
            f"failed (exit {proc.returncode})")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        status = f"over the time cap ({time_cap:.0f} s)"
    out: dict[str, Any] = {"status": status, "spec": spec, "cap_gb": cap_gb,
                           "wall_s": time.perf_counter() - tic,
                           "loadavg_1m": [load0, os.getloadavg()[0]]}
    if group is not None:
        out["cgroup_peak_gb"] = int((group / "memory.max_usage_in_bytes").read_text()) / 1e9
        out["cgroup_oom"] = "oom_kill" in (group / "memory.oom_control").read_text() and \
            int((group / "memory.failcnt").read_text()) > 0
        group.rmdir()
    lines = [x for x in stdout.splitlines() if x.startswith(MARK)]
    if lines:
        out.update(json.loads(lines[-1][len(MARK):]))
    elif status == "ok" or status.startswith("failed"):
        out["stderr"] = stderr[-2000:]
    print(f"  -> {status}: {json.dumps(brief(out))}", flush=True)
    return out


def brief(out: dict) -> dict:
    keys = ("step_s", "generate_s", "train_s", "mlx_peak_gb", "rss_peak_gb", "trained",
            "micro_batch", "checkpoint", "predicted_peak_gb", "wall_s")
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items() if k in keys}


# --- the memory model against the measurements, and the larger shapes --------------------------


def model_check(runs: dict, model_05b: str) -> dict:
    """Measured 0.5B MLX peaks against the plan's prediction (within 15%?), then the expected
    peak of larger shapes at 4 bits with bfloat16 activations."""
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.backends.mlx import memory

    checked = {}
    for key, r in runs.items():
        if "0.5b" in key and r.get("predicted_peak_gb") and r.get("mlx_peak_gb"):
            ratio = r["predicted_peak_gb"] / r["mlx_peak_gb"]
            checked[key] = {"measured_gb": r["mlx_peak_gb"], "predicted_gb": r["predicted_peak_gb"],
                            "ratio": ratio, "within_15%": abs(ratio - 1) <= 0.15}
    table = {}
    for name, a in SHAPES_7B.items():
        s = shape_4bit(a)
        for T in (256, 512, 1024):
            w = memory.Work(P, G, 64, T, P * G)
            p = memory.plan(s, w, 16 * memory.GiB)  # the target: a 16 GB Mac
            ck = memory.plan(s, w, 16 * memory.GiB, checkpoint="on")
            table[f"{name}_{T}"] = {"peak_gb": p.peak / memory.GiB,
                                    "weights_gb": s.weight_bytes / memory.GiB,
                                    "micro_batch": p.micro_batch, "checkpoint": p.checkpoint,
                                    "decode_gb": p.decode / memory.GiB,
                                    "update_gb": p.update / memory.GiB,
                                    "peak_checkpointed_gb": ck.peak / memory.GiB}
    return {"check_0.5b": checked, "estimate_4bit_bf16": table}


def shape_4bit(a: dict) -> Any:
    """A Qwen2.5 shape quantized to 4 bits (group 64, bfloat16 scales and biases: 0.5 + 4/64
    bytes a weight) with LoRA rank 8 on every linear layer; norms and biases in bfloat16."""
    from mlx_rlaif.backends.mlx import memory

    D, F, L, V = a["hidden"], a["intermediate"], a["layers"], a["vocab"]
    kv = a["kv_heads"] * D // a["heads"]
    linears = [(D, D), (D, kv), (D, kv), (D, D), (D, F), (D, F), (F, D)]
    per_layer = sum(i * o for i, o in linears)
    quantized = L * per_layer + V * D * (1 if a["tied"] else 2)
    small = L * (2 * D + D + 2 * kv) + D  # norms, q/k/v biases, the final norm
    weights = int(quantized * (0.5 + 4 / 64) + 2 * small)
    lora = L * RANK * sum(i + o for i, o in linears)
    return memory.Shape(L, D, F, a["heads"], a["kv_heads"], D // a["heads"], V, weights, 2, lora)


# --- workers ----------------------------------------------------------------------------------------


def worker(kind: str, spec: dict) -> int:
    fn = {"ours": w_ours, "peer": w_peer, "trl": w_trl, "probe": w_probe}[kind]
    out = fn(spec)
    print(MARK + json.dumps(out), flush=True)
    return 0


def _memory() -> dict:
    import resource

    out = {"rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        out["mlx_peak_gb"] = mx.get_peak_memory() / 2**30
        if "gb" in LOAD_PEAK:
            out["mlx_load_peak_gb"] = LOAD_PEAK["gb"]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def _config(spec: dict, run_dir: str) -> Any:
    from mlx_rlaif.config import load

    return load(None, [
        f"model.path={spec['model']}", f"training.output_dir={run_dir}",
        f"training.batch_size={pg(spec)[0]}", f"generation.num_samples_per_prompt={pg(spec)[1]}",
        f"generation.max_new_tokens={spec['T']}", "generation.temperature=1.0",
        "reward.type=syntax", "rl.drop_zero_std=false", f"rl.kl_penalty={KL}",
        f"lora.rank={RANK}", f"lora.scale={SCALE}", "logging.tensorboard=false",
        "training.learning_rate=1e-5", f"model.quantize={spec.get('q', 0)}",
        f"model.backend={spec.get('backend', 'mlx')}", *spec.get("set", [])])


def _run(spec: dict) -> tuple[Any, list]:
    """A `Run` built as `train.train` builds it, the memory plan resolved; and its tasks."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench import _force_length

    from mlx_rlaif.artifacts.checkpoint import LoopState
    from mlx_rlaif.backends.ops import OPS
    from mlx_rlaif.backends.sampling import prompt_formatter
    from mlx_rlaif.rewards.base import SyntaxReward
    from mlx_rlaif.train.memory_plan import resolve
    from mlx_rlaif.train.run import Run

    cfg = _config(spec, tempfile.mkdtemp(prefix="bench-scale-"))
    ops = OPS[cfg.model.backend]()
    policy = ops.load(cfg)
    tasks = _tasks(spec)
    fmt = prompt_formatter(policy.tokenizer, cfg.model)
    if cfg.model.backend == "mlx":
        _force_length(policy.tokenizer, policy.model)
    else:
        policy.tokenizer.eos_token_ids = {policy.model.config.vocab_size}  # never sampled
    cfg, line = resolve(cfg, getattr(policy, "model", None), tasks, fmt)
    print(line, flush=True)
    run = Run(cfg, ops, policy, ops.optimizer(policy, cfg, 100), SyntaxReward(),
              Path(cfg.training.output_dir), LoopState(kl_penalty=KL), fmt)
    if "mlx.core" in sys.modules:  # the step's peak, not the load's (quantizing at load
        import mlx.core as mx  # holds the float weights for a while): both recorded

        LOAD_PEAK["gb"] = mx.get_peak_memory() / 2**30
        mx.reset_peak_memory()
    return run, tasks


def _plan_fields(run: Any, spec: dict) -> dict:
    """The plan's choices and predicted peak (MLX)."""
    if run.cfg.model.backend != "mlx":
        return {}
    from mlx_rlaif.backends.mlx import memory
    from mlx_rlaif.train import memory_plan

    prompt = max(len(run.format(t)) for t in _tasks(spec))
    plan, _ = memory_plan.make_plan(run.cfg, run.policy.model, prompt,
                                    int(run.cfg.training.max_memory_gb * memory.GiB))
    t = run.cfg.training
    rows = pg(spec)[0] * pg(spec)[1]
    return {"micro_batch": t.micro_batch_size or rows, "checkpoint": t.grad_checkpoint,
            "decode_width": run.cfg.generation.completion_batch_size or rows,
            "predicted_peak_gb": plan.peak / memory.GiB, "prompt_tokens": prompt}


def pg(spec: dict) -> tuple[int, int]:
    """(P, G) of a setting: 2 x 8 unless it says otherwise."""
    return spec.get("P", P), spec.get("G", G)


def _tasks(spec: dict) -> list:
    """The benchmark's chat prompts (tools/bench.py), the first P of them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench import PROMPTS

    from mlx_rlaif.records import Task

    return [Task(f"t{i}", p) for i, p in enumerate(PROMPTS[:pg(spec)[0]])]


def w_ours(spec: dict) -> dict:
    """Our full RL steps (`train.step.rl_step`), as a run takes them."""
    from mlx_rlaif.train.step import rl_step

    run, tasks = _run(spec)
    steps = []
    for _ in range(spec.get("steps", 1)):
        m, _ = rl_step(run, lambda n, **_: tasks[:n])
        steps.append(m)
    last = steps[-1]
    return {"step_s": last["time/step"], "generate_s": last["time/generate"],
            "train_s": last["time/train"], "score_s": last["time/score"],
            "trained": last["train/sequences"], "completion_len": last["gen/completion_len_mean"],
            "gen_tps": last["gen/tokens_per_sec"], "all_step_s": [s["time/step"] for s in steps],
            "all_generate_s": [s["time/generate"] for s in steps],
            **_plan_fields(run, spec), **_memory()}


def w_probe(spec: dict) -> dict:
    """Train only: P x G synthetic rollouts of T tokens after the real prompts, through the
    reference pass and the update as a step runs them (no decoding)."""
    import numpy as np

    from mlx_rlaif.records import Rollout

    run, tasks = _run(spec)
    rng = np.random.default_rng(0)
    vocab = run.policy.model.args.vocab_size
    rollouts = [Rollout(t, tuple(run.format(t)), tuple(int(x) for x in rng.integers(
        3, 150000 if vocab > 150000 else vocab, spec["T"])), (-3.0,) * spec["T"], "", "length",
        1.0) for t in tasks for _ in range(pg(spec)[1])]
    adv = np.linspace(-1, 1, len(rollouts))
    tic = time.perf_counter()
    ref = run.ops.reference(run.policy, rollouts, run.cfg)
    mid = time.perf_counter()
    m, _ = run.ops.update(run.policy, run.optimizer, rollouts, adv, ref, run.cfg, KL)
    end = time.perf_counter()
    return {"reference_s": mid - tic, "update_s": end - mid, "train_s": end - tic,
            "trained": len(rollouts), "loss": m["loss/total"], **_plan_fields(run, spec),
            **_memory()}


def w_peer(spec: dict) -> dict:
    """mlx-lm-lora's GRPO (tools/bench.py's `Peer`), one step of our settings."""
    sys.path.insert(0, str(ROOT / "tools"))
    import mlx.core as mx
    from bench import PROMPTS, Peer

    mx.random.seed(0)
    n, g = pg(spec)
    peer = Peer({"model": spec["model"], "P": n, "G": g, "max_tokens": spec["T"], "kl": KL,
                 "prompts": PROMPTS[:n]})
    peer.train(spec.get("steps", 1))
    r = peer.results(0)
    return {"step_s": r["step_s"][-1], "generate_s": r["generate_s"][-1],
            "train_s": r["train_s"][-1], "trained": n * g, "decode_width": r["decode_width"],
            "all_step_s": r["step_s"], "all_generate_s": r["generate_s"],
            "all_train_s": r["train_s"],
            "mlx_lm_lora": r["mlx_lm_lora"], **_memory()}


def w_trl(spec: dict) -> dict:
    """TRL's GRPOTrainer on torch CPU (or the GPU where the spec's `device` is "cuda"): the same
    P, G, tokens (forced: min_new_tokens), LoRA rank and scale on every linear layer, KL 0.02
    (the reference: the adapters disabled), the syntax reward, token-mean loss (bnpo), float32,
    gradient checkpointing as TRL's default (on) unless the spec's `grad_checkpoint` says."""
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    sys.path.insert(0, str(ROOT / "tools"))
    from bench import PROMPTS, python_syntax

    steps, (n, g) = spec.get("steps", 1), pg(spec)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(spec["model"])
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]}
                              for _ in range(steps) for p in PROMPTS[:n]])
    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=n * g,
        num_generations=g, max_completion_length=spec["T"], beta=KL, learning_rate=1e-5,
        temperature=1.0, loss_type="bnpo", max_steps=steps, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=spec.get("device", "cpu") == "cpu", bf16=False, seed=0,
        gradient_checkpointing=spec.get("grad_checkpoint", True), shuffle_dataset=False,
        generation_kwargs={"min_new_tokens": spec["T"]}, dataloader_num_workers=0)
    times: dict[str, list] = {"step": [], "generate": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.tic = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times["step"].append(time.perf_counter() - self.tic)

    trainer = trl.GRPOTrainer(
        model=spec["model"], reward_funcs=lambda prompts, completions, **k: python_syntax(
            prompts, [c[0]["content"] for c in completions], None), args=args,
        train_dataset=data, processing_class=tok, callbacks=[Timer()],
        peft_config=LoraConfig(r=RANK, lora_alpha=RANK * SCALE, target_modules="all-linear"))
    generate = trainer._generate

    def timed(*a: Any, **k: Any) -> Any:
        tic = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            times["generate"].append(time.perf_counter() - tic)

    trainer._generate = timed
    trainer.train()
    step, gen = times["step"][-1], times["generate"][-1]
    return {"step_s": step, "generate_s": gen, "train_s": step - gen, "trained": n * g,
            "all_step_s": times["step"], "all_generate_s": times["generate"],
            "trl": trl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
            **_memory()}


if __name__ == "__main__":  # `tools/bench.py --scale ...` starts this file with its arguments
    import argparse

    if "--worker" not in sys.argv:
        sys.path.insert(0, str(ROOT / "tools"))
        import bench

        sys.exit(main(bench.parse_args(sys.argv[1:])))
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--spec", required=True)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.exit(worker(a.worker, json.loads(a.spec)))
