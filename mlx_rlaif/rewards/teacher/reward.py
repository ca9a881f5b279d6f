"""The teacher reward: an LLM grades each completion on a rubric and writes reference solutions.

Covered:
- providers `anthropic` and `openai` (any OpenAI-compatible server through `base_url`), through
  the official async SDKs (clients.py); the key comes from the environment variable the config
  names (default ANTHROPIC_API_KEY / OPENAI_API_KEY). With `base_url` set and that variable
  unset, the placeholder key "not-needed" is sent (local servers such as mlx_lm.server, vLLM,
  Ollama ignore it; a server that does check it answers 401, which stops the run);
- start-up checks (`check_teacher`): provider, model, key, SDK, rubric, budget prices, all as
  one-line ConfigErrors before any model loads;
- modes: `absolute` (the rubric score), `ratio` (student score / teacher score of its own
  reference, clipped to [0, 1]; a teacher score of 0 counts as 1e-6), `rank` (one call per
  group: the teacher grades the G candidates side by side);
- reference solutions: one per task, cached, judged on the same rubric (details `teacher_code`,
  `teacher_score`); shown to the judge in absolute and rank modes, never in ratio mode (the
  student and the teacher are judged by the same prompt there);
- bounded concurrency (`concurrency` calls in flight) on a private event loop thread, so the
  synchronous `score()` can be called from anywhere; identical requests in flight are sent once;
- the sqlite cache (cache.py); token and cost accounting per call (Reward.details `cost_usd`),
  per step (`step_metrics()`) and per run (`metrics()`, running totals); the budget: once the
  estimated cost reaches `max_cost_usd`, no new call starts (calls already in flight finish, at
  most `concurrency` of them), the rest of the batch is unscorable and `stop_reason()` says why;
- unscorable completions (errors after the SDK's retries, refusals, parse failures, budget) get
  value None with the reason, and are counted (`teacher/unscorable`). An empty completion is
  not sent: it scores 0.0 with reason "empty completion". 401/403/404 raise TeacherError.

Not covered: streaming, the providers' batch APIs, per-model price tables (prices come from
config), cancelling calls in flight when the budget is reached.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from ...config import TeacherConfig
from ...errors import ConfigError, TeacherError
from ...records import Reward, Task, extract_code, group_indices
from . import judge
from .cache import AnswerCache, cache_key
from .clients import Answer, CallError, Client, Endpoint, import_sdk, make_client

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
NO_KEY = "not-needed"
CACHE_FILE = "teacher_cache.db"
_EPS = 1e-6


# --- start-up checks -------------------------------------------------------------------------


def key_env(cfg: TeacherConfig) -> str:
    return cfg.api_key_env or DEFAULT_KEY_ENV.get(cfg.provider, "")


def check_teacher(cfg: TeacherConfig) -> tuple[Endpoint, judge.Rubric]:
    """Every start-up check, before any model loads; returns the endpoint and rubric."""
    if cfg.provider not in DEFAULT_KEY_ENV:
        raise ConfigError("reward.teacher.provider is none: set it to anthropic or openai")
    if not cfg.model.strip():
        raise ConfigError("reward.teacher.model is empty: name the teacher model (e.g. "
                          "claude-3-5-haiku-latest, gpt-4o-mini, or what a local server serves)")
    if cfg.base_url and not cfg.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"reward.teacher.base_url = {cfg.base_url!r} must start with http:// "
                          "or https://")
    if cfg.max_cost_usd > 0 and cfg.price_in_per_mtok == 0 and cfg.price_out_per_mtok == 0:
        raise ConfigError("reward.teacher.max_cost_usd needs prices to estimate cost: set "
                          "reward.teacher.price_in_per_mtok and price_out_per_mtok")
    rubric = judge.rubric_from_config(cfg.criteria)
    import_sdk(cfg.provider)
    env = key_env(cfg)
    key = os.environ.get(env, "")
    if not key and not cfg.base_url:
        raise ConfigError(f"the {cfg.provider} teacher needs an API key in ${env}: export it, or "
                          "set reward.teacher.api_key_env to the variable that holds it")
    ep = Endpoint(cfg.provider, cfg.model, key or NO_KEY, env, cfg.base_url.rstrip("/"),
                  cfg.timeout_s, cfg.max_retries, cfg.max_tokens, cfg.temperature,
                  cfg.structured_output)
    return ep, rubric


# --- accounting ------------------------------------------------------------------------------


@dataclass
class Ledger:
    calls: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unscorable: int = 0

    def metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class Reply:
    """One call's outcome: an answer, or the error that made it unscorable."""

    answer: Answer | None
    key: str
    error: str = ""
    cached: bool = False
    cost_usd: float = 0.0


