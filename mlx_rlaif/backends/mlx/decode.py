"""The eager batched decode loop of the MLX rollouts, the sampler, and what both loops share.

`decode(model, cache, first, max_tokens, pick, eos)` runs one model call per step for every row
still decoding; the next step is queued (`mx.async_eval`) before the current one is read, so
building a step's graph overlaps the previous step's compute. A row that samples an EOS id stops
("stop", the EOS kept), the others stop after `max_tokens` ("length"); finished rows are filtered
out of the cache (mlx-lm's `filter`), so the width shrinks as rows end. It is the loop for
caches other than plain KV caches (rotating windows, state-space layers) and the reference the
compiled loop (`compiled_decode.py`, what rollouts use where it applies) is checked against.

`picker(temperature, top_p, top_k)` gives the sampler (`Sampler`): the token of each row and its
log-probability at the sampling temperature over the full distribution (before top-p/top-k
truncation). Plain temperature sampling draws by inverting the cumulative distribution after one
exponential pass over the vocabulary, one compiled kernel (on MLX's CPU backend, behind the
`cpu` gate, the exponential is `cpu.kernels.sampler_exp`, vectorized); top-p and top-k take
mlx-lm's sampler; temperature 0 is greedy, with log-probs at temperature 1. `Sampler.draw` takes
the uniform numbers from the caller (the compiled loop draws them per row).

Why not mlx-lm's `BatchGenerator`: it takes a `logsumexp` and its sampler a Gumbel draw (three
vocabulary-sized transcendental passes a step, ~20% of a decode step of a small model on MLX's
CPU backend), and its continuous batching is not needed when all rows start together
(BENCHMARKS.md has the A/B). The caches, their merging and filtering are mlx-lm's.

`clock`, where given, is called with a phase name at each phase boundary of a step ("build",
"dispatch", "read", "book"): tools/profile_decode.py's per-step breakdown.

Not covered: stop strings, logits processors, rows joining a running batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.sample_utils import make_sampler

from ... import cpu
from ...cpu.kernels import sampler_exp
from .loss import exp

Pick = Callable[[mx.array], tuple[mx.array, mx.array]]
Clock = Callable[[str], None]  # called with a phase name at each phase boundary of a step


@dataclass
class Decoded:
    """Per row: tokens, their sampler log-probs, why it stopped; and the width of each step."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[str]
    widths: list[int] = field(default_factory=list)
    caches: list[Any] = field(default_factory=list)  # per row, when kept: its per-layer KVCache
    forwards: int = 0  # speculative.py: rows fed to the model, summed over steps
    drafted: int = 0  # ... drafted tokens verified
    accepted: int = 0  # ... and kept


@functools.cache
def _truncating(temperature: float, top_p: float, top_k: int, vocab: int) -> Any:
    """mlx-lm's sampler where top-p / top-k truncate (a top-k of the whole vocabulary does not),
    else None."""
    k = top_k if top_k < vocab else 0
    if temperature > 0 and (top_p < 1 or k):
        return make_sampler(temperature, top_p=top_p if top_p < 1 else 0.0, top_k=k)
    return None


