"""The GPU check: MLX's CUDA build installed from carried wheels (no network), then the project's
MLX path measured on the GPU in stages, each in its own process, each writing its part of one
JSON as it ends, so a run cut short (a crash, the time budget) still reports what it reached.

    python tools/gpu_check.py --wheels .whl --out $OUT/gpu_check.json --budget 600  # ~10 min
    python tools/gpu_check.py --out /tmp/check.json --only env,quickstart    # some stages
    python tools/gpu_check.py --quick --out /tmp/check.json                  # CPU smoke test

`--wheels DIR`: every `*.whl` in DIR is installed with `pip --no-deps --no-index --target`
(the CUDA libraries, torch and transformers are the GPU image's), and MLX's CUDA build, too big
for one transfer, may come as the unpacked wheel in a tar.xz split in parts (`*.tar.xz.part*`,
in DIR or in `--parts DIR`), unpacked into the same target. libmlx.so finds the CUDA libraries
through `../../nvidia/...` beside it, so the target gets a link to the image's `nvidia` folder.

Stages (`--only` picks some and runs them in the order given; each skipped when the budget
cannot hold its usual time). Every stage shares one MLX kernel cache (`MLX_PTX_CACHE_DIR`, under
the work folder): on a fresh machine the first process to run compiles MLX's CUDA kernels, which
took 143 s of the quickstart's first step and 273 s of the 0.5B step's on an H200 (BENCHMARKS.md,
"On an accelerator"), so a whole check on a fresh machine should take about 12 minutes (the
stages' measured times added up; not yet run whole) and a short lease should pick its stages:
- `env`: versions, the device as MLX reports it, the MLX builds installed, nvidia-smi;
- `model`: a random Qwen2.5-0.5B-shaped model in bfloat16 with Qwen2.5's real tokenizer;
- `quickstart_cold`, `quickstart_warm`: `mlx-rlaif train` (the embedded quickstart: 60 steps,
  both held-out evaluations) with an empty MLX kernel cache (`MLX_PTX_CACHE_DIR`), then again
  with the cache it left: wall time, pass@1 before and after, the step times (first, median of
  the last 20, the steps over 1 s: recompilations), `compile/traces` where recorded;
- `doctor`: `mlx-rlaif doctor` on the quickstart (device line, budget, probe, projection);
- `ours_bf16`: our RL step at 0.5B bfloat16, 2 x 8 x 256 (tools/bench_scale.py's worker):
  3 steps, the first apart; `ours_q4`: the same quantized to 4 bits at load; where it fails,
  `q4_probe` runs tools/q4_probe.py's matrix; `ours_bf16_fused`: `ours_bf16` decoding with the
  adapters fused (the default keeps this shape's 716 MB copy unfused);
- `decode_peer`: mlx-lm's own batched generation (`BatchGenerator`) at the step's width (16)
  on the same model: the decode speed the loop is held to;
- `peer_bf16`: mlx-lm-lora's GRPO at the same settings (3 steps, 2 where the budget is short);
- `tests`: the test files that run on MLX's default device (the GPU here);
- extras (`--extras`): tools/profile_decode.py (per phase; `decode_compare`: ours, eager and
  BatchGenerator interleaved at widths 16 and 32, 5 reps) and tools/profile_update.py at the
  0.5B shape in bfloat16, and the memory plan against measured peaks at 128 to 1,024 tokens.

`--kernel-cache FILE` carries MLX's compiled kernels from one lease to the next: a tar.xz of
the kernel cache, unpacked before the stages when FILE exists and written (replaced) after them,
with its size in the JSON (`kernel_cache`). MLX names a cached kernel by its module name alone,
not its source, so the archive files them under the MLX version and GPU architecture that
compiled them and only that key's kernels are restored; `quickstart_cold` still starts empty.

`--quick` runs the same stages at the tiny shape with short settings (how tests/test_gpu_check.py
checks the script on the CPU build).

Not covered: several GPUs, the torch backend (tools/bench_scale.py's `trl` part measures it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "GPU-CHECK-RESULT "
WORK = Path(tempfile.gettempdir()) / "mlx-rlaif-gpu-check"
SITE = Path(tempfile.gettempdir()) / "mlx-rlaif-site"
PTX = WORK / "ptx-cache"  # MLX's CUDA kernel cache (MLX_PTX_CACHE_DIR), one for every stage
# (stage, the seconds it usually takes on one GPU: a stage starts only when the budget holds it)
STAGES = (("env", 10), ("model", 30), ("quickstart_cold", 270), ("quickstart_warm", 60),
          ("doctor", 60), ("ours_bf16", 45), ("ours_q4", 45), ("q4_probe", 60),
          ("ours_bf16_fused", 45),
          ("decode_peer", 25), ("tests", 60), ("peer_bf16", 100))
EXTRAS = (("profile_decode", 60), ("decode_compare", 90), ("profile_update", 60),
          ("memory_bf16", 90))
# Every stage but these compiles MLX's kernels: the first of them to run on a fresh machine may
# take up to COLD_S more than its usual time (the 0.5B step's first step took 273 s on an H200),
# so its cap allows that.
NO_KERNELS = ("env", "model")
COLD_S = 300
TEST_FILES = ("tests/test_losses.py", "tests/test_chunked_loss.py", "tests/test_compiled.py",
              "tests/test_decode.py", "tests/test_shared_prompt.py", "tests/test_policy.py",
              "tests/test_gae.py")


# --- installing from carried wheels ---------------------------------------------------------------


def install(wheels: Path, parts: Path | None, target: Path = SITE) -> dict:
    """The wheels and the split CUDA build into `target`, the image's nvidia folder linked."""
    tic = time.perf_counter()
    target.mkdir(parents=True, exist_ok=True)
    whl = sorted(glob.glob(str(wheels / "*.whl")))
    if whl:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
                        *whl], check=True)
    pieces = sorted(glob.glob(str(wheels / "*.tar.xz*")) + (
        glob.glob(str(parts / "*.tar.xz*")) if parts else []), key=lambda f: Path(f).name)
    if pieces:
        cat = subprocess.Popen(["cat", *pieces], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(target), "-xJf", "-"], stdin=cat.stdout, check=True)
        cat.wait()
    nvidia = image_nvidia()
    if nvidia and not (target / "nvidia").exists():
        (target / "nvidia").symlink_to(nvidia)
    return {"wheels": [Path(w).name for w in whl], "parts": [Path(p).name for p in pieces],
            "nvidia": str(nvidia), "seconds": time.perf_counter() - tic}


