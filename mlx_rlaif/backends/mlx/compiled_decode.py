"""The compiled decode loop: a decode step (the model's forward of one token per row, the
per-row random draw, the sampler and the log-prob gather) is one `mx.compile`d function, so a
step costs one call into MLX instead of building a graph of ~40 ops per layer in Python.

Fixed shapes. A step's shapes must not change from one step to the next, or every step would be
a new trace. The keys and values live in per-layer buffers [width, kv heads, length, head dim]
(`StaticKV` stands in for mlx-lm's `BatchKVCache` inside the model: it writes each step's keys
at a position held in an array, and masks the positions not yet written and each row's left
padding). The length grows by `LEN_STEP` positions at a time, and the width stays in a few
buckets as rows finish (the batch's first width and the powers of two below it): a finished row
keeps its place, decoding tokens nobody reads, until the rows still decoding fit the next
bucket, and then the batch is gathered down to it (the KV buffers, the rows' left padding and
the row map), without a host synchronization. So a rollout traces at most one step per (width
bucket, length bucket), and the traces are kept from one rollout to the next (one compiled step
per model and sampler; the weights are the compiled function's inputs, so new adapters need no
new trace).

Random draws. Each step draws one uniform number per row of the batch's first width and each
row takes its own (`rows`): a row's draws do not depend on which other rows are still in the
batch, so bucketing and how often tokens are read leave its tokens unchanged (up to float
rounding of matrix products of another height). At the batch's first width, before any row has
left, the draws are those of decode.py's eager loop.

Reads. The tokens and log-probs of a step are read (`tolist`, the host synchronization) once
every `read_every` steps, while the next step is already queued, so the device is not idle
while Python records tokens and checks for EOS. A row that finished between two reads has
decoded up to `read_every - 1` steps it does not keep (it only costs its share of the batch).

Against decode.py's eager loop (which runs every other cache type): the same tokens and
log-probs up to float rounding (attention runs over the padded buffer length, the compiled
graph fuses element-wise ops); tests/test_compiled_decode.py checks the distribution, the
log-probs against the trainer's forward, and that reading and bucketing do not change a row's
tokens. With `keep_caches` each row's cache is cut to the positions it wrote (its prompt and
its tokens), as the eager loop's.

Not covered: caches other than mlx-lm's `BatchKVCache` (sliding windows, state-space layers,
quantized caches: the eager loop), more than one token per step (speculative decoding), stop
strings. Opt out with MLX_RLAIF_COMPILED_DECODE=0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from ...cpu.blas import blas_threads, train_threads
from ...cpu.decode_kernels import compiled_decode_kernels
from . import decode as eager
from .decode import Clock, Decoded, Sampler

LEN_STEP = 32  # positions the KV buffers grow by (one trace per length)
BLAS_WIDE = 16  # rows from which OpenBLAS decodes on every core (CPU build; `blas_threads_for`)
READ_EVERY = 1  # steps between two reads of the tokens (the default of `decode`)
OPT_OUT = "MLX_RLAIF_COMPILED_DECODE"


def supported(cache: Sequence[Any], pick: Any) -> bool:
    """Whether the compiled loop runs this batch: every layer a `BatchKVCache`, a `Sampler`,
    not opted out."""
    return (os.environ.get(OPT_OUT) != "0" and isinstance(pick, Sampler) and bool(cache)
            and all(type(c) is BatchKVCache for c in cache))


def decode(model: nn.Module, cache: list[Any], first: list[int], max_tokens: int, pick: Any,
           eos: Collection[int], keep_caches: bool = False,
           on_done: Callable[[Decoded, list[int]], None] | None = None,
           clock: Clock | None = None, read_every: int | None = None,
           compiled: bool | None = None, shared_cores: bool = False) -> Decoded:
    """decode.decode's contract (rows, EOS, `keep_caches`, `on_done`), in the compiled loop
    where `supported` (or `compiled`) says so, else in decode.py's eager loop. `shared_cores`:
    other work runs alongside (scoring while decoding), so OpenBLAS keeps its thread count."""
    use = supported(cache, pick) if compiled is None else compiled and supported(cache, pick)
    if not use or max_tokens < 1:
        return eager.decode(model, cache, first, max_tokens, pick, eos, keep_caches, on_done,
                            clock)
    stepper = _stepper(model, pick)
    try:
        threads = 0 if shared_cores else blas_threads_for(len(first))
        with blas_threads(threads), compiled_decode_kernels(model, transposed=threads == 0):
            return _Loop(stepper, cache, first, max_tokens, eos, keep_caches, on_done,
                         clock or _no_clock, max(1, read_every or READ_EVERY)).run()
    finally:
        stepper.clear()


def blas_threads_for(width: int) -> int:
    """OpenBLAS threads while the compiled loop decodes `width` rows on MLX's CPU build (0:
    leave the default, one thread on two cores): every core from `BLAS_WIDE` rows, where the
    products are tall enough to split and the host thread, waiting on the compiled step, leaves
    its core free (not while the sandbox scores alongside: BENCHMARKS.md, "Decoding: where a
    step goes"). At the default count (one thread on two cores) the blocks' weights decode
    transposed (`cpu.decode_kernels.DecodeLinear`), a layout OpenBLAS packs faster there."""
    return train_threads() if width >= BLAS_WIDE else 0


def _no_clock(phase: str) -> None:
    return None


class StaticKV:
    """One layer's KV cache inside the compiled step: buffers `state["k"][i]`,
    `state["v"][i]` [B, kv heads, length, head dim], each step written at position
    `state["pos"]` (a scalar array); `state["lpad"]` [B] is each row's left padding, `offset`
    [B] each row's position (`pos - lpad`, one array for every layer)."""

    def __init__(self, state: dict[str, Any], i: int, offset: mx.array) -> None:
        self.state, self.i = state, i
        self.offset = offset  # each row's position (the RoPE offset of its token this step)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        s, at = self.state, self.state["pos"].reshape(1)
        s["k"][self.i] = mx.slice_update(s["k"][self.i], keys, at, axes=(2,))
        s["v"][self.i] = mx.slice_update(s["v"][self.i], values, at, axes=(2,))
        return s["k"][self.i], s["v"][self.i]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None
                  ) -> mx.array:
        """[B, 1, 1, length]: the positions written so far, without the left padding."""
        if n != 1:
            raise ValueError(f"StaticKV decodes one token per step, not {n}")
        j = mx.arange(self.state["k"][self.i].shape[2])
        return ((j >= self.state["lpad"][:, None]) & (j <= self.state["pos"]))[:, None, None]


