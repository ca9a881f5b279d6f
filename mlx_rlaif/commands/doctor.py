"""`mlx-rlaif doctor [--config F]`: what a user checks before a night's training. The device as
MLX reports it (Metal, CUDA with the GPU's name and memory, or the CPU), the MLX build installed
(two Linux builds overwriting each other's library fail the check), what multiplies (the GPU's
libraries, or the CPU's BLAS), the sandbox's mode and a self-test (a trivial program runs, a
hostile one is contained), the memory budget (a GPU's own memory where it has one) and what the
config needs of it (the memory plan), then a probe: a few real steps of the configured run in a
temporary directory (nothing is written to the run directory; held-out evaluations, baselines,
TensorBoard and checkpoints off). The first step compiles (traces, and on a GPU its kernels), so
it is reported apart and the time per run is projected from the steps after it.

Exit code 0 when every check held, 1 when one did not (a sandbox property its mode claims, a
mixed MLX install, a config that does not fit its budget, a probe that failed).

Not covered: the held-out evaluations' time (the projection says so), a teacher's API beyond
the probe's own calls (with a teacher reward the probe calls it, as the run would).
"""

from __future__ import annotations

import argparse
import gc
import io
import logging
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..assets import QUICKSTART
from ..config import Config, load
from ..errors import ConfigError, RlaifError, UsageError

HELP = ("Check the device, BLAS, the sandbox, the memory plan and a 2-step probe of a config "
        "before a long run.")
GB = 2**30


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: the quickstart)")
    p.add_argument("--model", help="model directory or hub id (model.path)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable)")
    p.add_argument("--steps", type=int, default=3,
                   help="steps of the probe (default 3: the first compiles, the rest are timed)")
    p.add_argument("--no-probe", action="store_true", help="skip the probe")


def say(label: str, text: str) -> None:
    for i, line in enumerate(text.splitlines() or [""]):
        print(f"{label if i == 0 else '':<10}{line}", flush=True)


def run(args: argparse.Namespace) -> int:
    overrides = ([f"model.path={args.model}"] if args.model else []) + list(args.set)
    cfg = load(args.config or str(QUICKSTART), overrides)
    if args.steps < 1:
        raise ConfigError("--steps must be 1 or more")
    say("device", device_line())
    builds, builds_ok = install_line()
    say("install", builds)
    say("BLAS", blas_line())
    ok = sandbox_report(cfg) and builds_ok
    plan_ok = memory_report(cfg)
    if plan_ok and not args.no_probe:
        ok = probe_report(cfg, args.steps) and ok
    return 0 if ok and plan_ok else 1


# --- device and BLAS ---------------------------------------------------------------------------


def device_line() -> str:
    """The machine, MLX's version and the device MLX computes on as MLX reports it (Metal, CUDA
    with the GPU's name, the CPU), the host's RAM."""
    import mlx.core as mx
    import psutil

    from ..backends.mlx import device

    vm = psutil.virtual_memory()
    return (f"{platform.system()} {platform.machine()}, MLX {mx.__version__}, "
            f"{device.describe(device.current())}; {os.cpu_count()} cores, RAM "
            f"{vm.total / GB:.1f} GB ({vm.available / GB:.1f} GB available)")


def install_line() -> tuple[str, bool]:
    """(the MLX builds installed, whether they are right): a mixed install (two Linux builds
    overwriting each other's library) or none on Linux is a failure."""
    from ..install import BACKENDS, backend_problem, installed_backends

    found = installed_backends()
    problem = backend_problem(found)
    names = ", ".join(f"{n} {v} ({BACKENDS[n]})" for n, v in found.items()) or "none"
    return (f"FAILED: {problem}" if problem else names), problem is None