def image_nvidia() -> Path | None:
    """The `nvidia` package folder of this interpreter's site packages (CUDA's pip libraries)."""
    try:
        import nvidia  # noqa: F401  (a namespace package of the CUDA wheels)
    except ImportError:
        return None
    paths = list(getattr(sys.modules["nvidia"], "__path__", []))
    return Path(paths[0]) if paths else None


# --- the stages (each runs in its own process: `--stage NAME`) -------------------------------------


def shape(quick: bool) -> dict:
    return ({"model": "tiny", "tokenizer": "toy", "T": 16, "P": 2, "G": 2, "steps": 2,
             "dtype": "bfloat16"} if quick else
            {"model": "qwen0.5b", "tokenizer": "qwen", "T": 256, "P": 2, "G": 8, "steps": 3,
             "dtype": "bfloat16"})


def model_path(quick: bool) -> Path:
    return WORK / "models" / ("tiny-bf16" if quick else "q05-bf16")


def st_env(quick: bool) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    from mlx_rlaif import install as inst
    from mlx_rlaif.backends.mlx import device

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip() \
        if smi else None
    d = device.current()
    return {"python": sys.version.split()[0], "mlx": mx.__version__,
            "versions": {n: v(n) for n in ("mlx", "mlx-lm", "mlx-lm-lora", "mlx-cuda-13",
                                           "mlx-cpu", "transformers", "torch", "numpy")},
            "device": device.describe(d), "device_info": {k: (v if isinstance(v, (int, str))
                                                              else str(v)) for k, v in
                                                          mx.device_info().items()},
            "builds": inst.installed_backends(), "build_problem":
                inst.backend_problem(inst.installed_backends()), "nvidia_smi": gpu}


