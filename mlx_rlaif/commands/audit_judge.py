"""`mlx-rlaif audit-judge`: before a run, measure whether the configured teacher judges what the
tests judge (agreement, noise, position, comment, dead-code and injection bias) on a file of
completions with tests; no model is loaded.

A command of its own rather than `score --audit`: `score` writes one scored line per input line
(to stdout or --out), the audit writes one report, needs the exec and the teacher rewards
together, and has flags of its own (repeats, orders, the cost confirmation) that mean nothing to
`score`. The input is `score`'s (task record + `completion` per line) and the teacher flags are
`score`'s too.

Before any teacher call it prints how many calls the audit makes and their estimated cost; above `--confirm-above` dollars (or with no prices configured, unless the teacher is on
this machine) it asks on the terminal, and refuses with one line naming `--yes` when stdin is
not a terminal. The report is a table on stdout and, with `--out`, JSON (written whole or not
at all); its last line is the verdict: flagged, inconclusive (a probe's 95% interval spans
the threshold: with how many completions would decide it) or clean (audit_report.py); the exit
code is 0 whichever it is. Answers are cached for the
audit's own length only (unlike `score`, so each audit measures the judge afresh);
`reward.teacher.cache_path` keeps them.

Not covered: auditing several teachers in one command (run it once per teacher).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ..errors import DataError, UsageError

HELP = ("Audit a teacher judge on completions with tests: agreement with the exec reward, "
        "noise, position, comment, dead-code and injection bias.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", required=True, metavar="IN.jsonl",
                   help="Task records with tests and a `completion` field (as for `score`); "
                        "several completions per task, passing and failing, audit best.")
    p.add_argument("--teacher", choices=("anthropic", "openai"), default=None,
                   help="Teacher API (default: the config's reward.teacher.provider).")
    p.add_argument("--base-url", default=None, help="Base URL of an OpenAI-compatible teacher.")
    p.add_argument("--model", default=None, help="Teacher model name.")
    p.add_argument("--repeats", type=int, default=3,
                   help="Judgements of each completion, for the noise (default 3).")
    p.add_argument("--orders", type=int, default=4,
                   help="Rank mode: orders each group is shown in (rotations; the group size "
                        "puts every candidate at every position once). Default 4.")
    p.add_argument("--out", default=None, metavar="REPORT.json", help="Write the report as JSON.")
    p.add_argument("--yes", action="store_true",
                   help="Start without asking, whatever the estimated cost.")
    p.add_argument("--confirm-above", type=float, default=1.0, metavar="USD",
                   help="Ask before starting when the estimated cost is above this (default 1).")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML config to take the teacher and exec settings from.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="Override a config value, e.g. --set reward.teacher.samples=3.")


def overrides(args: argparse.Namespace) -> list[str]:
    sets = [f"reward.teacher.{k}={v}" for k, v in (("provider", args.teacher),
                                                   ("base_url", args.base_url),
                                                   ("model", args.model)) if v]
    return [*sets, *args.overrides]


def run(args: argparse.Namespace) -> int:
    from ..config import check, load
    from ..rewards.exec import ExecReward
    from ..rewards.teacher import audit
    from ..rewards.teacher.startup import check_teacher
    from .score import read_scoring_input

    if args.repeats < 2:
        raise UsageError("--repeats must be at least 2 (the noise is the spread of repeats)")
    if args.orders < 1:
        raise UsageError("--orders must be at least 1")
    cfg = check(load(args.config, overrides(args)))
    tcfg = cfg.reward.teacher
    check_teacher(tcfg)
    _, tasks, completions = read_scoring_input(args.file)
    exec_fn = ExecReward(cfg.reward.exec, languages={t.language for t in tasks})
    try:
        items = audit.prepare(tasks, completions, exec_fn)
    finally:
        exec_fn.close()
    if not items:
        raise DataError(f"{args.file}: no completion has code and an exec verdict: the audit "
                        "needs tasks with tests (see docs/task-formats.md)")
    plan = audit.plan(items, tcfg, args.repeats, args.orders,
                      by_tool=tcfg.provider == "anthropic" and tcfg.structured_output)
    _say(_exec_line(items, len(completions)))
    _say(plan.line())
    if not confirm(plan, args.yes, args.confirm_above, tcfg.base_url, _asker()):
        _say("audit not started")
        return 1
    report = audit_run(items, tcfg, args, plan, len(completions))
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 120).print(render(report))
    print("\n".join(summary_lines(report)), flush=True)  # whole lines; the last: the verdict
    if args.out:
        from .score import write_atomic

        write_atomic(args.out, [json.dumps(report, indent=1, allow_nan=False)])
        _say(f"wrote {args.out}")
    return 0


def audit_run(items: list, tcfg: Any, args: argparse.Namespace, plan: Any,
              n_lines: int) -> dict[str, Any]:
    from ..rewards.teacher import audit, audit_report
    from ..rewards.teacher.reward import TeacherReward
    from ..rewards.teacher.reward import __name__ as reward_log

    # The report counts unscorable judgements and their reasons: no warning per batch.
    logging.getLogger(reward_log).setLevel(logging.ERROR)
    with TeacherReward(tcfg) as teacher:
        obs = audit.run(teacher, items, args.repeats, args.orders)
        used = teacher.metrics()
    meta = {"teacher": _teacher_meta(tcfg), "file": _file_meta(args.file, items, n_lines),
            "calls": _calls_meta(plan, used), "repeats": args.repeats,
            "orders": len(obs.orders) or None}
    return audit_report.build(items, obs, list(teacher.rubric.names), meta)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _exec_line(items: list, n_lines: int) -> str:
    passing = sum(x.passed for x in items)
    kept = sum(len(x.variants) for x in items)
    return (f"exec reward: {len(items)} of {n_lines} completions judged ({passing} pass every "
            f"test), {kept} behaviour-preserving variants kept")


def _asker() -> Callable[[str], str] | None:
    return input if sys.stdin is not None and sys.stdin.isatty() else None


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def confirm(plan: Any, yes: bool, threshold: float, base_url: str,
            ask: Callable[[str], str] | None) -> bool:
    """True to start. Asks (through `ask`) above the threshold, or when the cost is unknown and
    the teacher is not on this machine; with no terminal to ask on, a UsageError naming --yes."""
    unknown = plan.cost_usd is None
    if yes or (unknown and is_loopback(base_url)) or (not unknown and plan.cost_usd <= threshold):
        return True
    what = "unknown" if unknown else f"${plan.cost_usd:.4f}, above --confirm-above " \
                                     f"${threshold:g}"
    if ask is None:
        raise UsageError(f"the audit's estimated cost is {what} and stdin is not a terminal to "
                         "confirm on: pass --yes to start it")
    return ask(f"the estimated cost is {what}: start the audit? [y/N] ").strip().lower() in (
        "y", "yes")


def _teacher_meta(tcfg: Any) -> dict[str, Any]:
    keys = ("provider", "model", "base_url", "mode", "temperature", "samples", "strip_comments",
            "rank_debias", "reference", "structured_output", "max_tokens", "criteria",
            "price_in_per_mtok", "price_out_per_mtok")
    return {k: getattr(tcfg, k) for k in keys}


def _file_meta(path: str, items: list, n_lines: int) -> dict[str, Any]:
    return {"path": path, "lines": n_lines, "judged": len(items),
            "tasks": len({x.task.id for x in items}), "passing": sum(x.passed for x in items)}


def _calls_meta(plan: Any, used: dict[str, float]) -> dict[str, Any]:
    calls = used.get("teacher/calls", 0.0)
    tin, tout = used.get("teacher/input_tokens", 0.0), used.get("teacher/output_tokens", 0.0)
    return {"planned": plan.calls, "estimated_input_tokens": plan.input_tokens,
            "estimated_output_tokens": plan.output_tokens, "estimated_cost_usd": plan.cost_usd,
            "made": int(calls), "cache_hits": int(used.get("teacher/cache_hits", 0.0)),
            "input_tokens": int(tin), "output_tokens": int(tout),
            "cost_usd": used.get("teacher/cost_usd", 0.0),
            "input_tokens_per_call": tin / calls if calls else None,
            "output_tokens_per_call": tout / calls if calls else None,
            "unscorable": int(used.get("teacher/unscorable", 0.0))}


# --- the table ---------------------------------------------------------------------------------


ROWS = (("rank corr. with exec", ("agreement", "spearman"), ".2f"),
        ("failing > passing", ("agreement", "fail_over_pass"), ".0%"),
        ("noise (sd of repeats)", ("noise", "sd"), ".3f"),
        ("position (largest effect)", ("position", "max"), "+.3f"),
        ("comments added", ("comments", "effects"), "+.3f"),
        ("dead code added", ("padding", "effects"), "+.3f"),
        ("locals renamed", ("rename", "effects"), "+.3f"),
        ("injection vs neutral comment", ("injection", "effects"), "+.3f"))


def _value(found: dict[str, Any], path: tuple[str, str], col: str) -> float | None:
    block = found.get(path[0])
    if block is None:
        return None
    v = block[path[1]].get(col)
    return v["mean"] if isinstance(v, dict) else v


def render(report: dict[str, Any]) -> Any:
    """The table (flagged cells marked !, inconclusive ones ?)."""
    from rich.table import Table
    from rich.text import Text

    from ..terminal import visible

    cols, found = report["columns"], report["checks"]
    flagged = {(f["check"], f["column"]) for f in report["flags"]}
    unsure = {(check, col) for check, by_col in report["verdicts"].items()
              for col, v in by_col.items() if v["verdict"] == "inconclusive"}
    t = report["teacher"]
    table = Table(title=f"judge audit: {t['provider']} {t['model']} ({t['mode']}, samples "
                        f"{t['samples']}, temperature {t['temperature']}), "
                        f"{report['file']['judged']} completions of {report['file']['tasks']} "
                        f"tasks", title_justify="left")
    table.add_column("check")
    for col in cols:  # difficulty labels from the task file: control characters escaped
        table.add_column(Text(visible(col, lines=False)), justify="right")  # no markup read
    for label, path, spec in ROWS:
        if found.get(path[0]) is None:
            continue
        cells = []
        for col in cols:
            v = _value(found, path, col)
            bad, unclear = (path[0], col) in flagged, (path[0], col) in unsure
            mark = " !" if bad else " ?" if unclear else ""
            text = "-" if v is None else format(v, spec) + mark
            cells.append(Text(text, style="bold red" if bad else "yellow" if unclear else ""))
        table.add_row(label, *cells)
    return table


def summary_lines(report: dict[str, Any]) -> list[str]:
    from ..rewards.teacher.audit_report import verdict_lines

    c = report["calls"]
    cost = f"${c['cost_usd']:.4f}" if report["teacher"]["price_in_per_mtok"] or \
        report["teacher"]["price_out_per_mtok"] else "cost n/a (no prices set)"
    lines = [f"teacher calls {c['made']} (cache hits {c['cache_hits']}, unscorable "
             f"{c['unscorable']}), tokens in/out {c['input_tokens']:,}/{c['output_tokens']:,}, "
             f"{cost}"]
    cov = report["checks"]["coverage"]
    lines.append(f"usable judgements {cov['scored']}/{cov['judgements']}")
    lines += [f"! {f['check']} ({f['column']}): {f['why']}" for f in report["flags"]]
    return lines + verdict_lines(report)  # the last: the verdict
