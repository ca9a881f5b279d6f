"""Soak: one long `mlx-rlaif train` run with everything on (the exec reward in its sandbox, a
teacher through the real SDK against the fake API of tests/fake_api.py failing 10% of requests
in the ways of tests/fault_api.py), watched from outside every N steps: the trainer's resident
memory, open file descriptors, threads, child processes (zombies counted apart) and the entries
of its private TMPDIR (but MLX's kernel cache, `$TMPDIR/mlx`, linked to the machine's own). After
it exits: what is left in that TMPDIR and /dev/shm, and whether any process it started still
runs.

    flock /tmp/mlx-rlaif-measure.lock python3 tools/soak.py --steps 500 --every 50 \\
        --out runs/soak

prints a table and writes `soak.json` in --out. `measure()` is what tests/test_faults_soak.py
calls for its 50-step version.

`--memory` is the other soak (issue 61): MLX's own memory over one long run of the tiny model
in this process (the syntax reward; every step updates the adapters, even where a group's
rewards are all equal; checkpoints every 50 steps), read after every step: active
(the arrays alive), cache (freed buffers MLX keeps for reuse) and the step's peak (reset after
each reading); the growth per step is the least-squares slope over the steps after the first
tenth. Writes `soak-memory.json` in --out:

    flock /tmp/mlx-rlaif-measure.lock python3 tools/soak.py --memory --steps 150 \\
        --out runs/soak-memory

Not covered: GPU memory; macOS (no /proc: the process checks use psutil only, untested there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_api import FakeAPI  # noqa: E402
from fault_api import TIMEOUT, FaultMix  # noqa: E402

MLX_CACHE = "mlx"  # MLX's CPU build compiles kernels into $TMPDIR/mlx/<version>/cpu, a cache
SETS = ("data.train_file=suite:synthetic-train", "data.languages=[python]",
        "data.difficulties=[easy]", "training.batch_size=4", "generation.num_samples_per_prompt=4",
        "generation.max_new_tokens=64", "training.num_epochs=100",
        "training.save_every_batches=50", "training.save_total_limit=2", "reward.type=mix",
        "reward.exec.workers=2", "reward.teacher.provider=openai", "reward.teacher.model=judge",
        "reward.teacher.concurrency=8",
        f"reward.teacher.timeout_s={TIMEOUT}", "reward.teacher.max_retries=1",
        "reward.teacher.price_in_per_mtok=1000", "reward.teacher.price_out_per_mtok=5000")


def command(model: Path, out: Path, steps: int, url: str, sets: tuple[str, ...]) -> list[str]:
    pairs = [a for s in (*SETS, f"reward.teacher.base_url={url}", *sets) for a in ("--set", s)]
    return [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(model), "--output-dir",
            str(out), "--max-steps", str(steps), "--no-dashboard", *pairs]


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def zombies(proc: psutil.Process) -> set[int]:
    out = set()
    for p in descendants(proc):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


def sample(proc: psutil.Process, step: int, tmp: Path) -> dict:
    """One row: the trainer's figures now. A zombie counts only if it is still one 0.3 s later
    (a child that just exited is a zombie until it is reaped)."""
    first = zombies(proc)
    kids = descendants(proc)
    row = {"step": step, "rss_mb": round(proc.memory_info().rss / 2**20, 1),
           "fds": proc.num_fds(), "threads": proc.num_threads(),
           "children": sum(1 for p in kids if p.pid not in first),
           "tmp_entries": len(temp_files(tmp))}
    time.sleep(0.3)
    row["zombies"] = len(first & zombies(proc))
    return row


def temp_files(tmp: Path) -> list[str]:
    """Everything under the trainer's TMPDIR but MLX's kernel cache (kept on purpose)."""
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                  if p.relative_to(tmp).parts[0] != MLX_CACHE)


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "batches.jsonl"
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def measure(steps: int, every: int, model: Path, work: Path, rate: float = 0.10,
            seed: int = 0, sets: tuple[str, ...] = ()) -> dict:
    """Run the soak; returns the samples and what was left after the trainer exited."""
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="soak-tmp-", dir=work))
    shared_cache = Path(tempfile.gettempdir()) / MLX_CACHE
    if shared_cache.is_dir():  # MLX's CPU kernels, compiled once per machine: not recompiled
        (tmp / MLX_CACHE).symlink_to(shared_cache)
    run_dir = work / "run"
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    env.pop("MLX_RLAIF_FAULT", None)
    rows, seen = [], {}
    t0 = time.monotonic()
    with FakeAPI() as srv, open(work / "train.log", "w") as log:
        mix = FaultMix(srv, rate, seed)
        srv.responder = mix
        popen = psutil.Popen(command(model, run_dir, steps, srv.openai_url, sets), env=env,
                             stdout=log, stderr=log, cwd=ROOT)
        next_at = 1
        while popen.poll() is None:
            done = steps_logged(run_dir)
            if done >= next_at:
                try:
                    rows.append(sample(popen, done, tmp))
                    seen.update({p.pid: p for p in descendants(popen)})
                except psutil.Error:
                    break
                next_at = every * (done // every + 1)
            time.sleep(0.1)
        rc = popen.wait()
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    survivors = [pid for pid, p in seen.items() if _alive(p)]
    return {"steps": steps, "every": every, "rc": rc, "elapsed_s": round(time.monotonic() - t0, 1),
            "samples": rows, "teacher_requests": srv.hits(), "faults": mix.sent,
            "left_in_tmp": temp_files(tmp),
            "left_in_dev_shm": sorted(shm_after - shm_before), "survivors": survivors,
            "log": str(work / "train.log"), "tmp": str(tmp)}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def table(result: dict) -> str:
    keys = ["step", "rss_mb", "fds", "threads", "children", "zombies", "tmp_entries"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in result["samples"]]
    return "\n".join(lines)


MEMORY_SETS = ("data.train_file=suite:synthetic-train", "data.languages=[python]",
               "reward.type=syntax", "training.batch_size=2",
               "generation.num_samples_per_prompt=4", "generation.max_new_tokens=16",
               "training.save_every_batches=50", "training.save_total_limit=2",
               "logging.log_every=50", "data.eval_file=", "logging.baseline_eval_batches=0",
               "rl.drop_zero_std=false", "rl.entropy_coef=0.05")  # every step updates


def memory_soak(steps: int, model: Path, work: Path, sets: tuple[str, ...] = ()) -> dict:
    """MLX's active, cache and per-step peak memory (MB) after each of `steps` steps of one
    run in this process, and their growth per step (`growth`)."""
    import mlx.core as mx

    from mlx_rlaif.config import load
    from mlx_rlaif.metrics import MetricsHub
    from mlx_rlaif.train.trainer import hparams, train

    rows: list[dict] = []

    class Recorder(MetricsHub):
        def log_step(self, step: int, metrics: dict) -> None:
            super().log_step(step, metrics)  # first: its memory/mlx_peak_gb before the reset
            rows.append({"step": step, "active_mb": round(mx.get_active_memory() / 2**20, 2),
                         "cache_mb": round(mx.get_cache_memory() / 2**20, 2),
                         "peak_mb": round(mx.get_peak_memory() / 2**20, 2)})
            mx.reset_peak_memory()

    run_dir = work / "run"
    cfg = load(None, [*MEMORY_SETS, f"model.path={model}", f"training.output_dir={run_dir}",
                      f"training.max_steps={steps}", *sets])
    t0 = time.monotonic()
    train(cfg, hub=Recorder.create(cfg.logging, run_dir, False, steps, hparams(cfg)))
    return {"steps": steps, "elapsed_s": round(time.monotonic() - t0, 1), "mlx": mx.__version__,
            "device": str(mx.default_device()), "growth": growth(rows), "samples": rows}


def growth(rows: list[dict]) -> dict:
    """MB per step of each reading: the least-squares slope over the steps after the first
    tenth (the first steps compile and fill the cache)."""
    import numpy as np

    kept = rows[len(rows) // 10:]
    if len(kept) < 2:
        return {}
    x = np.array([r["step"] for r in kept], dtype=float)
    return {f"{k}_per_step": float(np.polyfit(x, [r[k] for r in kept], 1)[0])
            for k in ("active_mb", "cache_mb", "peak_mb")}


def memory_table(result: dict, every: int) -> str:
    keys = ["step", "active_mb", "cache_mb", "peak_mb"]
    rows = [r for r in result["samples"] if r["step"] % every == 0 or r["step"] == 1]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return "\n".join(lines + ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-coder"))
    ap.add_argument("--fault-rate", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/soak", help="work directory (run, log, soak.json)")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    ap.add_argument("--memory", action="store_true",
                    help="MLX's active/cache/peak memory per step instead (in this process)")
    args = ap.parse_args()
    if args.memory:
        out = Path(args.out).resolve()
        result = memory_soak(args.steps, Path(args.model), out, tuple(args.set))
        (out / "soak-memory.json").write_text(json.dumps(result, indent=1) + "\n")
        print(memory_table(result, args.every))
        print(f"{result['steps']} steps in {result['elapsed_s']} s on {result['device']} (MLX "
              f"{result['mlx']}); growth per step after the first tenth: " + ", ".join(
                  f"{k.removesuffix('_per_step')} {v:+.4f} MB" for k, v in
                  result["growth"].items()))
        return 0
    result = measure(args.steps, args.every, Path(args.model), Path(args.out).resolve(),
                     args.fault_rate, args.seed, tuple(args.set))
    (Path(args.out) / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    faults = sum(n for k, n in result["faults"].items() if k != "ok")
    print(f"exit code {result['rc']}, {result['elapsed_s']} s, {result['teacher_requests']} "
          f"teacher requests, {faults} faults; left in TMPDIR: {len(result['left_in_tmp'])}, in "
          f"/dev/shm: {len(result['left_in_dev_shm'])}, processes still running: "
          f"{len(result['survivors'])}")
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