def st_model(quick: bool) -> dict:
    from mlx_rlaif.testing.randmodel import make_model_dir

    s, path = shape(quick), model_path(quick)
    if not (path / "config.json").is_file():
        make_model_dir(path, s["model"], seed=0, dtype=s["dtype"], tokenizer=s["tokenizer"])
    return {"path": str(path)}


def cli(args: list[str], env: dict | None = None, timeout: float = 900) -> tuple[int, str, float]:
    tic = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          cwd=str(WORK))
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - tic


def st_quickstart(quick: bool, cache: str) -> dict:
    """The quickstart from the CLI; `cache`: cold (an empty kernel cache of its own, whose
    kernels then join the shared one) or warm (the shared one)."""
    out = WORK / f"quickstart-{cache}"
    shutil.rmtree(out, ignore_errors=True)
    ptx = WORK / "ptx-cold" if cache == "cold" else PTX
    if cache == "cold":
        shutil.rmtree(ptx, ignore_errors=True)
    args = ["train", "--output-dir", str(out)] + (["--max-steps", "3", "--set",
                                                  "data.eval_file="] if quick else [])
    rc, text, wall = cli(args, {"MLX_PTX_CACHE_DIR": str(ptx)})
    if cache == "cold" and ptx.is_dir():
        shutil.copytree(ptx, PTX, dirs_exist_ok=True)
    res: dict[str, Any] = {"rc": rc, "wall_s": wall, "tail": text[-1500:] if rc else text[-400:]}
    evals = out / "eval.json"
    if evals.is_file():
        e = json.loads(evals.read_text())
        res["pass@1"] = {k: e[k].get("pass@1") for k in ("before", "after") if k in e}
    res.update(step_summary(out / "batches.jsonl"))
    return res


def step_summary(path: Path) -> dict:
    """Step times of a run's batches.jsonl: first, median of the last 20, the slow ones."""
    if not path.is_file():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    times = [r["time/step"] for r in rows if "time/step" in r]
    if not times:
        return {}
    last = times[-20:]
    out = {"steps": len(times), "first_step_s": times[0], "median_last20_s": statistics.median(
        last), "steps_over_1s": sum(t > 1.0 for t in times[1:]), "step_s": times}
    traces = [r["compile/traces"] for r in rows if "compile/traces" in r]
    if traces:
        out["compile_traces_last"] = traces[-1]
    for k in ("reward/mean", "gen/tokens_per_sec", "time/generate", "time/train"):
        vals = [r[k] for r in rows if k in r]
        if vals:
            out[f"median_{k}"] = statistics.median(vals[-20:])
    return out


def st_doctor(quick: bool) -> dict:
    rc, text, wall = cli(["doctor", "--steps", "3"], timeout=300)
    return {"rc": rc, "wall_s": wall, "output": text[-3000:]}


