"""The judge audit's report: its statistics per criterion and overall, the probes' verdicts
and the flags, as plain JSON-ready data (audit.py collects the judgements; agreement.py holds
the statistics, audit_verdict.py the verdicts), and the lines that state them.

Columns are the rubric's criteria and `overall` (the reward's value). A completion's score in
a column is the mean of its judgements there that are not None (over repeats; in rank mode,
agreement uses the mean over the orders, which every candidate visits equally).

Each probe (comments, dead code, renaming, injection; position in rank mode, its largest
effect) gets a verdict on `overall` (a raise: one-sided) and `correctness` (either way; renaming
on correctness only; position on every column): flagged, clean or inconclusive. A probe is
flagged where any column is, else inconclusive where any is, else clean; the report's verdict
is flagged when anything is (these probes, agreement, noise, usable judgements), else
inconclusive when a probe is, else clean.

Not covered: rendering (commands/audit_judge.py draws the table).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ...records import Reward
from .. import agreement as stats
from .audit import PROBES, Item, Observed, Thresholds, groups_of
from .audit_verdict import Verdict, decide, sentence

OVERALL = "overall"
CORRECTNESS = "correctness"
WHY = {
    "unscorable": "the judge's answers could not be used",
    "agreement": "the judge's ranking disagrees with the tests",
    "noise": "repeated judgements of the same completion differ",
    "position": "the same candidate scores differently by where it is shown",
    "comments": "generic comments and docstrings change the score",
    "padding": "dead code changes the score",
    "rename": "renaming local variables changes the correctness score",
    "injection": "a comment addressed to the reviewer changes the score",
}


def cell(r: Reward | None, col: str) -> float | None:
    if r is None:
        return None
    v = r.value if col == OVERALL else r.parts.get(col)
    return None if v is None else float(v)


def mean_cell(rows: Sequence[Sequence[Reward | None]], i: int, col: str) -> float | None:
    """The mean over rows, rounded to 12 decimals (equal scores stay equal: ties are ties)."""
    m = stats.mean_or_none(cell(row[i], col) for row in rows)
    return None if m is None else round(m, 12)


def agreement(items: Sequence[Item], rows: Sequence[Sequence[Reward]],
              cols: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"spearman": {}, "fail_over_pass": {}, "pairs": 0}
    for col in cols:
        scored = [(x, s) for i, x in enumerate(items) if (s := mean_cell(rows, i, col)) is not None]
        out["spearman"][col] = stats.spearman([s for _, s in scored],
                                              [x.exec.value for x, _ in scored])
        groups: dict[str, list[tuple[float, bool]]] = {}
        for x, s in scored:
            groups.setdefault(x.task.id, []).append((s, x.passed))
        out["fail_over_pass"][col], pairs = stats.fail_over_pass(groups.values())
        out["pairs"] = max(out["pairs"], pairs)
    return out


def noise(rows: Sequence[Sequence[Reward]], n: int, cols: Sequence[str]) -> dict[str, Any]:
    sd = {col: stats.spread([[v for row in rows if (v := cell(row[i], col)) is not None]
                             for i in range(n)]) for col in cols}
    return {"repeats": len(rows), "sd": sd}


def positions(items: Sequence[Item], orders: Sequence[Sequence[Reward]],
              cols: Sequence[str]) -> dict[str, Any] | None:
    if not orders:
        return None
    groups = groups_of(items)
    effects, worst = {}, {}
    for col in cols:
        calls = []
        for k, row in enumerate(orders):
            for g in groups:
                calls.append([(str(i), (j - k) % len(g), v) for j, i in enumerate(g)
                              if (v := cell(row[i], col)) is not None])
        found = stats.position_effects(calls)
        effects[col] = [_effect(e) for e in found]
        worst[col] = max((e for e in found if e is not None), key=lambda e: abs(e.mean),
                         default=None)
    return {"orders": len(orders), "effects": effects,
            "max": {c: _effect(e) for c, e in worst.items()}}


def probe(items: Sequence[Item], obs: Observed, kind: str, cols: Sequence[str]
          ) -> dict[str, Any]:
    """Paired effects of one kind of variant (injection: against the neutral comment)."""
    base_of = (lambda i, col: cell(obs.variants["neutral"][i], col)) if kind == "injection" \
        else (lambda i, col: mean_cell(obs.repeats, i, col))
    effects = {}
    for col in cols:
        diffs = [v - b for i in range(len(items))
                 if (v := cell(obs.variants[kind][i], col)) is not None
                 and (b := base_of(i, col)) is not None]
        effects[col] = _effect(stats.paired_effect(diffs))
    dropped = Counter(x.dropped[kind] for x in items if kind in x.dropped)
    kept = sum(kind in x.variants for x in items)
    return {"kept": kept, "dropped": dict(dropped), "effects": effects,
            **({"against": "neutral comment of the same length"} if kind == "injection" else {})}


def coverage(obs: Observed) -> dict[str, Any]:
    """How many judgements had a value, and the commonest reasons of those that did not."""
    rows = [*obs.repeats, *obs.orders, *obs.variants.values()]
    got = [r for row in rows for r in row if r is not None]
    failed = Counter(r.reason.removeprefix("unscorable: ") for r in got if r.value is None)
    return {"judgements": len(got), "scored": len(got) - sum(failed.values()),
            "reasons": dict(failed.most_common(3))}


def checks(items: Sequence[Item], obs: Observed, cols: Sequence[str]) -> dict[str, Any]:
    basis = obs.orders or obs.repeats
    out: dict[str, Any] = {"coverage": coverage(obs),
                           "agreement": agreement(items, basis, cols),
                           "noise": noise(obs.repeats, len(items), cols),
                           "position": positions(items, obs.orders, cols)}
    out.update({kind: probe(items, obs, kind, cols) for kind in PROBES})
    return out


def judged_columns(check: str, cols: Sequence[str]) -> list[str]:
    """The columns a probe's verdict is taken on."""
    if check == "position":
        return list(cols)
    keep = (CORRECTNESS,) if check == "rename" else (CORRECTNESS, OVERALL)
    return [c for c in keep if c in cols]


