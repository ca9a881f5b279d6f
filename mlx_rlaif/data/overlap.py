"""Overlap between two task sets (training vs. evaluation): n-gram overlap of the prompts and of
the reference solutions, and exact-duplicate tests. A training task that overlaps an evaluation
task inflates every gain measured on it; `mlx-rlaif data overlap` reports them and
`data.decontaminate_against` drops them at load.

Text is lower-cased and split into tokens (runs of letters, digits and `_`, and each other
non-space character), then into n-grams of `n` tokens (a text shorter than `n` tokens is one
gram of all of them). The score of a pair is the share of the shorter text's tokens that lie in
an n-gram the other text also has: 1.0 when one text contains the other; for a near-duplicate,
about the share of its tokens outside the edits (a changed word uncovers only itself when the
unchanged runs around it are at least `n` tokens long); 0 for texts that share no run of `n`
tokens, so common openings ("write a function that takes") count for nothing. A training task
is flagged against its best-scoring evaluation task when that score reaches `threshold`,
separately for the prompt and the reference solution (`solution`, where the task has one).
Tests are flagged when both tasks' whole tests are equal after normalizing whitespace (`test`)
or key order (`tests`).

Not covered: semantic duplicates (the same problem reworded entirely), overlap inside one set.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..records import Task

FIELDS = ("prompt", "solution", "tests")
_TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Match:
    """Training task `train_id` overlaps evaluation task `eval_id` in `field` with `score`."""

    train_id: str
    eval_id: str
    field: str
    score: float


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def ngrams(text: str, n: int) -> frozenset[tuple[str, ...]]:
    return gram_set(tokens(text), n)


def gram_set(toks: list[str], n: int) -> frozenset[tuple[str, ...]]:
    if len(toks) < n:
        return frozenset([tuple(toks)]) if toks else frozenset()
    return frozenset(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


def coverage(toks: list[str], other: frozenset[tuple[str, ...]], n: int) -> float:
    """The share of `toks` lying in an n-gram that `other` (a gram set) also has."""
    if len(toks) < n:
        return float(tuple(toks) in other) if toks else 0.0
    covered = [False] * len(toks)
    for i in range(len(toks) - n + 1):
        if tuple(toks[i:i + n]) in other:
            covered[i:i + n] = [True] * n
    return sum(covered) / len(toks)


def pair_score(a: list[str], ga: frozenset, b: list[str], gb: frozenset, n: int) -> float:
    """Coverage of the shorter text by the other one's n-grams."""
    return coverage(a, gb, n) if len(a) <= len(b) else coverage(b, ga, n)


def field_text(task: Task, field: str) -> str:
    if field == "prompt":
        return task.prompt
    solution = task.meta.get("solution")
    return solution if isinstance(solution, str) else ""


def tests_key(task: Task) -> str | None:
    """The task's whole tests, normalized; None without tests."""
    if task.test:
        return " ".join(task.test.split())
    if task.tests:
        return json.dumps(list(task.tests), sort_keys=True)
    return None


def best_matches(train: Sequence[Task], evals: Sequence[Task], field: str, n: int,
                 threshold: float) -> list[Match]:
    """For each training task, its best-scoring evaluation task in `field`, if at threshold."""
    etoks = [tokens(field_text(t, field)) for t in evals]
    egrams = [gram_set(t, n) for t in etoks]
    index: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for j, g in enumerate(egrams):
        for gram in g:
            index[gram].append(j)
    out = []
    for task in train:
        toks = tokens(field_text(task, field))
        mine = gram_set(toks, n)
        hits = Counter(j for gram in mine for j in index.get(gram, ()))
        # a score >= threshold needs at least threshold * (shorter length) / n shared grams
        scored = [(pair_score(toks, mine, etoks[j], egrams[j], n), j) for j, shared in hits.items()
                  if shared * n >= threshold * min(len(toks), len(etoks[j]))]
        if scored:
            score, j = max(scored, key=lambda sj: (sj[0], -sj[1]))
            if score >= threshold:
                out.append(Match(task.id, evals[j].id, field, round(score, 4)))
    return out


def duplicate_tests(train: Sequence[Task], evals: Sequence[Task]) -> list[Match]:
    first: dict[str, str] = {}
    for t in evals:
        key = tests_key(t)
        if key is not None:
            first.setdefault(key, t.id)
    return [Match(t.id, first[k], "tests", 1.0) for t in train
            if (k := tests_key(t)) is not None and k in first]


def find_overlaps(train: Sequence[Task], evals: Sequence[Task], n: int = 8,
                  threshold: float = 0.5) -> list[Match]:
    """Every flagged (training task, field) pair, in training order."""
    found = (best_matches(train, evals, "prompt", n, threshold)
             + best_matches(train, evals, "solution", n, threshold)
             + duplicate_tests(train, evals))
    order = {t.id: i for i, t in enumerate(train)}
    return sorted(found, key=lambda m: (order[m.train_id], FIELDS.index(m.field)))


def report(train: Sequence[Task], evals: Sequence[Task], matches: Sequence[Match], n: int,
           threshold: float) -> dict:
    """The JSON report of `data overlap`."""
    by_field = {f: sum(m.field == f for m in matches) for f in FIELDS}
    return {"n": n, "threshold": threshold, "train_tasks": len(train), "eval_tasks": len(evals),
            "flagged_train_tasks": len({m.train_id for m in matches}), "by_field": by_field,
            "matches": [asdict(m) for m in matches]}


def decontaminate(tasks: Sequence[Task], against: Sequence[Task], n: int = 8,
                  threshold: float = 0.5) -> tuple[list[Task], list[Match]]:
    """The training tasks that overlap none of `against`, and the matches of those dropped."""
    matches = find_overlaps(tasks, against, n, threshold)
    dropped = {m.train_id for m in matches}
    return [t for t in tasks if t.id not in dropped], matches