def bench_worker(kind: str, spec: dict, timeout: float = 900) -> dict:
    """tools/bench_scale.py's worker `kind` in its own process: its result, or how it ended."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_scale.py"), "--worker",
                           kind, "--spec", json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))
    lines = [x for x in done.stdout.splitlines() if x.startswith("BENCH-RESULT ")]
    if done.returncode == 0 and lines:
        return {"status": "ok", **json.loads(lines[-1][len("BENCH-RESULT "):])}
    return {"status": f"failed (exit {done.returncode})",
            "stderr": "\n".join(done.stderr.splitlines()[-20:])[-2500:]}


def st_ours(quick: bool, bits: int = 0, fused: bool = False) -> dict:
    """Our RL step; `fused`: decoding with the adapters fused whatever the copy's size (at the
    0.5B shape the default `generation.fuse_lora_max_mb` decodes unfused)."""
    s = shape(quick)
    spec = {"model": str(model_path(quick)), "T": s["T"], "P": s["P"], "G": s["G"],
            "steps": s["steps"], "q": bits,
            "set": ["generation.fuse_lora_max_mb=65536"] if fused else []}
    return bench_worker("ours", spec)


def st_q4_probe(quick: bool, budget: float) -> dict:
    out = WORK / "q4_probe.json"
    cmd = [sys.executable, str(ROOT / "tools" / "q4_probe.py"), "--json", str(out),
           "--shape", "micro" if quick else "0.5b", "--budget", str(budget), "--timeout", "60"]
    if shutil.which("compute-sanitizer") and not quick:
        cmd += ["--sanitize", "head"]
    subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 120)
    return json.loads(out.read_text()) if out.is_file() else {"status": "no result"}


def st_decode_peer(quick: bool) -> dict:
    """mlx-lm's BatchGenerator decoding P x G rows of T tokens at once (EOS never sampled)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    s = shape(quick)
    model, tok = load(str(model_path(quick)))
    rows = s["P"] * s["G"]
    prompt = tok.encode("Write a Python function that reverses a string.")
    gen = BatchGenerator(model, max_tokens=s["T"], completion_batch_size=rows,
                         prefill_batch_size=rows)
    out = {}
    for rep in ("warm", "timed"):
        tic = time.perf_counter()
        gen.insert([list(prompt)] * rows, [s["T"]] * rows)
        n = 0
        while True:
            step = gen.next_generated()
            if not step:
                break
            n += len(step)
        mx.synchronize()
        out[rep] = {"tokens": n, "seconds": time.perf_counter() - tic}
    gen.close()
    t = out["timed"]
    return {"width": rows, "tokens_per_s": t["tokens"] / t["seconds"], **out}


def st_peer(quick: bool, steps: int) -> dict:
    s = shape(quick)
    spec = {"model": str(model_path(quick)), "T": s["T"], "P": s["P"], "G": s["G"],
            "steps": steps}
    return bench_worker("peer", spec)


def st_tests(quick: bool, budget: float) -> dict:
    files = [f for f in TEST_FILES if (ROOT / f).is_file()]
    tic = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                               "no:cacheprovider", *files], capture_output=True, text=True,
                              timeout=budget, cwd=str(ROOT))
        tail, rc = done.stdout[-1500:], done.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail, rc = out[-1500:], "timeout"
    return {"files": files, "rc": rc, "seconds": time.perf_counter() - tic, "tail": tail}


