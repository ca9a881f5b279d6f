"""The teacher reward: an LLM grades each completion on a rubric and writes reference solutions.

Covered:
- providers `anthropic` and `openai` (any OpenAI-compatible server through `base_url`), through
  the official async SDKs (clients.py); the key comes from the environment variable the config
  names (default ANTHROPIC_API_KEY / OPENAI_API_KEY). With `base_url` set and that variable
  unset, the placeholder key "not-needed" is sent (local servers such as mlx_lm.server, vLLM,
  Ollama ignore it; a server that does check it answers 401, which stops the run);
- start-up checks (startup.py): provider, model, key, SDK, rubric, budget prices, all as
  one-line ConfigErrors before any model loads;
- modes: `absolute` (the rubric score), `ratio` (student score / teacher score of its own
  reference, clipped to [0, 1]; a teacher score of 0 counts as 1e-6), `rank` (one call per
  group: the teacher grades the G candidates side by side);
- reference solutions: one per task, cached, judged on the same rubric (details `teacher_code`,
  `teacher_score`); shown to the judge in absolute and rank modes, never in ratio mode (the
  student and the teacher are judged by the same prompt there);
- defences against a judge that can be talked into a score (audit.py measures them): `samples`
  judgements per completion averaged per criterion (each its own call and cache entry; the
  reference too); `strip_comments`: the correctness criterion judged in a call of its own on
  the code without comments and docstrings (strip.py), the other criteria on the code as
  written; in rank mode with `rank_debias` each call shows the group in its own seeded order
  and every score is corrected by the judge's mean at that position (position.py), the
  statistics updated by the whole batch before any correction, so the result does not depend
  on the order answers arrive in;
- `score(..., repeat=r)` draws fresh judgements (what the audit measures noise with);
  `score_orders` judges one group in given orders, uncorrected (the audit's position probe);
- calls, the cache, concurrency, accounting and the budget are calls.py's: token and cost
  accounting per completion (Reward.details `cost_usd`), per step (`step_metrics()`) and per
  run (`metrics()`, running totals); once the estimated cost reaches `max_cost_usd`, no new
  call starts, the rest of the batch is unscorable and `stop_reason()` says why;
- unscorable completions (errors after the SDK's retries, refusals, parse failures, budget) get
  value None with the reason, and are counted (`teacher/unscorable`). An empty completion is
  not sent: it scores 0.0 with reason "empty completion". 401/403/404 raise TeacherError.

Not covered: streaming, the providers' batch APIs, per-model price tables (prices come from
config), cancelling calls in flight when the budget is reached.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ...config import TeacherConfig
from ...errors import TeacherError
from ...records import Reward, Task, extract_code, group_indices
from ..signals import grader_text, with_signals
from . import judge
from .cache import AnswerCache, cache_key
from .calls import Caller, Ledger, LoopThread, Reply
from .clients import Client, make_client
from .position import PositionStats, shuffled
from .startup import check_teacher
from .strip import strip_comments

log = logging.getLogger(__name__)
T = TypeVar("T")

CACHE_FILE = "teacher_cache.db"
_EPS = 1e-6


@dataclass(frozen=True)
class Reference:
    code: str | None
    score: float | None
    error: str = ""


# --- the reward ------------------------------------------------------------------------------


@dataclass
class Judged:
    """One candidate's raw judgements: one verdict per sample, the position it was shown at
    (rank mode) and its share of the calls' cost."""

    verdicts: list[judge.Verdict] = field(default_factory=list)
    positions: list[int | None] = field(default_factory=list)
    size: int = 1
    cost_usd: float = 0.0
    cached: bool = True


@dataclass
class Group:
    """One task's candidates after their calls, before they become rewards."""

    codes: list[str]
    live: list[int]
    judged: list[Judged]
    ref: Reference


