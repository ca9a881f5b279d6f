"""The quality gate of repository tasks, measured per task through the exec reward itself.

Every answer below is scored exactly as training scores a student (ExecReward, the same sandbox,
the same checker), so a task that passes the gate is one the trainer can score:

1. the original definition runs against every candidate check; a check it fails (or one that
   cannot run here, such as a repository test that passes non-plain values) is dropped and
   counted; a task left with no check is dropped;
2. the original must then pass all that is kept (a second run: a task that flips is dropped
   as flaky), and an empty body (`pass`), `return None` and `raise NotImplementedError` must
   each fail;
3. up to `max_mutants` simple mutants of the original (mutate.py) run; the share the checks
   kill (an answer that does not pass every check) is the task's mutation score; a mutant the
   reward could not score is left out of the share. Tasks under `min_score` are dropped, and so
   are tasks with no mutant at all.

Not covered: equivalent mutants (they lower the score; it is a lower bound), nondeterministic
functions that happen to agree twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...records import Reward
from .mutate import blank_bodies, mutants
from .tasks import with_checks

CHUNK = 64  # answers scored per progress line


@dataclass
class Gated:
    kept: list[dict] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)  # reason -> tasks
    checks_dropped: int = 0  # single checks the original failed
    scores: list[float] = field(default_factory=list)  # every measured task's score


def _task(rec: dict):
    from .. import task_from_record

    return task_from_record(rec, rec["id"])


def _passes(r: Reward) -> bool:
    return r.value is not None and r.details.get("passed") == r.details.get("total")


def _fenced(code: str) -> str:
    return "```python\n" + code.rstrip("\n") + "\n```\n"


def keep_passing(rec: dict, r: Reward) -> tuple[dict | None, int]:
    """The record with only the checks the original passed (None: none), and how many went.
    The checker's units are the recorded calls, then the repository's tests, in order."""
    if r.value is None:
        return None, len(rec["calls"]) + len(rec["repo_tests"])
    ok = [t["passed"] for t in r.details.get("tests", [])]
    n = len(rec["calls"])
    calls = [c for c, p in zip(rec["calls"], ok[:n], strict=False) if p]
    tests = [t for t, p in zip(rec["repo_tests"], ok[n:], strict=False) if p]
    lost = len(rec["calls"]) + len(rec["repo_tests"]) - len(calls) - len(tests)
    if not calls and not tests:
        return None, lost
    return with_checks(rec, calls, tests), lost


def gate(records: list[dict], score: Callable[[list, list[str]], list[Reward]],
         max_mutants: int, min_score: float, say: Callable[[str], None] = print) -> Gated:
    """Run the gate over `records` with `score(tasks, completions)` (ExecReward.score)."""
    out = Gated()
    first = score([_task(r) for r in records], [_fenced(r["solution"]) for r in records])
    candidates = []
    for rec, r in zip(records, first, strict=True):
        kept, lost = keep_passing(rec, r)
        out.checks_dropped += lost
        if kept is None:
            out.dropped["the original passes none of its checks"] += 1
        else:
            candidates.append(kept)
    say(f"gate: {len(candidates)} of {len(records)} tasks have checks the original passes "
        f"({out.checks_dropped} checks dropped); running blanks and mutants")
    plan: list[tuple[int, str, str]] = []  # (candidate index, role, code)
    for i, rec in enumerate(candidates):
        plan.append((i, "original", rec["solution"]))
        plan += [(i, "blank", b) for b in blank_bodies(rec["solution"], rec["entry_point"])]
        plan += [(i, "mutant", m) for m in mutants(rec["solution"], rec["entry_point"],
                                                   max_mutants, seed=i)]
    tasks = [_task(rec) for rec in candidates]
    results: list[Reward] = []
    for k in range(0, len(plan), CHUNK):  # in chunks, to say how far it is
        part = plan[k:k + CHUNK]
        results += score([tasks[i] for i, _, _ in part], [_fenced(code) for _, _, code in part])
        say(f"gate: {len(results)} of {len(plan)} answers run")
    by: dict[int, dict[str, list[Reward]]] = {}
    for (i, role, _), r in zip(plan, results, strict=True):
        by.setdefault(i, {"original": [], "blank": [], "mutant": []})[role].append(r)
    for i, rec in enumerate(candidates):
        verdict = judge(by.get(i, {"original": [], "blank": [], "mutant": []}), min_score)
        if verdict["score"] is not None:
            out.scores.append(verdict["score"])
        if verdict["dropped"]:
            out.dropped[verdict["dropped"]] += 1
            continue
        out.kept.append({**rec, "gate": verdict["gate"]})
    return out


def judge(runs: dict[str, list[Reward]], min_score: float) -> dict[str, Any]:
    """The gate's verdict on one task from its runs (pure)."""
    if not runs["original"] or not all(_passes(r) for r in runs["original"]):
        return {"dropped": "flaky: the original failed a second run", "score": None}
    if any(_passes(r) for r in runs["blank"]) or any(r.value is None for r in runs["blank"]):
        return {"dropped": "an empty body passes (or cannot be scored)", "score": None}
    scored = [r for r in runs["mutant"] if r.value is not None]
    if not scored:
        return {"dropped": "no mutant to measure the checks with", "score": None}
    killed = sum(not _passes(r) for r in scored)
    score = killed / len(scored)
    gate_info = {"mutation_score": round(score, 4), "mutants": len(scored), "killed": killed,
                 "blank_bodies_fail": True, "original_passes": True}
    if score < min_score:
        return {"dropped": f"mutation score under {min_score:g}", "score": score,
                "gate": gate_info}
    return {"dropped": None, "score": score, "gate": gate_info}


def distribution(scores: list[float]) -> dict[str, Any]:
    """Counts per tenth of the mutation score, and min / median / mean."""
    if not scores:
        return {"n": 0}
    s = sorted(scores)
    bins = Counter(min(int(x * 10), 9) for x in s)
    return {"n": len(s), "min": round(s[0], 3), "median": round(s[len(s) // 2], 3),
            "mean": round(sum(s) / len(s), 3),
            "histogram": {f"{k / 10:.1f}-{(k + 1) / 10:.1f}": bins.get(k, 0) for k in range(10)}}