def st_tool(quick: bool, name: str, args: list[str], budget: float) -> dict:
    """tools/NAME.py with `args` and --json: its own results (the decode and update profiles)."""
    tool = ROOT / "tools" / f"{name}.py"
    if not tool.is_file():
        return {"status": f"tools/{name}.py not present"}
    out = WORK / f"{name}.json"
    out.unlink(missing_ok=True)
    try:
        done = subprocess.run([sys.executable, str(tool), *args, "--json", str(out)],
                              capture_output=True, text=True, timeout=budget, cwd=str(ROOT))
        status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        tail = (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        status, tail = f"over {budget:.0f} s", ""
    res = json.loads(out.read_text()) if out.is_file() else {}
    return {"status": status, "tail": tail, "result": res}


def extra_args(name: str, quick: bool) -> list[str]:
    s = shape(quick)
    size = "tiny" if quick else "0.5b"
    if name in ("profile_decode", "decode_compare"):
        reps = ["--compare", "--reps", "2" if quick else "5"] if name == "decode_compare" else []
        return ["--shape", "tiny" if quick else "qwen0.5b", "--dtype", "bfloat16",
                "--widths", "4,16" if quick else "16,32", "--tokens",
                str(s["T"] if quick else 128), *reps]
    if name == "profile_update":
        return ["--shape", size, "--dtype", "bfloat16", "--rows", f"{s['P']},{s['G']}",
                "--tokens", str(s["T"])]
    return ["--shape", size, "--dtype", "bfloat16", "--rows", "1,4", "--tokens",
            "16,32" if quick else "128,256,512,1024", "--memory"]


def run_stage(name: str, quick: bool, budget: float) -> dict:
    if name == "env":
        return st_env(quick)
    if name == "model":
        return st_model(quick)
    if name.startswith("quickstart_"):
        return st_quickstart(quick, name.split("_")[1])
    if name == "doctor":
        return st_doctor(quick)
    if name in ("ours_bf16", "ours_q4", "ours_bf16_fused"):
        return st_ours(quick, 4 if name == "ours_q4" else 0, name == "ours_bf16_fused")
    if name == "q4_probe":
        return st_q4_probe(quick, budget)
    if name == "decode_peer":
        return st_decode_peer(quick)
    if name == "peer_bf16":
        return st_peer(quick, 3 if budget >= 130 or quick else 2)
    if name == "tests":
        return st_tests(quick, budget)
    tool = {"memory_bf16": "profile_update", "decode_compare": "profile_decode"}.get(name, name)
    return st_tool(quick, tool, extra_args(name, quick), budget)


# --- orchestration -----------------------------------------------------------------------------------


def spawn(name: str, quick: bool, budget: float, env: dict) -> dict:
    """One stage in its own process, under `budget` seconds (plus a margin for its own cap)."""
    tic = time.perf_counter()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--budget",
           str(budget)] + (["--quick"] if quick else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 30, env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"over {budget + 30:.0f} s", "wall_s": time.perf_counter() - tic}
    out, found = marked_result(done, MARK, tic)
    if not found:
        out["stderr"] = "\n".join(done.stderr.splitlines()[-25:])[-3000:]
    return out


def marked_result(done: subprocess.CompletedProcess, mark: str, tic: float
                  ) -> tuple[dict[str, Any], bool]:
    """A child's result (the JSON on the last line of its stdout that starts with `mark`, with
    a status, "ok" where it exited 0 and printed one, and the seconds since `tic`), and whether
    it printed one (tools/q4_probe.py reads its children the same way)."""
    lines = [x for x in done.stdout.splitlines() if x.startswith(mark)]
    out: dict[str, Any] = {"status": "ok" if done.returncode == 0 and lines else
                           f"failed (exit {done.returncode})",
                           "wall_s": time.perf_counter() - tic}
    if lines:
        out.update(json.loads(lines[-1][len(mark):]))
    return out, bool(lines)


def needed(name: str, results: dict) -> bool:
    """Whether a stage should run given the others' results (the 4-bit probe only after a
    4-bit step that failed)."""
    if name == "q4_probe":
        return results.get("ours_q4", {}).get("status") != "ok"
    return True


def orchestrate(names: list[str], out: Path, quick: bool, budget: float, env: dict,
                results: dict, cold: bool = True) -> dict:
    """Run `names` in order under `budget`; `cold`: MLX's kernel cache starts empty (the first
    stage that compiles may take COLD_S more)."""
    start = time.perf_counter()
    costs = dict(STAGES + EXTRAS)
    for name in names:
        left = budget - (time.perf_counter() - start)
        if not needed(name, results):
            results[name] = {"status": "not needed"}
        elif left < (5 if quick else costs[name]) and name not in ("env",):
            results[name] = {"status": f"skipped: {left:.0f} s left of the budget"}
        else:
            cap = 3 * costs[name] + (COLD_S if cold and name not in NO_KERNELS else 0)
            stage_budget = max(left, 5.0) if quick else min(max(left, 10.0), cap)
            results[name] = spawn(name, quick, stage_budget, env)
            cold = cold and name in NO_KERNELS
        print(f"gpu_check: {name}: {results[name]['status']} "
              f"({results[name].get('wall_s', 0):.0f} s)", flush=True)
        save(out, results)
    return results