class TeacherReward:
    name = "teacher"

    def __init__(self, cfg: TeacherConfig, output_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.endpoint, self.rubric = check_teacher(cfg)
        self._views = judge.views(self.rubric, cfg.strip_comments)
        path = cfg.cache_path or (Path(output_dir) / CACHE_FILE if output_dir else None)
        self._client: Client = make_client(self.endpoint)
        ep_id = f"{cfg.provider}|{self.endpoint.base_url}|{cfg.model}"
        self._calls = Caller(cfg, self._client, AnswerCache(path), ep_id, self.rubric.version)
        self._positions = PositionStats()
        self._loop = LoopThread()
        self._closed = False

    # RewardFn ---------------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task], completions: Sequence[str], *,
              repeat: int = 0) -> list[Reward]:
        """One reward per completion. `repeat` r > 0 draws fresh judgements (samples r*S to
        r*S+S-1, S = `samples`, each its own cache entry); training uses repeat 0."""
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        rewards = self._run_batch(self._score_all(list(tasks), list(completions), repeat))
        return [with_signals(r, grader_text(c, t.language))  # text addressed to the judge
                for r, t, c in zip(rewards, tasks, completions, strict=True)]

    def score_orders(self, groups: Sequence[tuple[Task, Sequence[str], Sequence[int]]],
                     repeat: int = 0) -> list[list[Reward]]:
        """Rank mode: each (task, completions, order) judged in that order (`order[k]`: the
        index of the completion shown at position k) as the judge answered it (no shuffle, no
        position correction); one list of rewards per group, in the completions' own order."""
        if self.cfg.mode != "rank":
            raise ValueError("score_orders needs reward.teacher.mode rank")
        out = self._run_batch(self._score_orders(
            [(t, list(c), tuple(o)) for t, c, o in groups], repeat))
        return [[with_signals(r, grader_text(c, t.language)) for r, c in zip(rs, cs, strict=True)]
                for rs, (t, cs, _) in zip(out, groups, strict=True)]

    def _run_batch(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            raise RuntimeError("TeacherReward.score() after close()")
        self._calls.step = Ledger()
        out = self._loop.run(coro)
        rewards = _flat(out)
        failed = [r.reason.removeprefix("unscorable: ") for r in rewards if r.value is None]
        self._calls.count("unscorable", len(failed))
        if failed:
            common = "; ".join(f"{why} (x{n})" for why, n in Counter(failed).most_common(3))
            log.warning("teacher: %d/%d completions unscorable: %s", len(failed), len(rewards),
                        common)
        return out

    def metrics(self) -> dict[str, float]:
        """Running totals since construction: `teacher/calls`, `cache_hits`, `input_tokens`,
        `output_tokens`, `cost_usd`, `unscorable` (a step's share is the difference); the
        rubric's weights, `scoring/<criterion>` (the seed trainer's Scoring/* tags); in rank
        mode with rank_debias, `teacher/position_bias` once estimated."""
        weights = {f"scoring/{c.name}": c.weight for c in self.rubric.criteria}
        out = {**self._calls.run.metrics("teacher/"), **weights}
        bias = self._positions.max_abs_effect()
        if bias is not None:
            out["teacher/position_bias"] = bias
        return out

    def step_metrics(self) -> dict[str, float]:
        """The same counters for the last score() call only."""
        return self._calls.step.metrics("teacher/")

    def stop_reason(self) -> str | None:
        """A one-line reason to end the run (budget reached), else None."""
        return self._calls.stop

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.close()
            self._calls.cache.close()

    def __enter__(self) -> TeacherReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # one batch --------------------------------------------------------------------------------

    async def _score_all(self, tasks: list[Task], completions: list[str],
                         repeat: int) -> list[Reward]:
        groups = group_indices([t.id for t in tasks])
        jobs = [self._score_group(tasks[idx[0]], [completions[i] for i in idx], repeat, None)
                for idx in groups.values()]
        outs = await _settle(jobs)
        debias = self.cfg.mode == "rank" and self.cfg.rank_debias
        if debias:  # the whole batch updates the statistics, then every candidate is corrected
            for g in outs:
                self._observe(g)
        rewards: list[Reward] = [Reward(None)] * len(tasks)
        for idx, g in zip(groups.values(), outs, strict=True):
            for i, r in zip(idx, self._finish(g, debias), strict=True):
                rewards[i] = r
        return rewards

    async def _score_orders(self, groups: list[tuple[Task, list[str], tuple[int, ...]]],
                            repeat: int) -> list[list[Reward]]:
        for _, completions, order in groups:
            if sorted(order) != list(range(len(completions))):
                raise ValueError(f"order {order} is not a permutation of the "
                                 f"{len(completions)} completions")
        outs = await _settle([self._score_group(t, c, repeat, o) for t, c, o in groups])
        return [self._finish(g, False) for g in outs]

    async def _score_group(self, task: Task, completions: list[str], repeat: int,
                           order: tuple[int, ...] | None) -> Group:
        codes = [extract_code(c, task.language) for c in completions]
        live = [i for i, c in enumerate(codes) if c.strip()]
        ref_code, ref_error = None, "reference off"
        if live and (self.cfg.reference or self.cfg.mode == "ratio"):
            ref_code, ref_error = await self._reference_code(task)
        if self.cfg.mode == "ratio" and ref_code is None:
            live = []  # nothing to divide by: do not pay for the student calls
        shown = ref_code if self.cfg.mode != "ratio" else None
        if self.cfg.mode == "rank":
            if order is not None:  # the order is of all candidates: keep the live ones' ranks
                order = tuple(i for i in order if i in live)
                order = tuple(live.index(i) for i in order)
            student_job = self._rank(task, [codes[i] for i in live], shown, repeat, order)
        else:
            student_job = _gather([self._judge(task, codes[i], shown, repeat) for i in live])
        teacher_job = self._judge(task, ref_code, None, 0) if ref_code else _none()
        teacher, students = await asyncio.gather(teacher_job, student_job)
        ref = Reference(None, None, ref_error)
        if teacher is not None:
            verdict = judge.mean_verdict(teacher.verdicts)
            ref = Reference(ref_code, self._total(verdict), verdict.error)
        return Group(codes, live, list(students), ref)

    def _observe(self, g: Group) -> None:
        for j in g.judged:
            for v, pos in zip(j.verdicts, j.positions, strict=True):
                if v.scores is not None and pos is not None:
                    self._positions.update(j.size, pos, v.scores)

    def _finish(self, g: Group, debias: bool) -> list[Reward]:
        unscored = Reward(None, {n: None for n in self.rubric.names},
                          f"unscorable: no teacher score ({g.ref.error})")
        out = [_empty(self.rubric, g.ref) if not c.strip() else unscored for c in g.codes]
        for i, j in zip(g.live, g.judged, strict=True):
            out[i] = self._reward(self._final(j, debias), j, g.ref)
        return out

    def _final(self, j: Judged, debias: bool) -> judge.Verdict:
        """The samples averaged, each corrected for its position first (rank_debias)."""
        if not debias:
            return judge.mean_verdict(j.verdicts)
        fixed = [judge.Verdict(self._positions.correct(j.size, pos, v.scores), v.rationale)
                 if v.scores is not None and pos is not None else v
                 for v, pos in zip(j.verdicts, j.positions, strict=True)]
        return judge.mean_verdict(fixed)

    # the calls --------------------------------------------------------------------------------

    async def _reference_code(self, task: Task) -> tuple[str | None, str]:
        system, user = judge.reference_messages(task.prompt, task.language)
        reply = await self._calls.ask("reference", system, user, None, "", "", 0)
        if reply.answer is None or reply.answer.refusal:
            return None, f"reference: {reply.error or 'refused'}"
        data = reply.answer.data
        code = extract_code(data, task.language).strip() if isinstance(data, str) else ""
        if not code:
            return None, "reference: empty answer"
        self._calls.remember(reply, "reference")
        return code, ""

    def _samples(self, repeat: int) -> range:
        s = self.cfg.samples
        return range(repeat * s, repeat * s + s)

    async def _judge(self, task: Task, code: str, reference: str | None, repeat: int) -> Judged:
        """`samples` judgements of one completion, each over the rubric's views."""
        calls = [_gather([self._judge_view(v, task, code, reference, k) for v in self._views])
                 for k in self._samples(repeat)]
        out = Judged()
        for parts in await _gather(calls):
            out.verdicts.append(judge.merge_verdicts([v for v, _ in parts]))
            out.positions.append(None)
            _charge(out, [r for _, r in parts], 1)
        return out

    async def _judge_view(self, view: judge.View, task: Task, code: str, reference: str | None,
                          sample: int) -> tuple[judge.Verdict, Reply]:
        shown = strip_comments(code, task.language) if view.stripped else code
        system = judge.judge_system(view.rubric, self._client.by_tool, view.stripped)
        user = judge.judge_user(view.rubric, task.prompt, task.language, shown, reference,
                                view.stripped)
        reply = await self._calls.ask("judge", system, user, judge.judge_schema(view.rubric),
                                judge.JUDGE_TOOL, view.rubric.version, sample)
        verdict = self._verdicts(reply, 1, lambda d: [judge.parse_judgement(d, view.rubric)])[0]
        if verdict.scores is not None:
            self._calls.remember(reply, "judge")
        return verdict, reply

    def _order(self, task: Task, codes: list[str], sample: int) -> tuple[int, ...]:
        if not self.cfg.rank_debias:
            return tuple(range(len(codes)))
        return shuffled(len(codes), cache_key(task.id, str(sample), *codes))

    async def _rank(self, task: Task, codes: list[str], reference: str | None, repeat: int,
                    order: tuple[int, ...] | None) -> list[Judged]:
        """`samples` rank calls of the group, each in `order` or (None) its own order."""
        out = [Judged(size=len(codes)) for _ in codes]
        if not codes:
            return out
        jobs = [self._rank_once(task, codes, reference, k,
                                order if order is not None else self._order(task, codes, k))
                for k in self._samples(repeat)]
        for verdicts, perm, replies in await _gather(jobs):
            for pos, idx in enumerate(perm):
                out[idx].verdicts.append(verdicts[pos])
                out[idx].positions.append(pos)
                _charge(out[idx], replies, len(codes))
        return out

    async def _rank_once(self, task: Task, codes: list[str], reference: str | None, sample: int,
                         perm: tuple[int, ...]
                         ) -> tuple[list[judge.Verdict], tuple[int, ...], list[Reply]]:
        """One ranking of the group shown in `perm`; verdicts in shown order."""
        shown = [codes[i] for i in perm]
        parts = await _gather([self._rank_view(v, task, shown, reference, sample)
                               for v in self._views])
        verdicts = [judge.merge_verdicts([p[0][k] for p in parts]) for k in range(len(perm))]
        return verdicts, perm, [p[1] for p in parts]

    async def _rank_view(self, view: judge.View, task: Task, codes: list[str],
                         reference: str | None, sample: int
                         ) -> tuple[list[judge.Verdict], Reply]:
        if view.stripped:
            codes = [strip_comments(c, task.language) for c in codes]
        system = judge.rank_system(view.rubric, self._client.by_tool, view.stripped)
        user = judge.rank_user(view.rubric, task.prompt, task.language, codes, reference,
                               view.stripped)
        reply = await self._calls.ask("rank", system, user, judge.rank_schema(view.rubric),
                                judge.RANK_TOOL, view.rubric.version, sample)
        verdicts = self._verdicts(reply, len(codes),
                                  lambda d: judge.parse_ranking(d, view.rubric, len(codes)))
        if all(v.scores is not None for v in verdicts):
            self._calls.remember(reply, "rank")
        return verdicts, reply

    def _verdicts(self, reply: Reply, n: int, parse: Callable[[Any], list[judge.Verdict]]
                  ) -> list[judge.Verdict]:
        if reply.answer is None:
            return [judge.Verdict(None, "", reply.error)] * n
        if reply.answer.refusal:
            return [judge.Verdict(None, "", f"refused: {reply.answer.refusal[:80]}")] * n
        return parse(reply.answer.data)

    # rewards ----------------------------------------------------------------------------------

    def _total(self, verdict: judge.Verdict) -> float | None:
        return None if verdict.scores is None else self.rubric.total(verdict.scores)

    def _reward(self, verdict: judge.Verdict, judged: Judged, ref: Reference) -> Reward:
        score = self._total(verdict)
        value, reason = score, verdict.error
        if score is not None and self.cfg.mode == "ratio":
            value = None if ref.score is None else min(1.0, score / max(ref.score, _EPS))
            reason = "" if value is not None else f"no teacher score ({ref.error or 'unscorable'})"
        reason = f"unscorable: {reason}" if value is None else f"{self.cfg.mode} {value:.3f}"
        parts = {n: (verdict.scores or {}).get(n) for n in self.rubric.names}
        details = {"rationale": verdict.rationale, "student_score": score,
                   "teacher_code": ref.code, "teacher_score": ref.score,
                   "cached": judged.cached, "cost_usd": judged.cost_usd,
                   "samples": sum(v.scores is not None for v in judged.verdicts)}
        return Reward(value, parts, reason, details)


def _empty(rubric: judge.Rubric, ref: Reference) -> Reward:
    return Reward(0.0, {n: 0.0 for n in rubric.names}, "empty completion: nothing to judge",
                  {"rationale": "", "student_score": 0.0, "teacher_code": ref.code,
                   "teacher_score": ref.score, "cached": False, "cost_usd": 0.0})


async def _none() -> None:
    return None


def _charge(judged: Judged, replies: list[Reply], share: int) -> None:
    """Add a call's cost (split over the `share` candidates it judged) to a candidate."""
    judged.cost_usd += sum(r.cost_usd for r in replies) / share
    judged.cached = judged.cached and all(r.cached for r in replies)


async def _settle(jobs: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every job run to its end; then the first TeacherError (else the first error) raised."""
    outs = await asyncio.gather(*jobs, return_exceptions=True)
    errors = [o for o in outs if isinstance(o, BaseException)]
    if errors:
        raise next((e for e in errors if isinstance(e, TeacherError)), errors[0])
    return outs  # type: ignore[return-value]


def _flat(out: list[Any]) -> list[Reward]:
    return [r for x in out for r in (x if isinstance(x, list) else [x])]


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    return list(await asyncio.gather(*coros))
