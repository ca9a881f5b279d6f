"""One teacher request at a time, through the cache, the budget and the ledger.

Covered: `Caller.ask` looks the request up in the sqlite cache (cache.py), shares a request
already in flight, else sends it through the client (clients.py) with at most `concurrency` in
flight; it counts calls, cache hits, tokens and the estimated cost per run and per step
(`Ledger`), and once the cost reaches `max_cost_usd` starts no new call (`stop`). A request's
cache key covers the endpoint, the rubric version, the kind of call and the exact messages; a
repeated judgement (sample k > 0, `reward.teacher.samples`) gets a key of its own, so the samples
of one completion are separate calls. `LoopThread` runs the async calls on a private event loop
so that synchronous code can wait on them.

Not covered: cancelling calls in flight when the budget is reached (at most `concurrency` of
them finish), caching failures (the caller decides what to `remember`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from ...config import TeacherConfig
from .cache import AnswerCache, cache_key
from .clients import Answer, CallError, Client

log = logging.getLogger(__name__)
T = TypeVar("T")


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


class LoopThread:
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


class Caller:
    def __init__(self, cfg: TeacherConfig, client: Client, cache: AnswerCache, ep_id: str,
                 rubric_version: str) -> None:
        self.cfg, self.client, self.cache = cfg, client, cache
        self._ep_id, self._rubric = ep_id, rubric_version
        self.run, self.step = Ledger(), Ledger()
        self.stop: str | None = None
        self._inflight: dict[str, asyncio.Future[Reply]] = {}
        self._sem = asyncio.Semaphore(cfg.concurrency)

    async def ask(self, kind: str, system: str, user: str, schema: dict | None, tool: str,
                  rubric: str = "", sample: int = 0) -> Reply:
        """One request, through the cache; sample k > 0 has a cache entry of its own."""
        parts = [self._ep_id, rubric or self._rubric, kind, tool, system, user]
        key = cache_key(*parts, *([f"sample {sample}"] if sample else []))
        hit = _answer_from(self.cache.get(key))
        if hit is not None:
            self.count("cache_hits", 1)
            return Reply(hit, key, cached=True)
        if key in self._inflight:  # the same request is already on its way: share it
            self.count("cache_hits", 1)
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
            if self.stop:
                return Reply(None, key, "teacher budget reached")
            try:
                answer = await self.client.ask(system, user, schema, tool)
            except CallError as e:
                return Reply(None, key, str(e))
        return Reply(answer, key, cost_usd=self._account(answer))

    def _account(self, answer: Answer) -> float:
        cost = (answer.input_tokens * self.cfg.price_in_per_mtok
                + answer.output_tokens * self.cfg.price_out_per_mtok) / 1e6
        self.count("calls", 1)
        self.count("input_tokens", answer.input_tokens)
        self.count("output_tokens", answer.output_tokens)
        self.count("cost_usd", cost)
        limit = self.cfg.max_cost_usd
        if limit > 0 and self.run.cost_usd >= limit and not self.stop:
            self.stop = (f"teacher budget reached: estimated ${self.run.cost_usd:.4f} >= "
                         f"reward.teacher.max_cost_usd ${limit:.4f}")
            log.warning(self.stop)
        return cost

    def count(self, name: str, amount: float) -> None:
        for ledger in (self.run, self.step):
            setattr(ledger, name, getattr(ledger, name) + amount)

    def remember(self, reply: Reply, kind: str) -> None:
        if not reply.cached and reply.answer is not None:
            self.cache.put(reply.key, asdict(reply.answer), kind=kind, model=self.cfg.model,
                           rubric=self._rubric)


def _answer_from(row: Any) -> Answer | None:
    """A cached answer, or None for a miss or a row this version cannot read."""
    try:
        return Answer(**row) if isinstance(row, dict) else None
    except TypeError:
        return None