class _Stepper:
    """The compiled step of one model and sampler. `state` holds the batch's arrays (KV
    buffers, write position, left padding), read and written back by each call along with
    MLX's random state; the model's arrays are inputs, so changed weights need no new trace."""

    def __init__(self, model: nn.Module, sampler: Sampler) -> None:
        self.model, self.sampler = model, sampler
        self.state: dict[str, Any] = {}
        self.clear()
        self.fn = mx.compile(self._step, inputs=[self.state, model.state, mx.random.state],
                             outputs=[self.state, mx.random.state])

    def clear(self) -> None:
        """Drop the last batch's arrays (the KV buffers would otherwise live on)."""
        self.state.update(k=[], v=[], pos=mx.array(0, dtype=mx.int32),
                          lpad=mx.array([0], dtype=mx.int32))

    def _step(self, y: mx.array, rows: mx.array, n: int) -> tuple[mx.array, mx.array]:
        """y [B] tokens in, (tokens, log-probs) [B] out; rows [B]: each position's row among
        the batch's first `n` (its uniform draw)."""
        offset = self.state["pos"] - self.state["lpad"]
        caches = [StaticKV(self.state, i, offset) for i in range(len(self.state["k"]))]
        logits = self.model(y[:, None], cache=caches)[:, -1]
        u = None
        if self.sampler.uses_uniforms(logits.shape[-1]):
            u = mx.random.uniform(shape=(n, 1))[rows]
        self.state["pos"] = self.state["pos"] + 1
        return self.sampler.draw(logits, u)