def blas_line() -> str:
    """What multiplies: the GPU's own libraries (Metal; CUDA: cuBLAS), or on the CPU OpenBLAS
    or MLX's bundled BLAS, with a measured matmul rate."""
    import mlx.core as mx

    from ..backends.mlx import device
    from ..cpu import active
    from ..cpu.blas import default_threads, fast_blas_active, find_fast_blas, train_threads

    kind = device.kind_of()
    if kind != "cpu":
        return {"metal": "Metal (the GPU multiplies; nothing to set up)",
                "cuda": "cuBLAS and cuDNN through MLX's CUDA build (the GPU multiplies)"}[kind]
    n = 1024
    a = mx.random.normal((n, n))
    mx.eval(a @ a)
    tic = time.perf_counter()
    mx.eval(a @ a)
    rate = f"matmul {n}: {2 * n**3 / (time.perf_counter() - tic) / 1e9:.0f} GFLOP/s"
    if fast_blas_active():
        threads = os.environ.get("OPENBLAS_NUM_THREADS", str(default_threads()))
        per_phase = f", {train_threads()} training" if active() else ""
        return f"OpenBLAS preloaded: {threads} thread(s) decoding{per_phase}; {rate}"
    hint = ("installed but not preloaded (MLX_RLAIF_FAST_BLAS=0?)" if find_fast_blas()
            else "apt-get install libopenblas0-pthread")
    return f"MLX's bundled reference BLAS, slow: {hint}; {rate}"


# --- sandbox -------------------------------------------------------------------------------------


def sandbox_report(cfg: Config) -> bool:
    """The sandbox this config will use, and its hostile self-test as one table (selftest.py):
    False when a probe escaped or something runs need failed inside."""
    from ..sandbox import Sandbox
    from ..sandbox.selftest import self_test, table
    from ..terminal import visible

    e = cfg.reward.exec
    try:
        sandbox = Sandbox(e.sandbox, slots=2, uid_base=e.uid_base, python=e.python)
    except RlaifError as err:
        say("sandbox", f"cannot start: {err}")
        return False
    used = "" if cfg.reward.type in ("exec", "mix") else f" (reward.type {cfg.reward.type}: unused)"
    rows = [*self_test(sandbox), *toolchain_rows(e)]
    count = {v: sum(r.verdict == v for r in rows) for v in ("contained", "escaped", "n.a.")}
    escaped = [r.name for r in rows if r.verdict == "escaped"]
    failed = [r.name for r in rows if r.verdict == "FAILED"]
    verdict = (f"{count['contained']} contained, {count['escaped']} escaped, {count['n.a.']} "
               "n.a. (does not work here even outside the sandbox, or not on this platform)")
    if escaped:
        verdict += (f"; ESCAPED: {', '.join(escaped)}: student code can do that here"
                    f"{PROCESS_HINT if sandbox.mode == 'process' else ''}")
    if failed:
        verdict += f"; FAILED inside: {', '.join(failed)}"
    say("sandbox", visible(f"{sandbox.describe()}{used}\n{table(rows)}\n{verdict}"))
    return not (escaped or failed)


PROCESS_HINT = (" (process mode: install bubblewrap, apt-get install bubblewrap, and set "
                "reward.exec.sandbox: auto)")
HELLO = {"cpp": ("C++", "#include <cstdio>\nint main() { std::puts(\"hello\"); }\n"),
         "rust": ("Rust", "fn main() { println!(\"hello\"); }\n")}


def toolchain_rows(e: Any) -> list[Any]:
    """A C++ and a Rust hello world through the exec reward, as a run builds and runs them
    (n.a. where the toolchain is not installed)."""
    from ..records import Task
    from ..rewards.exec import ExecReward
    from ..rewards.exec.reward import find_toolchain
    from ..sandbox.selftest import Row

    rows = []
    for lang, (name, code) in HELLO.items():
        found = find_toolchain(lang, e)
        if isinstance(found, str):
            rows.append(Row(f"{name} hello world", "-", "", "n.a."))
            continue
        label = f"{name} hello world ({os.path.basename(found.compiler or '')})"
        logging.disable(logging.WARNING)  # its start line: the table says it
        try:
            reward = ExecReward(e, {lang})
        except RlaifError as err:
            rows.append(Row(label, "-", "", "n.a.", str(err)[:300]))  # unreachable in this mode
            continue
        finally:
            logging.disable(logging.NOTSET)
        try:
            task = Task(id=f"hello-{lang}", prompt="", language=lang,
                        tests=({"stdin": "", "stdout": "hello\n"},))
            r = reward.score([task], [f"```{lang}\n{code}```"])[0]
        finally:
            reward.close()
        ok = r.value == 1.0
        rows.append(Row(label, "works" if ok else "fails", "", "ok" if ok else "FAILED",
                        (r.reason or "no score")[:200]))
    return rows


