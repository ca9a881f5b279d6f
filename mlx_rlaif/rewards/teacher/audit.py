"""The judge audit: how far the configured teacher measures what the exec reward measures, how
noisy it is, and which biases it has (`mlx-rlaif audit-judge`).

On a file of completions with tests (the `score` input: task record + `completion`):
1. `prepare`: the exec reward scores every completion and its behaviour-preserving variants
   (variants.py: comments, dead code, renamed locals, a reviewer-addressed injection and a
   neutral comment of the same length); a variant is kept only when it passes and fails exactly
   as its original (same exec value and verdict). Empty completions are left out.
2. `plan`: the calls the audit will make (no cache hits assumed; an answer that cannot be used
   is not cached and is asked again by the next batch that needs it, so a broken judge takes
   a few more) and their estimated cost: input tokens ~ characters / 3 of the prompts it will
   send (the local tiny-coder server measured 2.7 characters per token on its 4,096-token
   vocabulary; large-vocabulary tokenizers take fewer tokens), output tokens at `max_tokens`.
3. `run`: the teacher judges, through `TeacherReward` as configured (samples, strip_comments,
   references): absolute and ratio modes score the originals `repeats` times (fresh samples
   each time) and each kind of variant once; rank mode judges each task's group in its own order
   `repeats` times, in `orders` rotations (each candidate at each position once when `orders`
   is the group size), and each kind of variant in two groups where every other candidate is
   replaced by its variant (so a variant is always judged next to originals).
4. `report`: per criterion and overall, pure statistics (agreement.py): rank correlation with
   the exec value and the failing-over-passing rate (on the mean over repeats, in rank mode over
   orders), noise (the mean sd over repeats), position effects (rank mode), and the mean paired
   effect of each kind of variant (injection: against the neutral comment), with flags.

Flags (`Thresholds`): fewer than 90% of the judgements usable (parsed, in range); agreement on
`overall` and `correctness` (rank correlation below 0.3, failing above passing in more than 20%
of the pairs); noise (sd above 0.05). The position, comment, dead-code and injection probes get
a verdict per column from a 95% interval on their effect (audit_verdict.py): flagged (the
interval lies beyond the 0.05 threshold: on `overall` a raise of at least 0.05, on
`correctness` a change of 0.05 either way), clean (inside it), or inconclusive (it spans the
threshold: with how many completions would decide it); renaming is judged on correctness only
(opaque names may fairly cost quality points). The report's last line states the verdict.

Not covered: variants of C++/Rust beyond comments and the injection (variants.py), significance
of a correlation, tasks without tests (their completions have no exec verdict: left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...records import Reward, Task, extract_code, group_indices
from .. import agreement as stats
from ..base import RewardFn
from . import judge
from .position import rotation
from .reward import TeacherReward
from .variants import KINDS, fenced, make_variants

PROBES = ("comments", "padding", "rename", "injection")
CHARS_PER_TOKEN = 3.0


@dataclass(frozen=True)
class Thresholds:
    min_corr: float = 0.3
    max_fail_over_pass: float = 0.2
    max_noise_sd: float = 0.05
    min_effect: float = 0.05  # the probes' threshold (audit_verdict.py)
    level: float = 0.95  # the probes' confidence intervals
    min_scored: float = 0.9


@dataclass
class Item:
    """One completion of the file, with its exec verdict and the variants that kept it."""

    task: Task
    completion: str
    code: str
    exec: Reward
    variants: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return stats.passed(self.exec)


# --- 1. exec ---------------------------------------------------------------------------------


def prepare(tasks: Sequence[Task], completions: Sequence[str], exec_fn: RewardFn) -> list[Item]:
    """Items with an exec verdict, each with the variants that behave as it does."""
    items = [Item(t, c, extract_code(c, t.language), Reward(None))
             for t, c in zip(tasks, completions, strict=True)]
    items = [x for x in items if x.code.strip()]
    made = [make_variants(x.code, x.task.language, x.task.prompt) for x in items]
    pairs = [(x.task, x.completion) for x in items]
    pairs += [(x.task, fenced(code, x.task.language))
              for x, m in zip(items, made, strict=True) for code in m.values()]
    scored = iter(exec_fn.score([t for t, _ in pairs], [c for _, c in pairs]))
    for x in items:
        x.exec = next(scored)
    for x, m in zip(items, made, strict=True):
        for kind, code in m.items():
            got = next(scored)
            if _same(x.exec, got):
                x.variants[kind] = fenced(code, x.task.language)
            else:
                x.dropped[kind] = f"behaviour changed (exec {_v(x.exec)} -> {_v(got)})"
        x.dropped.update({k: "not applicable" for k in KINDS if k not in m})
    return [x for x in items if x.exec.value is not None]


def _same(a: Reward, b: Reward) -> bool:
    return (a.value is not None and b.value is not None and abs(a.value - b.value) < 1e-9
            and stats.passed(a) == stats.passed(b))


def _v(r: Reward) -> str:
    return "None" if r.value is None else f"{r.value:.2f}"


# --- 2. plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: no prices configured

    def line(self) -> str:
        cost = ("cost unknown (set reward.teacher.price_in_per_mtok/price_out_per_mtok)"
                if self.cost_usd is None else f"estimated cost ${self.cost_usd:.4f}")
        return (f"the audit makes {self.calls} teacher calls (fewer with cache hits), "
                f"~{self.input_tokens:,} input tokens and up to {self.output_tokens:,} output "
                f"tokens (max_tokens per call): {cost}")


def groups_of(items: Sequence[Item]) -> list[list[int]]:
    """Indices of each task's items, tasks in first-seen order."""
    return list(group_indices([x.task.id for x in items]).values())