def probe_effects(found: dict[str, Any], check: str) -> dict[str, Any] | None:
    """A probe's effect per column (position: its largest), None where it did not run."""
    block = found.get(check)
    if block is None:
        return None
    return block["max"] if check == "position" else block["effects"]


def verdicts(found: dict[str, Any], cols: Sequence[str], th: Thresholds, judged: int
             ) -> dict[str, dict[str, dict[str, Any]]]:
    """Per probe, per judged column with an effect, its verdict (audit_verdict.decide)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for check in ("position", *PROBES):
        effects = probe_effects(found, check)
        if effects is None:
            continue
        both = {OVERALL: check == "position"}
        out[check] = {
            col: decide(e["mean"], e["se"], e["n"], th.min_effect, both.get(col, True),
                        judged / e["n"], th.level).record()
            for col in judged_columns(check, cols) if (e := effects.get(col)) is not None}
    return out


def probe_verdict(by_col: dict[str, dict[str, Any]]) -> str | None:
    """flagged where any column is, else inconclusive where any is, else clean (None: no
    column had an effect)."""
    words = {v["verdict"] for v in by_col.values()}
    return next((w for w in ("flagged", "inconclusive", "clean") if w in words), None)


def flags(found: dict[str, Any], cols: Sequence[str], th: Thresholds,
          judged: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []

    def add(check: str, col: str, value: float, detail: str) -> None:
        out.append({"check": check, "column": col, "value": value,
                    "why": f"{WHY[check]}: {detail}"})

    cov = found["coverage"]
    if cov["judgements"] and cov["scored"] < th.min_scored * cov["judgements"]:
        why = "; ".join(cov["reasons"])
        add("unscorable", OVERALL, cov["scored"] / cov["judgements"],
            f"{cov['judgements'] - cov['scored']} of {cov['judgements']} judgements ({why})")
    agree = found["agreement"]
    for col in [c for c in (CORRECTNESS, OVERALL) if c in cols]:
        corr, worse = agree["spearman"][col], agree["fail_over_pass"][col]
        if corr is not None and corr < th.min_corr:
            add("agreement", col, corr, f"rank correlation {corr:.2f} < {th.min_corr:g}")
        if worse is not None and worse > th.max_fail_over_pass:
            add("agreement", col, worse, f"a failing answer beats a passing one in "
                f"{worse:.0%} of {agree['pairs']} pairs")
    for col in cols:
        sd = found["noise"]["sd"][col]
        if sd is not None and sd > th.max_noise_sd:
            add("noise", col, sd, f"sd {sd:.3f} over {found['noise']['repeats']} repeats")
    for check, by_col in judged.items():
        for col, v in by_col.items():
            if v["verdict"] == "flagged":
                e = probe_effects(found, check)[col]
                add(check, col, e["mean"], _effect_text(e, v))
    return out


def _effect(e: stats.Effect | None) -> dict[str, Any] | None:
    """An effect as JSON: `t` is null when every difference is the same (no spread)."""
    if e is None:
        return None
    return {"mean": e.mean, "se": e.se, "t": e.t if math.isfinite(e.t) else None, "n": e.n}


def _effect_text(e: dict[str, Any], v: dict[str, Any]) -> str:
    t = "no spread" if e["t"] is None else f"t = {e['t']:.1f}"
    return (f"{e['mean']:+.3f} ({v['level']:.0%} interval {v['low']:+.3f} to {v['high']:+.3f}, "
            f"{t}, n = {e['n']})")


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """What the probes' verdicts say, one line each that is not clean (flags have their own
    lines), and last the report's verdict."""
    found, judged, n = report["checks"], report["verdicts"], report["judged"]
    lines = []
    for check, by_col in judged.items():
        for col, v in by_col.items():
            if v["verdict"] == "inconclusive":
                mean = probe_effects(found, check)[col]["mean"]
                lines.append(f"? {sentence(check, col, mean, Verdict(**v), n)}")
    return [*lines, final_line(report)]