# --- memory and the probe ----------------------------------------------------------------------


def memory_report(cfg: Config) -> bool:
    """The budget and the plan for the configured model (loaded once here, then released)."""
    from ..backends.mlx import memory
    from ..backends.ops import OPS
    from ..backends.sampling import prompt_formatter
    from ..data import load_tasks
    from ..train import memory_plan
    from ..train.distill import load_teacher

    budget, source = memory.device_budget(cfg.training.max_memory_gb)
    head = f"budget {memory.gb(budget)} GB ({source})"
    if cfg.model.backend != "mlx":
        say("memory", f"{head}; no plan (MLX only)")
        return True
    d = cfg.data
    tasks = load_tasks(d.train_file, d.languages, d.max_tasks, d.difficulties)
    policy = OPS["mlx"]().load(cfg)
    fmt = prompt_formatter(policy.tokenizer, cfg.model)
    teacher = None
    try:
        teacher = load_teacher(cfg, policy)  # distill.kind teacher: its weights and forward
        plan, shape = memory_plan.make_plan(cfg, policy.model, memory_plan.longest_prompt(
            fmt, tasks), budget, getattr(teacher, "model", None))
    except (ConfigError, UsageError) as e:
        say("memory", f"{head}: DOES NOT FIT: {e}" if isinstance(e, ConfigError)
            else f"{head}: {e}")
        return False
    finally:
        del policy, teacher
        gc.collect()
    if plan is None:
        say("memory", f"{head}; no plan (the model's shapes are unknown)")
        return limits_report(cfg, plan, budget)
    run_cfg = memory_plan.resolved(cfg, plan, budget)
    say("memory", memory_plan.startup_line(plan, budget, source, run_cfg).removeprefix(
        "memory: ") + "\n" + breakdown(plan, shape))
    return limits_report(cfg, plan, budget)


def limits_report(cfg: Config, plan: Any, budget: int) -> bool:
    """The machine's wired-memory limit (macOS: iogpu.wired_limit_mb where set) and MLX's
    recommended working set, then the wired and cache limits the run will set (memory_plan.
    device_limits); False where model.wired_limit_gb is over what the Mac allows."""
    from ..backends.mlx import memory
    from ..train import laptop, memory_plan

    ws = memory.recommended_working_set()
    machine = laptop.wired_sysctl() or "no wired memory (MLX is not on Metal here)"
    if ws:
        machine += f"; MLX's recommended working set {memory.gb(ws)} GB"
    try:
        limits = memory_plan.device_limits(cfg.model, plan, budget, ws)
    except ConfigError as e:
        say("limits", f"{machine}\nthe run: REFUSED: {e}")
        return False
    said = limits.line.removeprefix("MLX limits: ") or "MLX's defaults (model.wired_limit_gb, "\
        "model.cache_limit_gb: 0)"
    say("limits", f"{machine}\nthe run: {said}")
    return True


def breakdown(plan: Any, shape: Any) -> str:
    from ..backends.mlx import memory

    adapters = memory.fixed_bytes(shape) - shape.weight_bytes
    teacher = (f" + teacher weights {memory.gb(plan.teacher)} GB" if plan.teacher else "")
    forward = (f", teacher forward {memory.gb(plan.teacher_pass)} GB" if plan.teacher else "")
    return (f"weights {memory.gb(plan.weights)} GB + adapters and AdamW "
            f"{memory.gb(adapters)} GB{teacher} + the largest phase: decoding "
            f"{memory.gb(plan.decode)} GB, update {memory.gb(plan.update)} GB{forward} = "
            f"{memory.gb(plan.peak)} GB of {memory.gb(plan.budget)} GB")


