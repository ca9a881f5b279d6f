"""Speculative rollouts drafted from the sequence itself (prompt lookup): more than one token
per forward pass, with the sampled distribution unchanged.

Drafting. Each row keeps an index of the n-grams of its sequence so far (prompt and completion,
`NgramIndex`): the continuation of the most recent earlier occurrence of its longest suffix
n-gram (`MAX_NGRAM` down to `MIN_NGRAM` tokens) is its draft, up to `draft_tokens` tokens. Code
repeats identifiers, signatures and whole lines, so drafts are often right; a row with no match
drafts nothing that step. A row's draft length adapts (`next_size`): longer after a draft kept
whole, shorter after one that was not.

Verifying. One forward of the batch per step: each row feeds its last sampled token (the one
not yet in its KV cache) and its draft, right-padded to the widest row. The sampler draws a
token at every position, as it would have one position at a time; a row keeps its drafted
tokens while each equals what was sampled at its position, and then the first sampled token
that differs (or the one after the whole draft). With a deterministic draft this is the exact
speculative sampling rule (accept the draft token x with probability min(1, p(x) / q(x)) = p(x)
where q is one-hot, else sample from the residual, p without x renormalized: the same as
sampling from p and comparing), so every emitted token is a draw from the model's distribution
as configured (temperature, top-p, top-k), its recorded log-probability the sampler's, as in
decode.py; greedy decoding emits the same tokens (up to float rounding of wider products).

Ragged acceptance. Rows accept different numbers of tokens. After a step the batch cache
(mlx-lm's `BatchKVCache`) is cut back per row: the positions every row rejected are trimmed
(`trim`), and each row whose rejected tail is longer is rolled right by the difference, the
rolled-out positions becoming its left padding (`prepare(right_padding=...)` + `finalize()`,
mlx-lm's per-row shift), so every row's cache holds exactly its prompt and accepted tokens and
its positions (the RoPE offsets) stay its own. Padding that every row has accumulated is cut off
once it exceeds `COMPACT_AT` positions.

Stats: `forwards` (row-steps: rows in the batch, summed over steps), `drafted` and `accepted`
tokens; `rollout._seqs` turns them into `gen/tokens_per_pass` and `gen/draft_accept`.

Not covered: draft models (a second network), tree drafts, caches other than plain KV caches
(rotating windows, state-space layers, quantized caches: `supported` says no and the rollout
decodes one token per step), a compiled verification step (the loop is eager; decoding one
token per step uses compiled_decode.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache

from .decode import Clock, Decoded, Sampler

MAX_NGRAM = 4  # the longest suffix matched
MIN_NGRAM = 2  # the shortest (a single repeated token predicts too little)
COMPACT_AT = 64  # positions of padding every row has, from which the cache is cut down


class NgramIndex:
    """The n-grams of one growing sequence: for each n-gram (MIN_NGRAM..MAX_NGRAM tokens), the
    position after its most recent occurrence that is followed by at least one token."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.seq: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            end = len(self.seq)  # the n-grams ending just before `t` get `t` as continuation
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                if end >= n:
                    self.after[tuple(self.seq[end - n:end])] = end
            self.seq.append(t)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens continuing the longest suffix n-gram's most recent earlier
        occurrence; [] when no suffix occurred before (or k < 1)."""
        if k < 1:
            return []
        for n in range(min(MAX_NGRAM, len(self.seq)), MIN_NGRAM - 1, -1):
            at = self.after.get(tuple(self.seq[-n:]))
            if at is not None:
                return self.seq[at:at + k]
        return []


def supported(cache: Sequence[Any], pick: Any) -> bool:
    """Whether drafting can run on this batch: every layer a plain `BatchKVCache` (trimmable
    and shiftable per row) and a `Sampler`."""
    return isinstance(pick, Sampler) and bool(cache) and all(
        type(c) is BatchKVCache for c in cache)


def accept(draft: Sequence[int], sampled: Sequence[int], eos: Collection[int],
           budget: int) -> int:
    """How many tokens a row emits from one verification: its sampled tokens while each
    equals the drafted token at its place (the draft is kept), then the first that differs, or
    the one after the whole draft; an EOS or the row's remaining `budget` ends it earlier."""
    n = 0
    for j, tok in enumerate(sampled[:len(draft) + 1]):
        n = j + 1
        if n >= budget or tok in eos or j >= len(draft) or tok != draft[j]:
            break
    return n