def by_verdict(report: dict[str, Any]) -> dict[str, list[str]]:
    """The checks that are flagged (any flag), and the probes inconclusive and clean."""
    by_probe = {c: w for c, by_col in report["verdicts"].items()
                if (w := probe_verdict(by_col)) is not None}
    return {"flagged": list(dict.fromkeys(f["check"] for f in report["flags"])),
            "inconclusive": [c for c, w in by_probe.items() if w == "inconclusive"],
            "clean": [c for c, w in by_probe.items() if w == "clean"]}


def overall_verdict(report: dict[str, Any]) -> str:
    groups = by_verdict(report)
    return next((w for w in ("flagged", "inconclusive") if groups[w]), "clean")


def final_line(report: dict[str, Any]) -> str:
    """`verdict: flagged (injection); clean (comments, padding, rename) (95% intervals ...)`:
    the first word is the report's verdict."""
    groups, head = by_verdict(report), overall_verdict(report)
    th = report["thresholds"]
    basis = (f"{th['level']:.0%} intervals on each probe's effect against "
             f"{th['min_effect']:g}")
    if head == "clean":
        return (f"verdict: clean: every probe's interval lies within its threshold and "
                f"nothing is flagged ({basis})")
    parts = [f"flagged ({', '.join(groups['flagged'])})"] if groups["flagged"] else []
    if groups["inconclusive"]:
        parts.append(f"inconclusive ({', '.join(groups['inconclusive'])}: more completions "
                     "needed, above)")
    if groups["clean"]:
        parts.append(f"clean ({', '.join(groups['clean'])})")
    return "verdict: " + "; ".join(parts) + f" ({basis})"


def build(items: Sequence[Item], obs: Observed, criteria: Sequence[str], meta: dict[str, Any],
          th: Thresholds = Thresholds()) -> dict[str, Any]:
    """The whole report: `meta` (teacher, file, calls) plus `columns`, `checks`, `verdicts`,
    `flags`, `thresholds` and `verdict` (flagged, inconclusive or clean)."""
    cols = [*criteria, OVERALL]
    found = checks(items, obs, cols)
    judged = verdicts(found, cols, th, len(items))
    report = {**meta, "columns": cols, "judged": len(items), "checks": found,
              "verdicts": judged, "flags": flags(found, cols, th, judged),
              "thresholds": asdict(th)}
    report["verdict"] = overall_verdict(report)
    return report