def cache_key(env: dict) -> str:
    """The MLX version and GPU architecture a kernel cache belongs to. MLX names a cached kernel
    by its module name alone (mlx/backend/cuda/jit_module.cpp; its default folder,
    $TMPDIR/mlx/VERSION/ptx, is per version), so kernels are reused only under the same key."""
    code = ("import mlx.core as mx; i = mx.device_info(); "
            "print(mx.__version__, i.get('architecture') or 'cpu')")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    return "-".join(done.stdout.split()) if done.returncode == 0 else "unknown"


def restore_cache(archive: Path, key: str, folder: Path = PTX) -> dict:
    """Unpack the kernels of `key` from an archive written by `save_cache` into `folder`."""
    if not archive.is_file():
        return {"key": key, "restored": False}
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        mine = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(key + "/")]
        for m in mine:
            m.name = m.name[len(key) + 1:]
        tar.extractall(folder, members=mine, filter="data")
    return {"key": key, "restored": bool(mine), "files": len(mine)}


def save_cache(archive: Path, key: str, folder: Path = PTX) -> dict:
    """`folder`'s files under `key` in a tar.xz at `archive` (written beside it, then moved
    into place)."""
    files = sorted(f for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else []
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for f in files:
            tar.add(f, arcname=f"{key}/{f.relative_to(folder)}")
    os.replace(tmp, archive)
    return {"saved": str(archive), "files": len(files), "bytes": archive.stat().st_size}


def save(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str))
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=WORK / "gpu_check.json")
    ap.add_argument("--wheels", type=Path, help="install the wheels (and CUDA parts) in DIR")
    ap.add_argument("--parts", type=Path, help="more parts of the split CUDA build")
    ap.add_argument("--only", default="", help="comma-separated stages")
    ap.add_argument("--extras", action="store_true", help="also the profiles (see above)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for all stages")
    ap.add_argument("--kernel-cache", type=Path,
                    help="MLX's kernel cache as a tar.xz: unpacked first, rewritten at the end")
    ap.add_argument("--quick", action="store_true", help="the tiny shape, short settings")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    if a.stage:
        sys.path.insert(0, str(ROOT))
        print(MARK + json.dumps(run_stage(a.stage, a.quick, a.budget), default=str), flush=True)
        return 0
    tic = time.perf_counter()
    results: dict[str, Any] = {"command": " ".join(["python", "tools/gpu_check.py",
                                                    *(argv or sys.argv[1:])])}
    env = dict(os.environ)
    if a.wheels:
        results["install"] = install(a.wheels, a.parts)
        save(a.out, results)
    paths = [str(SITE)] if SITE.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), *filter(None, [env.get(
        "PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["MLX_PTX_CACHE_DIR"] = str(PTX)
    names = [n for n, _ in STAGES] + ([n for n, _ in EXTRAS] if a.extras else [])
    if a.only:
        names = list(dict.fromkeys(a.only.split(",")))
        unknown = set(names) - {n for n, _ in STAGES + EXTRAS}
        if unknown:
            ap.error(f"unknown stage(s) {', '.join(sorted(unknown))}")
    key = cache_key(env) if a.kernel_cache else ""
    if a.kernel_cache:
        results["kernel_cache"] = restore_cache(a.kernel_cache, key)
    orchestrate(names, a.out, a.quick, a.budget - (time.perf_counter() - tic), env, results,
                cold=not results.get("kernel_cache", {}).get("restored"))
    if a.kernel_cache:
        results["kernel_cache"].update(save_cache(a.kernel_cache, key))
    results["seconds"] = time.perf_counter() - tic
    save(a.out, results)
    print(f"gpu_check: wrote {a.out} in {results['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