def next_size(size: int, drafted: int, kept: int, most: int) -> int:
    """A row's next draft length: 2 more after a draft kept whole, 1 less otherwise (at least
    1, at most `most`): transformers' heuristic schedule for assisted generation, so a row
    whose drafts keep failing makes the verification pass narrower."""
    return min(most, size + 2) if kept == drafted else max(1, size - 1)


def decode(model: nn.Module, cache: list[BatchKVCache], first: list[int],
           histories: Sequence[Sequence[int]], max_tokens: int, pick: Sampler,
           eos: Collection[int], draft_tokens: int, keep_caches: bool = False,
           on_done: Callable[[Decoded, list[int]], None] | None = None,
           clock: Clock | None = None) -> Decoded:
    """decode.decode's contract (rows, EOS, `keep_caches`, `on_done`, stats in the returned
    `Decoded`), drafting up to `draft_tokens` tokens per row and step from `histories[i]` (row
    i's sequence so far, ending with `first[i]`, the token its cache does not hold yet)."""
    n = len(first)
    out = Decoded([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n,
                  caches=[None] * n)
    index = [NgramIndex(h) for h in histories]
    last = list(first)
    size = [draft_tokens] * n  # each row's draft length (`next_size`)
    rows = list(range(n))  # the row of each batch position
    tick = clock or (lambda phase: None)
    while rows and max_tokens > 0:
        drafts = [index[i].draft(min(size[i], max_tokens - len(out.tokens[i]) - 1))
                  for i in rows]
        width = 1 + max(len(d) for d in drafts)
        feed = mx.array([[last[i], *d] + [0] * (width - 1 - len(d))
                         for i, d in zip(rows, drafts, strict=True)], dtype=mx.uint32)
        logits = model(feed, cache=cache)
        tick("build")
        toks, lps = pick(logits.reshape(-1, logits.shape[-1]))
        toks, lps = toks.reshape(len(rows), width).tolist(), lps.reshape(len(rows), width).tolist()
        tick("read")
        out.widths.append(len(rows))
        out.forwards += len(rows)
        keep, ended, junk = [], [], []
        for j, (i, d) in enumerate(zip(rows, drafts, strict=True)):
            m = accept(d, toks[j], eos, max_tokens - len(out.tokens[i]))
            out.drafted += len(d)
            out.accepted += m - 1
            if d:
                size[i] = next_size(size[i], len(d), m - 1, draft_tokens)
            out.tokens[i] += toks[j][:m]
            out.logprobs[i] += lps[j][:m]
            index[i].extend(toks[j][:m])
            last[i] = toks[j][m - 1]
            junk.append(width - m)  # positions of this verification the row does not keep
            if last[i] in eos:
                out.finish[i] = "stop"
                ended.append(j)
            elif len(out.tokens[i]) >= max_tokens:
                ended.append(j)
            else:
                keep.append(j)
        if keep_caches:
            for j in ended:
                out.caches[rows[j]] = [_cut(c, j, junk[j]) for c in cache]
        if on_done is not None and ended:
            on_done(out, [rows[j] for j in ended])
        if not keep:
            break
        if ended:
            for c in cache:
                c.filter(mx.array(keep))
            rows, junk = [rows[j] for j in keep], [junk[j] for j in keep]
        _trim_rows(cache, junk)
        tick("book")
    return out


def _cut(cache: BatchKVCache, j: int, junk: int) -> Any:
    """Batch position `j`'s cache cut out of the batch, without its `junk` rejected positions."""
    c = cache.extract(j)
    c.trim(junk)
    return c


def _trim_rows(cache: list[BatchKVCache], junk: list[int]) -> None:
    """Drop each row's last `junk[j]` positions: those every row has by trimming, the rest by
    rolling the row right (they become left padding); then cut padding every row has."""
    common = min(junk)
    rest = [x - common for x in junk]
    for c in cache:
        if common:
            c.trim(common)
        if max(rest):
            c.prepare(right_padding=rest)
            c.finalize()
    pad = min(cache[0].left_padding.tolist())
    if pad >= COMPACT_AT:
        keep = mx.arange(len(junk))
        for c in cache:
            c.filter(keep)
