"""The compiled decode loop (compiled_decode.py): rows stop at EOS, the width stays in buckets,
the draws are the eager loop's before any row has left, a row's tokens do not depend on how
often tokens are read nor on the width buckets, the sampler's distribution holds as rows leave,
the weights are read at every call (no stale trace), and kept caches hold what each row fed.

The table model's next-token logits depend only on a row's own last token (a table lookup, no
product across the batch), so equalities between loops are exact."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from mlx_rlaif.backends.mlx import compiled_decode
from mlx_rlaif.backends.mlx import decode as eager
from mlx_rlaif.backends.mlx.decode import merged_cache, picker


class TableModel(nn.Module):
    """Logits = table[token]; writes each input token as the key and value of its position."""

    def __init__(self, table: mx.array) -> None:
        super().__init__()
        self.table = table

    def __call__(self, x: mx.array, cache: list) -> mx.array:
        kv = x.astype(mx.float32)[:, None, :, None] * mx.ones((1, 1, 1, 2))
        keys, _ = cache[0].update_and_fetch(kv, kv)
        assert keys.shape[0] == x.shape[0]
        return self.table[x]


def _table(vocab: int, seed: int) -> mx.array:
    return mx.random.normal((vocab, vocab), key=mx.random.key(seed)) * 2


def _cache(lengths: list[int]) -> list:
    """A merged batch cache of rows with `lengths` prefilled positions (keys 100 + i)."""
    caches = [[KVCache()] for _ in lengths]
    for c, n in zip(caches, lengths, strict=True):
        if n:
            kv = (100.0 + mx.arange(n, dtype=mx.float32))[None, None, :, None] * mx.ones(2)
            c[0].update_and_fetch(kv, kv)
    return merged_cache(caches)


def _run(loop: str, model: nn.Module, lengths: list[int], first: list[int], steps: int,
         eos: set[int], seed: int = 0, **kw) -> eager.Decoded:
    mx.random.seed(seed)
    if loop == "eager":
        return eager.decode(model, _cache(lengths), first, steps, picker(1.0), eos, **kw)
    return compiled_decode.decode(model, _cache(lengths), first, steps, picker(1.0), eos,
                                  compiled=True, **kw)


def test_buckets() -> None:
    assert compiled_decode.buckets(32) == [1, 2, 4, 8, 16, 32]
    assert compiled_decode.buckets(12) == [1, 2, 4, 8, 12]
    assert compiled_decode.buckets(1) == [1]


@pytest.mark.parametrize("lengths", [[3, 1, 5, 2, 4, 6], [0] * 6])
def test_same_draws_as_the_eager_loop_while_no_row_has_left(lengths: list[int]) -> None:
    """No EOS: every step at the first width, so the same uniform numbers and the same tokens
    and log-probs as the eager loop (also when nothing was prefilled: the first step fills the
    cache)."""
    model = TableModel(_table(16, 0))
    first = [1, 2, 3, 4, 5, 6]
    a, b = (_run(loop, model, lengths, first, 9, set()) for loop in ("eager", "compiled"))
    assert a.tokens == b.tokens and a.finish == b.finish == ["length"] * 6
    np.testing.assert_allclose(np.array(a.logprobs), np.array(b.logprobs), atol=1e-6)
    assert b.widths == [6] * 9


def test_rows_stop_at_eos_and_the_width_follows_the_buckets() -> None:
    """The counting model of tests/test_decode.py: rows end at 7 after 2, 6 and 5 tokens.
    Widths are those the device computed: row 0 ends at step 1, read while step 2 is queued at
    width 3; then the batch is 2 rows (bucket 2 of 1, 2, 3) until it ends; row 2 ends at step
    4 (read while step 5 is queued), so no step runs at width 1."""
    from test_decode import CountingModel

    caches = [[KVCache()] for _ in range(3)]
    for c, n in zip(caches, (2, 4, 3), strict=True):
        c[0].update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))
    out = compiled_decode.decode(CountingModel(), merged_cache(caches), [5, 1, 2], 6,
                                 picker(1.0), {7}, compiled=True)
    assert out.tokens == [[6, 7], [2, 3, 4, 5, 6, 7], [3, 4, 5, 6, 7]]
    assert out.finish == ["stop", "stop", "stop"]
    assert out.widths == [3, 3, 3, 2, 2, 2]
    np.testing.assert_allclose(np.concatenate(out.logprobs), 0.0, atol=1e-6)


def test_a_rows_tokens_do_not_depend_on_reads_or_buckets(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """With EOS ids the rows stop at different steps: reading every 1, 2 or 5 steps, and never
    shrinking the width, give every row the same tokens, log-probs and finish."""
    model = TableModel(_table(24, 1))
    lengths, first = [2, 5, 3, 1, 4, 2, 6, 3, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    runs = [_run("compiled", model, lengths, first, 12, {0, 11}, read_every=k)
            for k in (1, 2, 5)]
    monkeypatch.setattr(compiled_decode, "buckets", lambda n: [n])
    runs.append(_run("compiled", model, lengths, first, 12, {0, 11}))
    assert len({len(t) for t in runs[0].tokens}) > 2  # rows did stop at different steps
    assert min(runs[0].widths) < 10 and min(runs[-1].widths) == 10
    for r in runs[1:]:
        assert r.tokens == runs[0].tokens and r.finish == runs[0].finish
        np.testing.assert_allclose(np.concatenate(r.logprobs), np.concatenate(runs[0].logprobs),
                                   atol=1e-6)


def test_sampler_distribution_holds_as_rows_leave() -> None:
    """Every row has the same next-token distribution p; token 3 (p = 1/8) is EOS. The recorded
    tokens follow p, their log-probs are log p, and lengths are geometric (capped at 14): the
    batch shrinks through its buckets on the way."""
    probs = np.array([0.5, 0.25, 0.125, 0.125], dtype=np.float32)
    model = TableModel(mx.broadcast_to(mx.array(np.log(probs)), (4, 4)))
    n, steps = 3000, 14
    out = _run("compiled", model, [2] * n, [0] * n, steps, {3}, seed=3)
    toks = np.concatenate([np.array(t) for t in out.tokens])
    freq = np.bincount(toks, minlength=4) / len(toks)
    np.testing.assert_allclose(freq, probs, atol=4 * math.sqrt(0.25 / len(toks)))
    np.testing.assert_allclose(np.concatenate(out.logprobs), np.log(probs[toks]), atol=1e-5)
    mean_len = np.mean([len(t) for t in out.tokens])
    expected = sum((7 / 8) ** k for k in range(steps))  # E[min(geometric(1/8), 14)]
    assert abs(mean_len - expected) < 4 * 2.5 / math.sqrt(n)
    assert len(set(out.widths)) >= 3  # 3000 -> 2048 -> 1024


def test_new_weights_are_read_by_the_kept_compiled_step() -> None:
    """The compiled step is kept on the model from one rollout to the next; its weights are
    inputs, so after an update the log-probs are those of the new weights."""
    model = TableModel(_table(16, 2))
    first = [1, 2, 3]
    _run("compiled", model, [2, 2, 2], first, 4, set())
    model.table = _table(16, 3)
    out = _run("compiled", model, [2, 2, 2], first, 4, set())
    logp = np.array(model.table - mx.logsumexp(model.table, axis=-1, keepdims=True))
    for f, toks, lps in zip(first, out.tokens, out.logprobs, strict=True):
        prev = [f, *toks[:-1]]
        np.testing.assert_allclose(lps, logp[prev, toks], atol=1e-5)


@pytest.mark.parametrize("read_every", [1, 3])
def test_kept_caches_hold_what_each_row_fed(read_every: int) -> None:
    """With keep_caches, each row's cache is its prefill, its first token and then its tokens
    (not the steps it decoded after its end): a prefix of the conversation covering all its
    tokens but perhaps the last. Reading every step, a row that stopped early has also fed its
    EOS (the next step was queued before its EOS was read), as in the eager loop."""
    model = TableModel(_table(24, 4))
    lengths, first, steps = [2, 5, 3, 1], [1, 2, 3, 4], 10
    out = _run("compiled", model, lengths, first, steps, {0, 11}, keep_caches=True,
               read_every=read_every)
    assert len({len(t) for t in out.tokens}) > 1
    for i, (n, toks) in enumerate(zip(lengths, out.tokens, strict=True)):
        c = out.caches[i][0]
        keys = np.array(c.keys)[0, 0, :, 0].tolist()
        fed = [100.0 + j for j in range(n)] + [float(first[i])] + [float(t) for t in toks]
        assert c.offset == len(keys) and len(toks) + n <= len(keys) <= len(fed)
        assert keys == fed[:len(keys)]
        if read_every == 1:
            assert len(keys) == n + len(toks) + (len(toks) < steps)