@dataclass(frozen=True)
class Sampler:
    """logits [B, V] -> (tokens [B], log-probs [B] at `temperature`, full distribution)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @property
    def scale(self) -> float:
        return 1.0 / self.temperature if self.temperature > 0 else 1.0

    def __call__(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        u = None
        if self.temperature > 0 and self._sampler(logits) is None:
            u = mx.random.uniform(shape=(logits.shape[0], 1))
        return self.draw(logits, u)

    def draw(self, logits: mx.array, u: mx.array | None) -> tuple[mx.array, mx.array]:
        """The sampler with the uniform numbers `u` [B, 1] of plain temperature sampling given
        (ignored by greedy and truncated sampling, which draw their own)."""
        sampler = self._sampler(logits)
        if self.temperature > 0 and sampler is None:  # plain temperature sampling: one kernel
            return (_draw_cpu if cpu.active() else _draw)(logits, u, self.scale)
        z, cdf = _cdf(logits, self.scale, exp)
        if sampler is not None:  # takes log-probs at temperature 1
            tok = sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        else:
            tok = mx.argmax(z, axis=-1)
        return _with_logp(tok, z, cdf)

    def uses_uniforms(self, vocab: int) -> bool:
        """Whether `draw` reads its `u` (plain temperature sampling) at this vocabulary size."""
        return self.temperature > 0 and self._sampler_for(vocab) is None

    def _sampler(self, logits: mx.array) -> Any:
        return self._sampler_for(logits.shape[-1])

    def _sampler_for(self, vocab: int) -> Any:
        return _truncating(self.temperature, self.top_p, self.top_k, vocab)


def picker(temperature: float, top_p: float = 1.0, top_k: int = 0) -> Sampler:
    """The sampler of these sampling parameters."""
    return Sampler(float(temperature), float(top_p), int(top_k))


def _cdf(logits: mx.array, scale: float, exp: Callable[[mx.array], mx.array]
         ) -> tuple[mx.array, mx.array]:
    """(logits * scale minus their max, the running sums of its exponentials) per row."""
    z = logits.astype(mx.float32)
    z = z * scale if scale != 1.0 else z
    z = z - z.max(axis=-1, keepdims=True)
    return z, mx.cumsum(exp(z), axis=-1)


def _with_logp(tok: mx.array, z: mx.array, cdf: mx.array) -> tuple[mx.array, mx.array]:
    tok = tok.astype(mx.uint32)
    return tok, mx.take_along_axis(z, tok[:, None], axis=-1)[:, 0] - mx.log(cdf[:, -1])


def _inverse_cdf(logits: mx.array, u: mx.array, scale: float,
                 exp: Callable[[mx.array], mx.array]) -> tuple[mx.array, mx.array]:
    """The token whose cumulative probability first exceeds u [B, 1] (uniform in [0, 1)), and
    its log-prob."""
    z, cdf = _cdf(logits, scale, exp)
    tok = mx.minimum((cdf <= u * cdf[:, -1:]).sum(axis=-1), z.shape[-1] - 1)
    return _with_logp(tok, z, cdf)


_draw = mx.compile(partial(_inverse_cdf, exp=mx.exp))  # one trace per shape (and scale)
_draw_cpu = mx.compile(partial(_inverse_cdf, exp=sampler_exp))


def merged_cache(caches: list[list[Any]]) -> list[Any]:
    """One batch cache per layer from per-row prompt caches (mlx-lm's `merge`, which copies)."""
    return [layer[0].merge(list(layer)) for layer in zip(*caches, strict=True)]


def decode(model: nn.Module, cache: list[Any], first: list[int], max_tokens: int, pick: Pick,
           eos: Collection[int], keep_caches: bool = False,
           on_done: Callable[[Decoded, list[int]], None] | None = None,
           clock: Clock | None = None) -> Decoded:
    """Decode `len(first)` rows, each from its last prompt token, over `cache` (merged). With
    `keep_caches`, each row's cache is cut out of the batch when it ends (mlx-lm's `extract`),
    for a conversation to continue from: it holds a prefix of the row's prompt + tokens.
    `on_done(out, rows)` is called with the rows that have ended, as soon as they have (while
    the others still decode: their scoring can start)."""
    n = len(first)
    out = Decoded([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n,
                  caches=[None] * n)
    if max_tokens < 1:
        if keep_caches:
            _keep(out, cache, list(range(n)), list(range(n)))
        if on_done is not None:
            on_done(out, list(range(n)))
        return out
    rows = list(range(n))  # the row of each batch position
    tick = clock or _no_clock

    def step(y: mx.array) -> tuple[mx.array, mx.array]:
        nxt = pick(model(y[:, None], cache=cache)[:, -1])
        tick("build")
        mx.async_eval(*nxt)
        tick("dispatch")
        return nxt

    y, lp = step(mx.array(first, dtype=mx.uint32))
    for t in range(max_tokens):
        more = t + 1 < max_tokens
        if more:
            y_next, lp_next = step(y)
        toks, lps = y.tolist(), lp.tolist()
        tick("read")
        keep = _record(out, rows, toks, lps, eos)
        ended = [j for j in range(len(rows)) if j not in keep or not (more and keep)]
        if keep_caches:
            _keep(out, cache, rows, ended)
        if on_done is not None and ended:
            on_done(out, [rows[j] for j in ended])
        if not (more and keep):
            tick("book")
            break
        if len(keep) < len(rows):
            for c in cache:
                c.filter(keep)
            idx = mx.array(keep)
            y_next, lp_next = y_next[idx], lp_next[idx]
            rows = [rows[j] for j in keep]
        tick("book")
        y, lp = y_next, lp_next
    return out


def _no_clock(phase: str) -> None:
    return None


def _keep(out: Decoded, cache: list[Any], rows: list[int], ended: list[int]) -> None:
    """Cut the caches of the batch positions `ended` out of the batch cache."""
    for j in ended:
        out.caches[rows[j]] = [c.extract(j) for c in cache]


def _record(out: Decoded, rows: list[int], toks: list[int], lps: list[float],
            eos: Collection[int]) -> list[int]:
    """Append a step's tokens to their rows; the batch positions still decoding."""
    out.widths.append(len(rows))
    keep = []
    for j, (i, tok, lp) in enumerate(zip(rows, toks, lps, strict=True)):
        out.tokens[i].append(tok)
        out.logprobs[i].append(lp)
        if tok in eos:
            out.finish[i] = "stop"
        else:
            keep.append(j)
    return keep