def probe_config(cfg: Config, out: str, steps: int) -> Config:
    """The run as configured, `steps` steps into `out`, with nothing beside the steps."""
    t, lg = cfg.training, cfg.logging
    return replace(
        cfg, data=replace(cfg.data, eval_file=""),
        training=replace(t, output_dir=out, max_steps=steps, save_every_batches=0,
                         save_every_epochs=0, save_mlx_model_bits=0),
        logging=replace(lg, tensorboard=False, dashboard=False, collect_dataset=False,
                        baseline_eval_batches=0, health_check_enabled=False))


def probe(cfg: Config, steps: int) -> list[dict]:
    """`steps` real steps of `cfg` in a temporary directory: their batches.jsonl records."""
    from ..metrics import MetricsHub
    from ..metrics.dashboard import PlainPrinter
    from ..metrics.jsonl import read_jsonl
    from ..train import train

    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-doctor-") as tmp:
        run_cfg = probe_config(cfg, str(Path(tmp) / "run"), steps)
        run_dir = Path(run_cfg.training.output_dir)
        run_dir.mkdir()
        view = PlainPrinter(steps, 1, io.StringIO())
        hub = MetricsHub(run_cfg.logging, run_dir, view, None, None, False)
        train(run_cfg, hub=hub)
        return list(read_jsonl(run_dir / "batches.jsonl"))


def probe_report(cfg: Config, steps: int) -> bool:
    from ..data import load_tasks
    from ..train.trainer import total_steps

    try:
        records = probe(cfg, steps)
    except RlaifError as e:
        say("probe", f"FAILED: {e}")
        return False
    times = [r["time/step"] for r in records]
    peak = max(r.get("memory/mlx_peak_gb", 0.0) for r in records)
    split = {k: statistics.mean(r[f"time/{k}"] for r in steady_of(records))
             for k in ("generate", "score", "train")}
    total = sum(split.values()) or 1.0
    say("probe", f"{len(records)} step(s) of {cfg.model.path} in a temporary directory: first "
        f"{times[0]:.2f} s (it compiles), then " + (", ".join(f"{t:.2f}" for t in times[1:])
                                                     or "none") + " s ("
        + ", ".join(f"{k} {v / total:.0%}" for k, v in split.items())
        + f"); MLX peak {peak:.2f} GB, trained {sum(r['train/sequences'] for r in records):.0f}"
        " sequences")
    d = cfg.data
    n = total_steps(cfg, len(load_tasks(d.train_file, d.languages, d.max_tasks,
                                        d.difficulties)))
    per_step, note = projection(times)
    if n is None:  # training.max_minutes alone ends the run
        n = int(60 * cfg.training.max_minutes / per_step)
    say("projected", f"{per_step:.2f} s per step; {n} steps: {hms(per_step * n)} per run "
        f"(held-out evaluations and checkpoints not included){note}")
    return True


def steady_of(records: list[dict]) -> list[dict]:
    """The probe's steps after the first (which traces, compiles kernels and warms caches); the
    first alone when it is the only one."""
    return records[1:] or records


def projection(times: list[float]) -> tuple[float, str]:
    """(seconds per step, a caveat): the median of the steps after the first. When those still
    differ by more than 3x (new shapes compiling, or a GPU's cold kernel cache) the projection
    is an upper bound, and the caveat says so; a single step projects from itself, also said."""
    if len(times) < 2:
        return times[0], "; from one step, which includes compilation: an upper bound"
    steady = times[1:]
    note = ""
    if max(steady) > 3 * min(steady):
        note = (f"; the steps after the first still ranged {min(steady):.2f}-{max(steady):.2f} s "
                "(new shapes compiling or a cold kernel cache): an upper bound, more --steps "
                "narrow it")
    return statistics.median(steady), note


def hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s"
