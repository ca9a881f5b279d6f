"""`mlx-rlaif data convert|overlap`: public code sets into task files, and overlap between a
training and an evaluation task file.

    data convert --from mbpp|mbpp-plus|apps|taco|codecontests|livecodebench|humaneval IN
        --out OUT.jsonl [--language python|cpp|rust] [--id-prefix P] [--max-tests N] [--check]
    data overlap TRAIN EVAL [--n 8] [--threshold 0.5] [--json REPORT.json] [--show N]
    data from-repo PATH --out OUT.jsonl [--test-command CMD] [--python EXE] [--timeout S]
        [--eval-frac F] [--min-mutation-score 0.6] [--max-mutants N] [--context-lines N] ...

`convert` reads IN (JSONL, Parquet or a `datasets.save_to_disk` folder in the set's published
layout), writes OUT.jsonl whole or not at all, and lists every record it skipped with the
reason, also in OUT.skipped.jsonl. With `--check` each task's reference solution runs through
the exec reward (reward.exec settings from --config/--set) and a task whose reference fails
is skipped too. `overlap` reads any two task specs `load_tasks` reads. `from-repo` turns a Python
repository and its own tests into verified tasks (mlx_rlaif/data/from_repo; docs/data.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UsageError
from ..terminal import text, visible

HELP = ("Convert public code sets (MBPP, APPS, ...) into task files; tasks from your own "
        "repository; check train/eval overlap.")
SHOWN = 20  # skipped records and matches printed (all are in the files)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..data.convert import LANGUAGES, SETS

    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    c = sub.add_parser("convert", help="a set's published records into our task JSONL")
    c.add_argument("--from", dest="source", required=True, choices=list(SETS),
                   help="the set whose Hugging Face layout IN has")
    c.add_argument("input", metavar="IN", help="JSONL, Parquet, or a save_to_disk folder")
    c.add_argument("--out", required=True, type=Path, metavar="OUT.jsonl")
    c.add_argument("--language", default="python", choices=list(LANGUAGES),
                   help="language of stdin/stdout tasks (function tasks are Python)")
    c.add_argument("--id-prefix", default=None, help="task ids are PREFIX/<the set's id> "
                   "(default: the set's name)")
    c.add_argument("--max-tests", type=int, default=0, metavar="N",
                   help="keep at most N tests per task (0: all)")
    c.add_argument("--check", action="store_true",
                   help="run each reference solution through the exec reward; skip failures")
    c.add_argument("--config", help="YAML config whose reward.exec settings --check uses")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.set_defaults(_data=run_convert)
    add_from_repo(sub)
    o = sub.add_parser("overlap", help="n-gram overlap of prompts and solutions, duplicate tests")
    o.add_argument("train", metavar="TRAIN", help="training tasks (JSONL, suite:NAME, ...)")
    o.add_argument("eval", metavar="EVAL", help="evaluation tasks")
    o.add_argument("--n", type=int, default=8, help="tokens per n-gram (default 8)")
    o.add_argument("--threshold", type=float, default=0.5,
                   help="flag a pair at this share of shared n-grams (default 0.5)")
    o.add_argument("--json", type=Path, metavar="REPORT.json", help="write the full report")
    o.add_argument("--show", type=int, default=SHOWN, metavar="N", help="table rows (0: all)")
    o.set_defaults(_data=run_overlap)


def run(args: argparse.Namespace) -> int:
    return int(args._data(args) or 0)


# --- convert ------------------------------------------------------------------------------------


def run_convert(args: argparse.Namespace) -> int:
    from ..data.convert import Options, convert
    from ..data.sources import read_records

    if args.max_tests < 0:
        raise UsageError("--max-tests must be 0 (all) or more")
    if args.out.suffix != ".jsonl":
        raise UsageError(f"--out {args.out}: write a .jsonl file")
    opts = Options(args.language, args.id_prefix, args.max_tests)
    records = read_records(args.input)
    done = convert(args.source, records, opts)
    if args.check:
        check_solutions(done, args.config, args.set)
    write_lines(args.out, done.tasks)
    skipped_path = args.out.with_name(args.out.stem + ".skipped.jsonl")
    if done.skipped:
        write_lines(skipped_path, done.skipped)
    else:
        skipped_path.unlink(missing_ok=True)
    print(f"{args.source}: {len(records)} records -> {len(done.tasks)} tasks in {args.out}; "
          f"{len(done.skipped)} skipped")
    for reason, n in done.reasons().items():  # downloaded data: control characters escaped
        print(f"  skipped {n}: {visible(reason, lines=False)}")
    for s in done.skipped[:SHOWN]:
        print(f"  {visible(s['id'], lines=False)}: {visible(s['reason'], lines=False)}")
    if done.skipped:
        print(f"all skipped records, with the reason: {skipped_path}")
    return 0


def check_solutions(done, config: str | None, overrides: list[str]) -> None:
    """Run every reference solution through the exec reward; a task whose reference does not
    pass all its tests moves to `done.skipped`. Tasks without a reference stay."""
    from ..config import load
    from ..data import task_from_record
    from ..rewards.exec import ExecReward

    cfg = load(config, overrides)
    pairs = [(rec, task_from_record(rec, rec["id"])) for rec in done.tasks]
    checked = [(rec, t) for rec, t in pairs if isinstance(rec.get("solution"), str)]
    reward = ExecReward(cfg.reward.exec, languages={t.language for _, t in checked} or None)
    try:
        results = reward.score([t for _, t in checked], [rec["solution"] for rec, _ in checked])
    finally:
        reward.close()
    failed = {}
    for (rec, _), r in zip(checked, results, strict=True):
        ok = r.value is not None and r.details.get("passed") == r.details.get("total")
        if not ok:
            failed[rec["id"]] = f"the reference solution fails here: {r.reason}"[:300]
    done.skipped += [{"id": rec["id"], "where": "--check", "reason": failed[rec["id"]]}
                     for rec in done.tasks if rec["id"] in failed]
    done.tasks = [rec for rec in done.tasks if rec["id"] not in failed]
    print(f"--check: {len(checked)} reference solutions run, {len(failed)} failed, "
          f"{len(pairs) - len(checked)} tasks have none")


def write_lines(path: Path, records: list[dict]) -> None:
    from ..metrics.jsonl import atomic_write

    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


# --- overlap ------------------------------------------------------------------------------------


def run_overlap(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..data import load_tasks
    from ..data.overlap import find_overlaps, report

    if args.n < 1 or not 0 < args.threshold <= 1:
        raise UsageError("--n must be at least 1 and --threshold in (0, 1]")
    train, evals = load_tasks(args.train), load_tasks(args.eval)
    matches = find_overlaps(train, evals, args.n, args.threshold)
    rep = {"train": args.train, "eval": args.eval,
           **report(train, evals, matches, args.n, args.threshold)}
    shown = matches if args.show <= 0 else matches[: args.show]
    table = Table(title=f"{len(shown)} of {len(matches)} overlaps ({args.n}-grams, threshold "
                        f"{args.threshold})")
    for col in ("train task", "eval task", "field", "score"):
        table.add_column(col)
    for m in shown:
        table.add_row(text(m.train_id), text(m.eval_id), text(m.field), f"{m.score:.2f}")
    console = Console() if Console().is_terminal else Console(width=200)
    console.print(table)
    fields = ", ".join(f"{f} {n}" for f, n in rep["by_field"].items())
    print(f"{rep['flagged_train_tasks']} of {len(train)} training tasks overlap the "
          f"{len(evals)} evaluation tasks ({fields})")
    if args.json:
        from ..metrics.jsonl import atomic_write

        atomic_write(args.json, json.dumps(rep, indent=2) + "\n")
        print(f"report: {args.json}")
    return 0


# --- from-repo ----------------------------------------------------------------------------------


def add_from_repo(sub) -> None:
    r = sub.add_parser("from-repo", help="a Python repository and its tests into verified tasks")
    r.add_argument("path", metavar="PATH", type=Path, help="the repository (read, never written)")
    r.add_argument("--out", required=True, type=Path, metavar="OUT.jsonl")
    r.add_argument("--eval-out", type=Path, metavar="EVAL.jsonl",
                   help="held-out tasks with --eval-frac (default: OUT.eval.jsonl)")
    r.add_argument("--test-command", default="python -m pytest -x -q",
                   help="how the repository's tests run, from its root (a leading `python` is "
                        "--python)")
    r.add_argument("--python", default=None, metavar="EXE",
                   help="the interpreter whose packages the repository needs (default: this one)")
    r.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="the test command is killed after S seconds (default 600)")
    r.add_argument("--max-calls", type=int, default=20, metavar="N",
                   help="distinct calls recorded per function (default 20)")
    r.add_argument("--max-tests", type=int, default=10, metavar="N",
                   help="recorded calls kept as checks per task (default 10)")
    r.add_argument("--context-lines", type=int, default=200, metavar="N",
                   help="the module in the prompt cut to N lines around the function (0: whole)")
    r.add_argument("--max-mutants", type=int, default=20, metavar="N",
                   help="mutants per function for the mutation score (default 20)")
    r.add_argument("--min-mutation-score", type=float, default=0.6, metavar="F",
                   help="drop tasks whose checks kill fewer mutants (default 0.6)")
    r.add_argument("--eval-frac", type=float, default=0.0, metavar="F",
                   help="hold out whole modules, about F of the tasks, into --eval-out")
    r.add_argument("--id-prefix", default="", help="task ids are PREFIX<file>::<function> "
                   "(default: the repository's directory name and a colon)")
    r.add_argument("--config", help="YAML config whose reward.exec settings the gate uses")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    r.set_defaults(_data=run_from_repo)


def run_from_repo(args: argparse.Namespace) -> int:
    import os
    import sys

    from ..config import load
    from ..data.from_repo import Options, build
    from ..rewards.exec import ExecReward

    if args.out.suffix != ".jsonl":
        raise UsageError(f"--out {args.out}: write a .jsonl file")
    if not 0 <= args.eval_frac < 1 or not 0 <= args.min_mutation_score <= 1:
        raise UsageError("--eval-frac must be in [0, 1) and --min-mutation-score in [0, 1]")
    if min(args.max_calls, args.max_tests, args.max_mutants) < 1 or args.timeout <= 0:
        raise UsageError("--max-calls, --max-tests and --max-mutants must be at least 1, "
                         "--timeout above 0")
    repo = args.path.resolve()
    out = args.out.resolve()
    eval_path = (args.eval_out or out.with_name(out.stem + ".eval.jsonl")).resolve()
    summary_path = out.with_name(out.stem + ".summary.json")
    for flag, given, path in (("--out", args.out, out), ("--eval-out", eval_path, eval_path),
                              ("--out", summary_path, summary_path)):
        if path.is_relative_to(repo):
            raise UsageError(f"{flag} {given}: inside the repository, which is never written")
        if path.is_dir():
            raise UsageError(f"{flag} {given} is a directory: pass a file path")
    cfg = load(args.config, [*args.set, "reward.exec.cache_size=0"])  # the gate runs twice
    e = cfg.reward.exec
    opts = Options(repo, args.test_command, args.python or sys.executable, args.timeout,
                   args.max_calls, args.max_tests, args.context_lines, args.max_mutants,
                   args.min_mutation_score, args.eval_frac, args.id_prefix, e.sandbox,
                   e.uid_base + 2 * (e.workers or os.cpu_count() or 1))  # apart from the gate's
    reward = ExecReward(cfg.reward.exec, languages={"python"})
    try:
        done = build(opts, reward.score, say=lambda m: print(visible(m, lines=False)))
    finally:
        reward.close()
    if not done["train"] and not done["eval"]:
        raise no_tasks(done["summary"])
    from ..artifacts.atomic import write_text_atomic

    def jsonl(records: list[dict]) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

    write_text_atomic(out, jsonl(done["train"]))  # a FIFO or a device written into, not replaced
    if done["eval"]:
        write_text_atomic(eval_path, jsonl(done["eval"]))
    write_text_atomic(summary_path, json.dumps(done["summary"], indent=2) + "\n")
    print_summary(done["summary"], out, eval_path if done["eval"] else None, summary_path)
    return 0


def no_tasks(s: dict) -> UsageError:
    """One line: no task could be built from the repository, and the main reasons."""
    from ..data.from_repo import RepoError

    why = "; ".join(f"{n} {k}" for k, n in sorted(s["dropped"].items(), key=lambda kv: -kv[1])[:3])
    return RepoError(f"no task could be built from the repository ({s['called']} functions "
                     f"called, {s['tasks_built']} tasks built, none kept"
                     + (f": {visible(why, lines=False)[:300]}" if why else "") + ")")


def print_summary(s: dict, out: Path, eval_path: Path | None, summary_path: Path) -> None:
    print(f"functions: {s['functions_found']} module-level found ({s['methods_and_nested']} "
          f"methods and nested functions not covered), {s['called']} called by the tests, "
          f"{s['not_called']} not called; {s['tasks_built']} tasks built, {s['kept']} kept")
    for why, n in sorted(s["dropped"].items(), key=lambda kv: -kv[1]):
        print(f"  dropped {n}: {why}")
    if s["checks_dropped"]:
        print(f"  {s['checks_dropped']} single checks dropped: the original fails them here")
    for label, key in (("measured", "mutation_scores"), ("kept", "kept_mutation_scores")):
        d = s[key]
        if d.get("n"):
            hist = " ".join(f"{k}:{v}" for k, v in d["histogram"].items() if v)
            print(f"mutation score ({label}, {d['n']} tasks): min {d['min']:.2f} median "
                  f"{d['median']:.2f} mean {d['mean']:.2f}; {hist}")
    print(f"{s['train']} tasks in {out}" + (f", {s['eval']} held out (whole modules) in "
                                            f"{eval_path}" if eval_path else "")
          + f"; summary {summary_path}; {s['seconds']:.1f} s")
