"""The reward as a list of components: built-in rewards (exec, teacher, syntax), your
functions and reward servers, combined into one value per completion.

Each component has a name (its metric key), a weight (0: computed and logged, never trained
on) and scores the whole batch once per call of `score` (never again for the metrics). The
built-ins run first, concurrently; the exec reward's result of each completion is then passed
to the functions and servers, which run concurrently too. A completion's value is the weighted
sum of its trained components that are not None (`aggregation: sum`), or of each component
standardized within the prompt's group first (`normalize`: (v - mean) / std over the group's
values that are not None, 0 where they do not vary); None when every trained component is None
(unscorable: advantage 0, counted as reward/frac_none). Its parts are each component's value
and named parts (`format`, `judge/correctness`, ...).

Each value, each weighted value (`weighed`) and each completion's total are held to
|v| <= contract.MAX_REWARD (1e100): past it (or not finite) the weighted value is an error of
its component like NaN, and the total one naming the components (stop: RewardError; unscorable:
the completion's value None), so no reward makes the advantages or the loss NaN.
A function's error, timeout or a value the contract refuses either raises RewardError at once
(`on_error: stop`, naming the component, the task and the traceback's last line; the step
stops before its update) or makes that completion's value None for that component
(`unscorable`), counted, with RewardError once more than `max_error_frac` of a batch errs.
Either way the batch is given up on as soon as the bound is passed (stop: the first failure):
the function's calls still out are cancelled and their workers killed (pool.py), so a function
that hangs on every call ends the step after about one `timeout_s`.
Per component, `metrics()` reports reward/<name>/mean, std, frac_none, errors, timeouts and
seconds since its last call (the step's), and the built-ins' own metrics. Only batches scored
for a training step count (the trainer sets `step` before it scores; `metrics()` clears it):
the held-out evaluations' completions are scored the same way but stay out of the step's
statistics.

Not covered: per-task weights, components that depend on each other beyond the exec result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import RewardError
from ...records import Reward, Task, group_indices
from ..base import RewardFn
from .contract import (
    MAX_REWARD,
    ValueProblem,
    as_lists,
    check_list,
    check_value,
    exec_summary,
    shown,
    units,
)
from .pool import GiveUp, Outcome

Scorer = Callable[[list[dict[str, Any]], int, GiveUp | None], list[Outcome]]


@dataclass
class Custom:
    """A function or server component: `scorer(units, step, give_up)` gives one outcome per
    unit (give_up: pool.run's); a function of lists gets one unit per batch (or per group:
    `group`)."""

    name: str
    weight: float
    scorer: Scorer
    what: str  # how errors name it: the spec or the URL
    batched: bool = False
    group: bool = False
    timeout_s: float = 0.0
    close: Callable[[], None] = lambda: None
    server: bool = False  # a timeout is the request's (nothing to kill)


@dataclass
class _Tally:
    values: list[float] = field(default_factory=list)
    none: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Scored:
    """One component's result for one completion."""

    value: float | None
    parts: dict[str, float | None]
    reason: str = ""
    details: dict | None = None