@dataclass(frozen=True)
class Reference:
    code: str | None
    score: float | None
    error: str = ""


class _LoopThread:
    """A private asyncio loop in a daemon thread; `run` blocks until a coroutine finishes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="teacher-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


# --- the reward ------------------------------------------------------------------------------


class TeacherReward:
    name = "teacher"

    def __init__(self, cfg: TeacherConfig, output_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.endpoint, self.rubric = check_teacher(cfg)
        path = cfg.cache_path or (Path(output_dir) / CACHE_FILE if output_dir else None)
        self._cache = AnswerCache(path)
        self._client: Client = make_client(self.endpoint)
        self._ep_id = f"{cfg.provider}|{self.endpoint.base_url}|{cfg.model}"
        self._schemas = (judge.judge_schema(self.rubric), judge.rank_schema(self.rubric))
        self._run, self._step = Ledger(), Ledger()
        self._stop: str | None = None
        self._inflight: dict[str, asyncio.Future[Reply]] = {}
        self._sem = asyncio.Semaphore(cfg.concurrency)
        self._loop = _LoopThread()
        self._closed = False

    # RewardFn ---------------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Reward]:
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        if self._closed:
            raise RuntimeError("TeacherReward.score() after close()")
        self._step = Ledger()
        rewards = self._loop.run(self._score_all(list(tasks), list(completions)))
        failed = [r.reason.removeprefix("unscorable: ") for r in rewards if r.value is None]
        self._step.unscorable = len(failed)
        self._run.unscorable += len(failed)
        if failed:
            common = "; ".join(f"{why} (x{n})" for why, n in Counter(failed).most_common(3))
            log.warning("teacher: %d/%d completions unscorable: %s", len(failed), len(rewards),
                        common)
        return rewards

    def metrics(self) -> dict[str, float]:
        """Running totals since construction: `teacher/calls`, `cache_hits`, `input_tokens`,
        `output_tokens`, `cost_usd`, `unscorable` (a step's share is the difference); and the
        rubric's weights, `scoring/<criterion>` (the seed trainer's Scoring/* tags)."""
        weights = {f"scoring/{c.name}": c.weight for c in self.rubric.criteria}
        return {**self._run.metrics("teacher/"), **weights}

    def step_metrics(self) -> dict[str, float]:
        """The same counters for the last score() call only."""
        return self._step.metrics("teacher/")

    def stop_reason(self) -> str | None:
        """A one-line reason to end the run (budget reached), else None."""
        return self._stop

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.close()
            self._cache.close()

    def __enter__(self) -> TeacherReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # one batch --------------------------------------------------------------------------------

    async def _score_all(self, tasks: list[Task], completions: list[str]) -> list[Reward]:
        groups = group_indices([t.id for t in tasks])
        jobs = [self._score_group(tasks[idx[0]], [completions[i] for i in idx])
                for idx in groups.values()]
        outs = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [o for o in outs if isinstance(o, BaseException)]
        if errors:
            raise next((e for e in errors if isinstance(e, TeacherError)), errors[0])
        rewards: list[Reward] = [Reward(None)] * len(tasks)
        for idx, group in zip(groups.values(), outs, strict=True):
            for i, r in zip(idx, group, strict=True):
                rewards[i] = r
        return rewards

    async def _score_group(self, task: Task, completions: list[str]) -> list[Reward]:
        codes = [extract_code(c, task.language) for c in completions]
        live = [i for i, c in enumerate(codes) if c.strip()]
        ref_code, ref_error = None, "reference off"
        if live and (self.cfg.reference or self.cfg.mode == "ratio"):
            ref_code, ref_error = await self._reference_code(task)
        if self.cfg.mode == "ratio" and ref_code is None:
            live = []  # nothing to divide by: do not pay for the student calls
        shown = ref_code if self.cfg.mode != "ratio" else None
        if self.cfg.mode == "rank":
            student_job = self._rank(task, [codes[i] for i in live], shown)
        else:
            student_job = _gather([self._judge(task, codes[i], shown) for i in live])
        teacher_job = self._judge(task, ref_code, None) if ref_code else _none()
        teacher, students = await asyncio.gather(teacher_job, student_job)
        ref = Reference(None, None, ref_error)
        if teacher is not None:
            ref = Reference(ref_code, self._total(teacher[0]), teacher[0].error)
        unscored = Reward(None, {n: None for n in self.rubric.names},
                          f"unscorable: no teacher score ({ref.error})")
        out = [_empty(self.rubric, ref) if not c.strip() else unscored for c in codes]
        share = len(live) if self.cfg.mode == "rank" else 1
        for i, (verdict, reply) in zip(live, students, strict=True):
            out[i] = self._reward(verdict, reply, ref, share)
        return out

    # the three kinds of call ------------------------------------------------------------------

    async def _reference_code(self, task: Task) -> tuple[str | None, str]:
        system, user = judge.reference_messages(task.prompt, task.language)
        reply = await self._ask("reference", system, user, None, "")
        if reply.answer is None or reply.answer.refusal:
            return None, f"reference: {reply.error or 'refused'}"
        data = reply.answer.data
        code = extract_code(data, task.language).strip() if isinstance(data, str) else ""
        if not code:
            return None, "reference: empty answer"
        self._remember(reply, "reference")
        return code, ""

    async def _judge(self, task: Task, code: str, reference: str | None
                     ) -> tuple[judge.Verdict, Reply]:
        system = judge.judge_system(self.rubric, self._client.by_tool)
        user = judge.judge_user(self.rubric, task.prompt, task.language, code, reference)
        reply = await self._ask("judge", system, user, self._schemas[0], judge.JUDGE_TOOL)
        verdict = self._verdicts(reply, 1, lambda d: [judge.parse_judgement(d, self.rubric)])[0]
        if verdict.scores is not None:
            self._remember(reply, "judge")
        return verdict, reply

    async def _rank(self, task: Task, codes: list[str], reference: str | None
                    ) -> list[tuple[judge.Verdict, Reply]]:
        if not codes:
            return []
        system = judge.rank_system(self.rubric, self._client.by_tool)
        user = judge.rank_user(self.rubric, task.prompt, task.language, codes, reference)
        reply = await self._ask("rank", system, user, self._schemas[1], judge.RANK_TOOL)
        verdicts = self._verdicts(reply, len(codes),
                                  lambda d: judge.parse_ranking(d, self.rubric, len(codes)))
        if all(v.scores is not None for v in verdicts):
            self._remember(reply, "rank")
        return [(v, reply) for v in verdicts]

    def _verdicts(self, reply: Reply, n: int, parse: Callable[[Any], list[judge.Verdict]]
                  ) -> list[judge.Verdict]:
        if reply.answer is None:
            return [judge.Verdict(None, "", reply.error)] * n
        if reply.answer.refusal:
            return [judge.Verdict(None, "", f"refused: {reply.answer.refusal[:80]}")] * n
        return parse(reply.answer.data)

    # calls, cache, budget ---------------------------------------------------------------------

    async def _ask(self, kind: str, system: str, user: str, schema: dict | None,
                   tool: str) -> Reply:
        key = cache_key(self._ep_id, self.rubric.version, kind, tool, system, user)
        hit = _answer_from(self._cache.get(key))
        if hit is not None:
            self._count("cache_hits", 1)
            return Reply(hit, key, cached=True)
        if key in self._inflight:  # the same request is already on its way: share it
            self._count("cache_hits", 1)
            reply = await self._inflight[key]
            return Reply(reply.answer, key, reply.error, cached=True)
        fut = asyncio.ensure_future(self._fetch(system, user, schema, tool, key))
        self._inflight[key] = fut
        try:
            return await fut
        finally:
            self._inflight.pop(key, None)

    async def _fetch(self, system: str, user: str, schema: dict | None, tool: str,
                     key: str) -> Reply:
        async with self._sem:
            if self._stop:
                return Reply(None, key, "teacher budget reached")
            try:
                answer = await self._client.ask(system, user, schema, tool)
            except CallError as e:
                return Reply(None, key, str(e))
        return Reply(answer, key, cost_usd=self._account(answer))

    def _account(self, answer: Answer) -> float:
        cost = (answer.input_tokens * self.cfg.price_in_per_mtok
                + answer.output_tokens * self.cfg.price_out_per_mtok) / 1e6
        self._count("calls", 1)
        self._count("input_tokens", answer.input_tokens)
        self._count("output_tokens", answer.output_tokens)
        self._count("cost_usd", cost)
        limit = self.cfg.max_cost_usd
        if limit > 0 and self._run.cost_usd >= limit and not self._stop:
            self._stop = (f"teacher budget reached: estimated ${self._run.cost_usd:.4f} >= "
                          f"reward.teacher.max_cost_usd ${limit:.4f}")
            log.warning(self._stop)
        return cost

    def _count(self, name: str, amount: float) -> None:
        for ledger in (self._run, self._step):
            setattr(ledger, name, getattr(ledger, name) + amount)

    def _remember(self, reply: Reply, kind: str) -> None:
        if not reply.cached and reply.answer is not None:
            self._cache.put(reply.key, asdict(reply.answer), kind=kind, model=self.cfg.model,
                            rubric=self.rubric.version)

    # rewards ----------------------------------------------------------------------------------

    def _total(self, verdict: judge.Verdict) -> float | None:
        return None if verdict.scores is None else self.rubric.total(verdict.scores)

    def _reward(self, verdict: judge.Verdict, reply: Reply, ref: Reference, share: int) -> Reward:
        score = self._total(verdict)
        value, reason = score, verdict.error
        if score is not None and self.cfg.mode == "ratio":
            value = None if ref.score is None else min(1.0, score / max(ref.score, _EPS))
            reason = "" if value is not None else f"no teacher score ({ref.error or 'unscorable'})"
        reason = f"unscorable: {reason}" if value is None else f"{self.cfg.mode} {value:.3f}"
        parts = {n: (verdict.scores or {}).get(n) for n in self.rubric.names}
        details = {"rationale": verdict.rationale, "student_score": score,
                   "teacher_code": ref.code, "teacher_score": ref.score,
                   "cached": reply.cached, "cost_usd": reply.cost_usd / share}
        return Reward(value, parts, reason, details)


def _empty(rubric: judge.Rubric, ref: Reference) -> Reward:
    return Reward(0.0, {n: 0.0 for n in rubric.names}, "empty completion: nothing to judge",
                  {"rationale": "", "student_score": 0.0, "teacher_code": ref.code,
                   "teacher_score": ref.score, "cached": False, "cost_usd": 0.0})


def _answer_from(row: Any) -> Answer | None:
    """A cached answer, or None for a miss or a row this version cannot read."""
    try:
        return Answer(**row) if isinstance(row, dict) else None
    except TypeError:
        return None


async def _none() -> None:
    return None


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    return list(await asyncio.gather(*coros))