def plan(items: Sequence[Item], reward_cfg: Any, repeats: int, orders: int,
         by_tool: bool = True) -> Plan:
    """The calls `run` makes (no cache hits assumed) and their estimated tokens."""
    rubric = judge.rubric_from_config(reward_cfg.criteria)
    views = judge.views(rubric, reward_cfg.strip_comments)
    per = reward_cfg.samples
    chars: list[int] = []  # one entry per call: its prompt's characters
    for g in groups_of(items):
        task = items[g[0]].task
        if reward_cfg.reference or reward_cfg.mode == "ratio":
            system, user = judge.reference_messages(task.prompt, task.language)
            longest = max(len(items[i].code) for i in g)
            chars.append(len(system) + len(user))
            chars += [_judge_chars(v, task, items[g[0]].code, by_tool) + longest
                      for v in views] * per
        for calls, codes in _group_calls(items, g, reward_cfg.mode, repeats, orders):
            for v in views:
                size = (_rank_chars(v, task, codes, by_tool) if reward_cfg.mode == "rank"
                        else _judge_chars(v, task, codes[0], by_tool))
                chars += [size] * (calls * per)
    cost = None
    out_tokens = len(chars) * reward_cfg.max_tokens
    in_tokens = int(sum(chars) / CHARS_PER_TOKEN)
    if reward_cfg.price_in_per_mtok or reward_cfg.price_out_per_mtok:
        cost = (in_tokens * reward_cfg.price_in_per_mtok
                + out_tokens * reward_cfg.price_out_per_mtok) / 1e6
    return Plan(len(chars), in_tokens, out_tokens, cost)


def _group_calls(items: Sequence[Item], g: list[int], mode: str, repeats: int,
                 orders: int) -> list[tuple[int, list[str]]]:
    """(number of calls, the codes one call shows) for a task's group."""
    if mode != "rank":
        out = [(repeats, [items[i].code]) for i in g]
        return out + [(1, [items[i].variants[k]]) for i in g for k in items[i].variants]
    codes = [items[i].code for i in g]
    n_orders = max(1, min(orders, len(g)))
    out = [(repeats + n_orders - 1, codes)]
    for kind in KINDS:
        for parity in (0, 1):
            mixed = _mixed(items, g, kind, parity)
            if mixed is not None:
                out.append((1, [extract_code(c, items[g[0]].task.language) for c in mixed]))
    return out


def _judge_chars(view: judge.View, task: Task, code: str, by_tool: bool) -> int:
    return (len(judge.judge_system(view.rubric, by_tool, view.stripped))
            + len(judge.judge_user(view.rubric, task.prompt, task.language, code)))