class ComponentsReward:
    name = "components"
    whole_step = True  # scored once per batch: the trainer does not score group by group

    def __init__(self, builtins: Sequence[tuple[str, float, RewardFn]],
                 customs: Sequence[Custom], aggregation: str = "sum", on_error: str = "stop",
                 max_error_frac: float = 0.1) -> None:
        self.builtins, self.customs = list(builtins), list(customs)
        self.parts = [(fn, w) for _, w, fn in self.builtins]  # multiturn finds the exec here
        self.names = [n for n, _, _ in self.builtins] + [c.name for c in self.customs]
        self.weights = [w for _, w, _ in self.builtins] + [c.weight for c in self.customs]
        self.aggregation, self.on_error, self.max_error_frac = aggregation, on_error, \
            max_error_frac
        self.step: int | None = None  # set by the training step: its batches are counted
        self._tally = {n: _Tally() for n in self.names}
        self._pool = ThreadPoolExecutor(max(1, len(self.names)), thread_name_prefix="reward")

    # scoring ------------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]:
        tasks, completions = list(tasks), list(completions)
        built = [self._pool.submit(self._builtin, n, fn, tasks, completions)
                 for n, _, fn in self.builtins]
        raw = [f.result() for f in built]
        per: list[list[_Scored]] = [[_Scored(r.value, dict(r.parts), r.reason, dict(r.details))
                                     for r in rewards] for rewards in raw]
        exec_rewards = next((rewards for (n, _, fn), rewards in zip(self.builtins, raw,
                                                                    strict=True)
                             if getattr(fn, "name", "") == "exec"), None)
        args = units(tasks, completions, [exec_summary(r) for r in exec_rewards]
                     if exec_rewards else [None] * len(tasks))
        customs = [self._pool.submit(self._custom, c, args, tasks) for c in self.customs]
        per += [f.result() for f in customs]
        return [self._combine(i, per, exec_rewards, tasks) for i in range(len(tasks))]

    def _builtin(self, name: str, fn: RewardFn, tasks: list[Task], completions: list[str]
                 ) -> list[Reward]:
        t0 = time.perf_counter()
        rewards = fn.score(tasks, completions)
        self._count(name, [_Scored(r.value, {}) for r in rewards], 0, 0,
                    time.perf_counter() - t0)
        return rewards

    def _custom(self, c: Custom, args: list[dict[str, Any]], tasks: list[Task]
                ) -> list[_Scored]:
        t0 = time.perf_counter()
        chunks = (list(group_indices([t.id for t in tasks]).values()) if c.group
                  else [list(range(len(args)))]) if c.batched else [[i] for i in range(len(args))]
        calls = [as_lists([args[i] for i in ix]) for ix in chunks] if c.batched else args
        limit = 0.0 if self.on_error == "stop" else self.max_error_frac * len(args)
        outcomes = c.scorer(calls, self.step or 0, give_up_past(limit, chunks, c.batched))
        results: list[Outcome] = [("cancelled", None)] * len(args)
        for ix, outcome in zip(chunks, outcomes, strict=True):
            for i, o in zip(ix, per_completion(outcome, len(ix), c.batched), strict=True):
                results[i] = o
        results = [weighed(o, c.weight) for o in results]
        errors = sum(o[0] == "error" for o in results)
        timeouts = sum(o[0] == "timeout" for o in results)
        failed = [(i, o) for i, o in enumerate(results) if o[0] in ("error", "timeout")]
        if self.on_error == "stop" and failed:
            i, (status, value) = failed[0]
            self._count(c.name, [], errors, timeouts, time.perf_counter() - t0)
            raise RewardError(f"reward component {c.name} ({c.what}) on task {tasks[i].id}: "
                              f"{self._why(c, status, value)}: fix it, or set reward.on_error "
                              "unscorable")
        out = [_Scored(*o[1]) if o[0] == "ok" else
               _Scored(None, {}, f"{o[0]}: {self._why(c, *o)}") for o in results]
        self._count(c.name, out, errors, timeouts, time.perf_counter() - t0)
        if out and (errors + timeouts) / len(out) > self.max_error_frac:
            cancelled = sum(o[0] == "cancelled" for o in results)
            last = next(s.reason for s in reversed(out) if s.reason and
                        not s.reason.startswith("cancelled"))
            raise RewardError(f"reward component {c.name} ({c.what}) failed on "
                              f"{errors + timeouts} of {len(out)} completions, above "
                              f"reward.max_error_frac {self.max_error_frac:g}"
                              f"{f' (the other {cancelled} not tried)' if cancelled else ''}; "
                              f"last: {last}")
        return out

    @staticmethod
    def _why(c: Custom, status: str, value: Any) -> str:
        if status == "timeout":
            return f"{c.what} did not answer within {c.timeout_s:g} s" if c.server else \
                f"timed out after {c.timeout_s:g} s (its worker was killed)"
        return "not scored: the batch was given up on" if status == "cancelled" else str(value)

    def _count(self, name: str, out: list[_Scored], errors: int, timeouts: int,
               seconds: float) -> None:
        if self.step is None:  # not a training step's batch (a held-out evaluation)
            return
        t = self._tally[name]
        t.values += [s.value for s in out if s.value is not None]
        t.none += sum(s.value is None for s in out)
        t.errors, t.timeouts, t.seconds = t.errors + errors, t.timeouts + timeouts, \
            t.seconds + seconds

    def _combine(self, i: int, per: list[list[_Scored]], exec_rewards: list[Reward] | None,
                 tasks: list[Task]) -> Reward:
        values = [scored[i].value for scored in per]
        if self.aggregation == "normalize":
            values = [normalized(scored, i, tasks) for scored in per]
        value = weighted_sum(values, self.weights)
        reasons = []
        if value is not None and not abs(value) <= MAX_REWARD:
            trained = [n for n, v, w in zip(self.names, values, self.weights, strict=True)
                       if v is not None and w > 0]
            why = (f"the total of the components {', '.join(trained)} is {value:g}, above "
                   f"{MAX_REWARD:g} in size (or not finite)")
            if self.on_error == "stop":
                raise RewardError(f"reward on task {tasks[i].id}: {why}: scale them down, or "
                                  "set reward.on_error unscorable")
            value = None
            reasons.append(f"error: {why}")
        parts: dict[str, float | None] = {}
        details: dict[str, Any] = {}
        for name, scored in zip(self.names, per, strict=True):
            s = scored[i]
            parts[name] = s.value
            parts.update({f"{name}/{k}": v for k, v in s.parts.items()})
            if s.details:
                details[name] = s.details
            if s.reason:
                reasons.append(f"{name}: {s.reason}")
        if exec_rewards is not None:  # pass@k and the curriculum read the exec verdict here
            d = exec_rewards[i].details
            if "tests" in d:
                details["tests"] = d["tests"]
                details["all_passed"] = bool(d.get("total")) and d.get("passed") == d.get("total")
        return Reward(value, parts, "; ".join(reasons), details)

    # reporting ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for _, _, fn in self.builtins:
            out.update(fn.metrics())
        for name, t in self._tally.items():
            n = len(t.values) + t.none
            if not n and not t.errors:
                continue
            vals = np.array(t.values, dtype=np.float64)
            out.update({f"reward/{name}/mean": float(vals.mean()) if len(vals) else math.nan,
                        f"reward/{name}/std": float(vals.std()) if len(vals) else math.nan,
                        f"reward/{name}/frac_none": t.none / n if n else 0.0,
                        f"reward/{name}/errors": float(t.errors),
                        f"reward/{name}/timeouts": float(t.timeouts),
                        f"reward/{name}/seconds": t.seconds})
        self._tally = {n: _Tally() for n in self.names}
        self.step = None
        return out

    def stop_reason(self) -> str | None:
        for _, _, fn in self.builtins:
            reason = getattr(fn, "stop_reason", lambda: None)()
            if reason:
                return reason
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for _, _, fn in self.builtins:
            fn.close()
        for c in self.customs:
            c.close()


