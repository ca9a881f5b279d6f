"""How far a judge's scores agree with the exec reward, and how stable they are: pure statistics
shared by the judge audit (teacher/audit.py) and the training metrics of a mixed reward (mix.py).

Covered:
- `spearman`: rank correlation with average ranks for ties (Pearson's r of the ranks); None when
  either side is constant or there are fewer than 2 pairs;
- `fail_over_pass`: over every (passing, failing) pair of completions of the same task, the
  fraction where the judge scores the failing one higher (ties count half: the probability that
  a random failing answer outranks a random passing one, 1 - AUC); None without such pairs;
- `best_disagree`: over groups whose exec values are not all equal, the fraction where none of
  the judge's top-scored completions is among the exec reward's best;
- `paired_effect`: mean, standard error and t of paired differences (a variant minus its
  original); `spread`: the mean standard deviation of repeated judgements;
- `position_effects`: per shown position, the mean residual of a score against the same
  candidate's mean over all orders it was shown in, with its t;
- `passed(reward)`: all tests passed (`details["all_passed"]`, else the `tests` part equal to 1);
- `AgreementWindow`: the last N steps' groups (task id, exec value, passed, judge value) and
  their `teacher/exec_corr`, `teacher/best_disagree`, `teacher/fail_over_pass`,
  `teacher/exec_pairs` metrics.

Not covered: significance of a correlation (the audit flags by effect size and t), weighting
tasks by size (pairs and groups count equally wherever they come from), persistence of the
window across a resume (it starts empty).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..records import Reward


@dataclass(frozen=True)
class Effect:
    """Mean of `n` paired differences, its standard error and t (mean / se; inf when every
    difference is the same non-zero number, 0 when they are all 0)."""

    mean: float
    se: float
    t: float
    n: int


def average_ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties: average ranks)."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    return pearson(average_ranks(xs), average_ranks(ys))


def fail_over_pass(groups: Iterable[Sequence[tuple[float, bool]]]) -> tuple[float | None, int]:
    """(fraction, number of pairs): each group is one task's (judge score, passed) list."""
    worse, pairs = 0.0, 0
    for group in groups:
        good = [s for s, ok in group if ok]
        bad = [s for s, ok in group if not ok]
        for g in good:
            for b in bad:
                pairs += 1
                worse += 1.0 if b > g else 0.5 if b == g else 0.0
    return (worse / pairs if pairs else None), pairs


def best_disagree(groups: Iterable[Sequence[tuple[float, float]]]) -> tuple[float | None, int]:
    """(fraction, number of groups counted): each group is one task's (judge, exec) list."""
    differ, counted = 0, 0
    for group in groups:
        exec_vals = [e for _, e in group]
        if len(group) < 2 or max(exec_vals) == min(exec_vals):
            continue
        counted += 1
        top_judge = max(j for j, _ in group)
        best_exec = max(exec_vals)
        if not any(j == top_judge and e == best_exec for j, e in group):
            differ += 1
    return (differ / counted if counted else None), counted


def paired_effect(diffs: Sequence[float]) -> Effect | None:
    """Mean of paired differences with its standard error (sample sd / sqrt(n)) and t. The
    differences are rounded to 12 decimals first, so float rounding is not taken for spread."""
    diffs = [round(d, 12) for d in diffs]
    n = len(diffs)
    if n == 0:
        return None
    m = sum(diffs) / n
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    se = sd / math.sqrt(n)
    t = m / se if se > 0 else (0.0 if m == 0 else math.copysign(math.inf, m))
    return Effect(m, se, t, n)


def sample_sd(xs: Sequence[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def spread(repeats: Iterable[Sequence[float]]) -> float | None:
    """Mean over items of the sample standard deviation of their repeated scores (items with
    fewer than 2 scores are left out)."""
    sds = [s for r in repeats if (s := sample_sd(r)) is not None]
    return sum(sds) / len(sds) if sds else None


def position_effects(calls: Iterable[Sequence[tuple[str, int, float]]]) -> list[Effect | None]:
    """Per position (0-based), the residual score there: each call is a list of (candidate key,
    position shown, score); a candidate's residual is its score minus its mean over every call
    it appears in. Candidates seen in one call only are left out."""
    calls = [list(c) for c in calls]
    seen: dict[str, list[float]] = {}
    for call in calls:
        for key, _, score in call:
            seen.setdefault(key, []).append(score)
    means = {k: sum(v) / len(v) for k, v in seen.items() if len(v) > 1}
    by_pos: dict[int, list[float]] = {}
    for call in calls:
        for key, pos, score in call:
            if key in means:
                by_pos.setdefault(pos, []).append(score - means[key])
    size = max(by_pos, default=-1) + 1
    return [paired_effect(by_pos[p]) if p in by_pos else None for p in range(size)]


def passed(reward: Reward) -> bool:
    """All tests passed (the exec reward's verdict)."""
    if "all_passed" in reward.details:
        return bool(reward.details["all_passed"])
    return reward.parts.get("tests") == 1.0


@dataclass(frozen=True)
class Judged:
    """One completion as both rewards saw it."""

    task_id: str
    exec_value: float
    passed: bool
    judge: float


def group_by_task(items: Iterable[Judged]) -> list[list[Judged]]:
    groups: dict[str, list[Judged]] = {}
    for x in items:
        groups.setdefault(x.task_id, []).append(x)
    return list(groups.values())


def agreement_metrics(items: Sequence[Judged], prefix: str = "teacher/") -> dict[str, float]:
    """`exec_corr` (Spearman over all items), `best_disagree` and `fail_over_pass` (within task
    groups), `exec_pairs` (pass/fail pairs); a key is left out when it is undefined."""
    groups = group_by_task(items)
    corr = spearman([x.judge for x in items], [x.exec_value for x in items])
    worse, pairs = fail_over_pass([[(x.judge, x.passed) for x in g] for g in groups])
    differ, _ = best_disagree([[(x.judge, x.exec_value) for x in g] for g in groups])
    out = {f"{prefix}exec_pairs": float(pairs)}
    for name, value in (("exec_corr", corr), ("fail_over_pass", worse),
                        ("best_disagree", differ)):
        if value is not None:
            out[f"{prefix}{name}"] = float(value)
    return out


class AgreementWindow:
    """The judged completions of the last `steps` batches, for the divergence metrics."""

    def __init__(self, steps: int) -> None:
        self._steps: deque[list[Judged]] = deque(maxlen=max(1, steps))
        self._added = 0

    def add(self, task_ids: Sequence[str], exec_rewards: Sequence[Reward],
            judge_values: Sequence[float | None]) -> None:
        """One batch; pairs where either value is None are left out. Task ids are made unique
        per batch so that the same task in two steps forms two groups."""
        batch, self._added = self._added, self._added + 1
        self._steps.append([
            Judged(f"{batch}:{tid}", e.value, passed(e), j)
            for tid, e, j in zip(task_ids, exec_rewards, judge_values, strict=True)
            if e.value is not None and j is not None])

    def metrics(self) -> dict[str, float]:
        items = [x for step in self._steps for x in step]
        return agreement_metrics(items) if items else {}


def mean_or_none(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def criterion_values(rewards: Sequence[Reward], name: str | None) -> list[float | None]:
    """A criterion's score per reward (`name` None: the value)."""
    return [r.value if name is None else _part(r.parts, name) for r in rewards]


def _part(parts: Mapping[str, float | None], name: str) -> float | None:
    v = parts.get(name)
    return None if v is None else float(v)