def _rank_chars(view: judge.View, task: Task, codes: list[str], by_tool: bool) -> int:
    return (len(judge.rank_system(view.rubric, by_tool, view.stripped))
            + len(judge.rank_user(view.rubric, task.prompt, task.language, codes)))


def _mixed(items: Sequence[Item], g: list[int], kind: str, parity: int) -> list[str] | None:
    """The group's completions with every other one (index parity) replaced by its `kind`
    variant; None when no candidate of that parity has one."""
    out, swapped = [], False
    for k, i in enumerate(g):
        if k % 2 == parity and kind in items[i].variants:
            out.append(items[i].variants[kind])
            swapped = True
        else:
            out.append(items[i].completion)
    return out if swapped else None


# --- 3. run ----------------------------------------------------------------------------------


@dataclass
class Observed:
    """The teacher's rewards: `repeats[r][i]` (identity order in rank mode), `orders[k][i]`
    (rank mode: rotation k, where the j-th candidate of a group is shown at position
    (j - k) mod n), `variants[kind][i]` (None where item i has no such variant)."""

    repeats: list[list[Reward | None]]
    orders: list[list[Reward | None]]
    variants: dict[str, list[Reward | None]]


def run(teacher: TeacherReward, items: Sequence[Item], repeats: int, orders: int) -> Observed:
    if teacher.cfg.mode == "rank":
        return _run_rank(teacher, items, repeats, orders)
    tasks = [x.task for x in items]
    reps = [teacher.score(tasks, [x.completion for x in items], repeat=r) for r in range(repeats)]
    variants: dict[str, list[Reward | None]] = {}
    for kind in KINDS:
        idx = [i for i, x in enumerate(items) if kind in x.variants]
        got = teacher.score([tasks[i] for i in idx], [items[i].variants[kind] for i in idx])
        variants[kind] = _spread(len(items), idx, got)
    return Observed(reps, [], variants)


def _spread(n: int, idx: list[int], got: list[Reward]) -> list[Reward | None]:
    out: list[Reward | None] = [None] * n
    for i, r in zip(idx, got, strict=True):
        out[i] = r
    return out


def _run_rank(teacher: TeacherReward, items: Sequence[Item], repeats: int,
              orders: int) -> Observed:
    groups = groups_of(items)
    ident = [(items[g[0]].task, [items[i].completion for i in g], tuple(range(len(g))))
             for g in groups]
    reps = [_ungroup(len(items), groups, teacher.score_orders(ident, repeat=r))
            for r in range(repeats)]
    rots = []
    for k in range(max(1, min(orders, max(len(g) for g in groups)))):
        todo = [(g, (t, c, rotation(len(c), k))) for g, (t, c, _) in zip(groups, ident,
                                                                        strict=True)
                if k < max(1, min(orders, len(g)))]  # each group: at most its size
        got = teacher.score_orders([req for _, req in todo])
        rots.append(_ungroup(len(items), [g for g, _ in todo], got))
    variants = {kind: _rank_variants(teacher, items, groups, kind) for kind in KINDS}
    return Observed(reps, rots, variants)


def _rank_variants(teacher: TeacherReward, items: Sequence[Item], groups: list[list[int]],
                   kind: str) -> list[Reward | None]:
    """Each group twice, every other candidate replaced by its `kind` variant."""
    out: list[Reward | None] = [None] * len(items)
    for parity in (0, 1):
        todo = [(g, mixed) for g in groups
                if (mixed := _mixed(items, g, kind, parity)) is not None]
        req = [(items[g[0]].task, mixed, tuple(range(len(g)))) for g, mixed in todo]
        for (g, _), got in zip(todo, teacher.score_orders(req) if req else [], strict=True):
            for k, i in enumerate(g):
                if k % 2 == parity and kind in items[i].variants:
                    out[i] = got[k]
    return out


def _ungroup(n: int, groups: list[list[int]], per_group: list[list[Reward]]
             ) -> list[Reward | None]:
    """Per item, its reward from the group it was judged in (None: not in these groups)."""
    out: list[Reward | None] = [None] * n
    for g, got in zip(groups, per_group, strict=True):
        for i, r in zip(g, got, strict=True):
            out[i] = r
    return out