def _stepper(model: nn.Module, sampler: Sampler) -> _Stepper:
    """The model's compiled step for this sampler, made once and kept on the model (a plain
    attribute, outside its parameters), so it goes when the model goes."""
    steppers = model.__dict__.setdefault("_compiled_decode_steps", {})
    if sampler not in steppers:
        steppers[sampler] = _Stepper(model, sampler)
    return steppers[sampler]


def buckets(n: int) -> list[int]:
    """The widths a batch of `n` rows decodes at: n and the powers of two below it."""
    return sorted({n} | {1 << i for i in range(n.bit_length()) if 1 << i < n})


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _fit(a: mx.array, length: int) -> mx.array:
    """`a` [B, H, S, D] cut or zero-padded to `length` positions, in a buffer of its own."""
    if a.shape[2] >= length:
        return mx.contiguous(a[:, :, :length])
    pad = mx.zeros((*a.shape[:2], length - a.shape[2], a.shape[3]), dtype=a.dtype)
    return mx.concatenate([a, pad], axis=2)


class _Loop:
    """One batch decoding: host-side bookkeeping around the compiled step."""

    def __init__(self, stepper: _Stepper, cache: list[BatchKVCache], first: list[int],
                 max_tokens: int, eos: Collection[int], keep_caches: bool,
                 on_done: Callable[[Decoded, list[int]], None] | None, clock: Clock,
                 read_every: int) -> None:
        self.stepper, self.cache, self.eos = stepper, cache, eos
        self.max_tokens, self.keep_caches, self.on_done = max_tokens, keep_caches, on_done
        self.tick, self.read_every = clock, read_every
        n = self.n = len(first)
        self.out = Decoded([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n,
                           caches=[None] * n)
        self.rows = list(range(n))  # the row of each batch position
        self.live = [True] * n  # per position: its row still decodes
        self.pending: list[tuple[mx.array, mx.array]] = []  # queued steps not yet read
        self.widths: list[int] = []
        self.enqueued = 0
        self.y = mx.array(first, dtype=mx.uint32)

    def run(self) -> Decoded:
        if self.cache[0].keys is None:  # nothing prefilled: the first step fills the cache
            self._eager_first_step()
        self._to_buffers()
        if not self.pending:
            self._enqueue()
        while True:
            more = self.enqueued < self.max_tokens
            if more:
                self._enqueue()
            if more and len(self.pending) <= self.read_every:
                continue
            ended = self._read(self.pending[:-1] if more else self.pending)
            self.pending = self.pending[-1:] if more else []
            self._end(ended)
            if not more or not any(self.live):
                self.tick("book")
                break
            self._maybe_compact()
            self.tick("book")
        steps = max(len(t) for t in self.out.tokens)
        self.out.widths = self.widths[:steps]
        return self.out

    def _eager_first_step(self) -> None:
        """Step 0 through the batch cache itself, which learns the keys' shapes from it."""
        sampler = self.stepper.sampler
        logits = self.stepper.model(self.y[:, None], cache=self.cache)[:, -1]
        u = mx.random.uniform(shape=(self.n, 1)) if sampler.uses_uniforms(logits.shape[-1]) \
            else None
        tok, lp = sampler.draw(logits, u)
        self.tick("build")
        mx.async_eval(tok, lp)
        self.tick("dispatch")
        self.pending.append((tok, lp))
        self.widths.append(self.n)
        self.enqueued, self.y = 1, tok

    def _to_buffers(self) -> None:
        """The batch cache's keys and values as the compiled step's buffers."""
        c0 = self.cache[0]
        self.pos = c0._idx  # the next position written
        self.start = self.pos - self.enqueued  # where step 0 wrote
        self.lpad = c0.left_padding.tolist()
        length = _round_up(self.pos + 1, LEN_STEP)
        s = self.stepper.state
        s["k"] = [_fit(c.keys, length) for c in self.cache]
        s["v"] = [_fit(c.values, length) for c in self.cache]
        s["pos"] = mx.array(self.pos, dtype=mx.int32)
        s["lpad"] = c0.left_padding.astype(mx.int32)
        self.rows_arr = mx.arange(self.n, dtype=mx.int32)

    def _enqueue(self) -> None:
        s = self.stepper.state
        if self.pos >= s["k"][0].shape[2]:  # the buffers are full: LEN_STEP more positions
            length = s["k"][0].shape[2] + LEN_STEP
            s["k"] = [_fit(a, length) for a in s["k"]]
            s["v"] = [_fit(a, length) for a in s["v"]]
        tok, lp = self.stepper.fn(self.y, self.rows_arr, self.n)
        self.tick("build")
        mx.async_eval(tok, lp)
        self.tick("dispatch")
        self.pending.append((tok, lp))
        self.widths.append(len(self.rows))
        self.enqueued += 1
        self.pos += 1
        self.y = tok

    def _read(self, steps: list[tuple[mx.array, mx.array]]) -> list[int]:
        """Record the steps' tokens of the rows still decoding; the positions that ended."""
        read = [(tok.tolist(), lp.tolist()) for tok, lp in steps]
        self.tick("read")
        ended = []
        out = self.out
        for toks, lps in read:
            for j, (tok, lp) in enumerate(zip(toks, lps, strict=True)):
                if not self.live[j]:
                    continue
                i = self.rows[j]
                out.tokens[i].append(tok)
                out.logprobs[i].append(lp)
                if tok in self.eos:
                    out.finish[i] = "stop"
                if tok in self.eos or len(out.tokens[i]) >= self.max_tokens:
                    self.live[j] = False
                    ended.append(j)
        return ended

    def _end(self, ended: list[int]) -> None:
        if self.keep_caches:
            for j in ended:
                self.out.caches[self.rows[j]] = self._extract(j)
        if self.on_done is not None and ended:
            self.on_done(self.out, [self.rows[j] for j in ended])

    def _extract(self, j: int) -> list[KVCache]:
        """Position j's per-layer cache: its prompt and the tokens it fed (not the steps it
        decoded after its end)."""
        i = self.rows[j]
        end = self.start + min(self.enqueued, len(self.out.tokens[i]) + 1)
        s, lo = self.stepper.state, self.lpad[j]
        caches = []
        for k, v in zip(s["k"], s["v"], strict=True):
            c = KVCache()
            c.keys = mx.contiguous(k[j:j + 1, :, lo:end])
            c.values = mx.contiguous(v[j:j + 1, :, lo:end])
            c.offset = end - lo
            caches.append(c)
        mx.async_eval([a for c in caches for a in (c.keys, c.values)])
        return caches

    def _maybe_compact(self) -> None:
        """Gather the batch down to the next width bucket once the rows still decoding fit."""
        width, alive = len(self.rows), sum(self.live)
        smaller = [b for b in buckets(self.n) if b < width]
        if not smaller or alive > smaller[-1]:
            return
        target = min(b for b in buckets(self.n) if b >= alive)
        live = [j for j in range(width) if self.live[j]]
        dead = [j for j in range(width) if not self.live[j]][:target - alive]
        keep = sorted(live + dead)
        idx = mx.array(keep, dtype=mx.int32)
        s = self.stepper.state
        s["k"] = [a[idx] for a in s["k"]]
        s["v"] = [a[idx] for a in s["v"]]
        s["lpad"] = s["lpad"][idx]
        self.rows_arr = self.rows_arr[idx]
        self.rows = [self.rows[j] for j in keep]
        self.live = [self.live[j] for j in keep]
        self.lpad = [self.lpad[j] for j in keep]
        tok, lp = self.pending[-1]
        self.pending[-1] = (tok[idx], lp[idx])
        self.y = self.pending[-1][0]