def per_completion(outcome: Outcome, n: int, batched: bool) -> list[Outcome]:
    """The outcome of one call as n completions' outcomes, each value checked against the
    contract: ("ok", (value, parts)), or an error saying what the contract refused."""
    status, value = outcome
    if status != "ok":
        return [outcome] * n
    try:
        values = check_list(value, n) if batched else [value]
    except ValueProblem as e:
        return [("error", str(e))] * n
    out: list[Outcome] = []
    for v in values:
        try:
            out.append(("ok", check_value(v)))
        except ValueProblem as e:
            out.append(("error", str(e)))
    return out


def weighed(outcome: Outcome, weight: float) -> Outcome:
    """An ok outcome whose value x weight is not finite or past MAX_REWARD as an error (the
    value alone passed the contract; its weighted value is held to the same bound)."""
    if outcome[0] != "ok" or weight <= 0 or outcome[1][0] is None:
        return outcome
    v = outcome[1][0]
    wv = v * weight
    if abs(wv) <= MAX_REWARD:
        return outcome
    return ("error", f"weighted by {weight:g} its value {v:g} is {wv:g}: not finite or above "
                     f"{MAX_REWARD:g} in size (scale it down)")


def give_up_past(limit: float, chunks: list[list[int]], batched: bool) -> GiveUp:
    """give_up for a pool: True once more than `limit` completions have failed (an error, a
    timeout or a value the contract refuses; a call of a function of lists counts for each
    completion it had)."""
    failed = 0

    def give_up(k: int, outcome: Outcome) -> bool:
        nonlocal failed
        n = len(chunks[k])
        failed += sum(o[0] != "ok" for o in per_completion(outcome, n, batched))
        return failed > limit

    return give_up


def weighted_sum(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The sum of weight x value over the trained components (weight > 0) that are not None;
    None when there are none."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w > 0]
    return sum(v * w for v, w in pairs) if pairs else None


def normalized(scored: list[_Scored], i: int, tasks: list[Task]) -> float | None:
    """Completion i's value standardized over its group's values that are not None (0 where
    they do not vary)."""
    if scored[i].value is None:
        return None
    group = [scored[j].value for j, t in enumerate(tasks) if t.id == tasks[i].id]
    vals = np.array([v for v in group if v is not None], dtype=np.float64)
    std = float(vals.std())
    return 0.0 if std < 1e-8 else (scored[i].value - float(vals.mean())) / std


__all__ = ["ComponentsReward", "Custom", "normalized", "shown", "weighted_sum"]
