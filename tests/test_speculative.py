"""Speculative rollouts (backends/mlx/speculative.py): drafting from the sequence leaves the
sampled distribution exactly the model's, greedy decoding gives the same tokens, the recorded
log-probs are a full forward's, and the per-row cache trimming keeps each row's cache its own.

Exactness is tested on a Markov table model (logits depend only on a row's last token), whose
exact distribution over the first three tokens is a product of table rows: a chi-square goodness
of fit at temperature 1, at 0.7 and with top-k, with drafts that are mostly right and mostly
wrong. The cache handling is tested on a random transformer, where a wrong cache changes the
logits, and whose rows fall into loops their drafts predict, each at its own time (ragged
acceptance): its recorded log-probs against one forward of prompt + completion (float32 and
4-bit), and a kept cache against a fresh prefill.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache
from test_compiled_decode import TableModel  # logits = table[token], at every position

from mlx_rlaif.backends.mlx import speculative
from mlx_rlaif.backends.mlx.decode import merged_cache, picker
from mlx_rlaif.backends.mlx.rollout import generate, prefill
from mlx_rlaif.backends.sampling import SamplingParams
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.testing.randmodel import make_model_dir

ROOT = Path(__file__).resolve().parent.parent


def test_ngram_index_drafts_the_latest_longest_match() -> None:
    idx = speculative.NgramIndex([6, 7, 8, 1, 6, 7, 9, 2, 6, 7])
    assert idx.draft(3) == [9, 2, 6]  # (6, 7): its latest earlier occurrence, before 9
    idx = speculative.NgramIndex([5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7])
    assert idx.draft(2) == [8, 1]  # the trigram (5, 6, 7) wins over the later bigram (6, 7)
    assert idx.draft(0) == []
    assert speculative.NgramIndex([1, 2, 3, 4]).draft(4) == []  # nothing repeats
    idx = speculative.NgramIndex([1, 2, 1])
    assert idx.draft(4) == []  # a unigram match is not enough (MIN_NGRAM = 2)
    idx.extend([2])
    assert idx.draft(4) == [1, 2]  # (1, 2) continues with what follows it, up to the end


def test_accept_keeps_the_draft_while_the_sampler_agrees() -> None:
    eos = {0}
    assert speculative.accept([4, 5, 6], [4, 5, 6, 7], eos, 99) == 4  # all kept, plus one
    assert speculative.accept([4, 5, 6], [4, 9, 6, 7], eos, 99) == 2  # 9 replaces the draft
    assert speculative.accept([4, 5, 6], [3, 5, 6, 7], eos, 99) == 1
    assert speculative.accept([], [3], eos, 99) == 1
    assert speculative.accept([4, 0, 6], [4, 0, 6, 7], eos, 99) == 2  # an EOS ends the row
    assert speculative.accept([4, 5, 6], [4, 5, 6, 7], eos, 2) == 2  # the row's budget


def _markov(vocab: int, right: float) -> np.ndarray:
    """Row a: `right` on a + 1 (what the cyclic prompt drafts), 0.2 on a + 2, the rest spread
    unevenly (no ties: top-k is well defined)."""
    rest = np.arange(1.0, vocab - 1)
    p = np.zeros((vocab, vocab))
    for a in range(vocab):
        others = [b for b in range(vocab) if b not in ((a + 1) % vocab, (a + 2) % vocab)]
        p[a, others] = (1 - right - 0.2) * rest / rest.sum()
        p[a, (a + 1) % vocab], p[a, (a + 2) % vocab] = right, 0.2
    return p


def _next(p: np.ndarray, temperature: float, top_k: int, top_p: float = 1.0) -> np.ndarray:
    """The sampler's next-token distribution of each table row (top-p as mlx-lm's: the tokens
    whose cumulative probability, smallest first, exceeds 1 - top_p)."""
    q = p ** (1 / temperature)
    q = q / q.sum(axis=1, keepdims=True)
    if top_k:
        cut = -np.sort(-q, axis=1)[:, top_k - 1:top_k]
        q = np.where(q >= cut, q, 0)
    if top_p < 1:
        order = np.argsort(q, axis=1)
        cum = np.cumsum(np.take_along_axis(q, order, axis=1), axis=1)
        keep = np.zeros_like(q, dtype=bool)
        np.put_along_axis(keep, order, cum > 1 - top_p, axis=1)
        q = np.where(keep, q, 0)
    return q / q.sum(axis=1, keepdims=True)


def _chi2_critical(df: int, z: float = 3.29) -> float:
    """The chi-square quantile at the normal quantile z (Wilson-Hilferty; z 3.29: p = 5e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("right,temperature,top_k,top_p", [
    (0.7, 1.0, 0, 1.0), (0.7, 0.7, 0, 1.0), (0.7, 1.0, 3, 1.0), (0.7, 1.0, 0, 0.95),
    (0.15, 1.0, 0, 1.0)])
def test_first_tokens_follow_the_models_exact_distribution(right: float, temperature: float,
                                                          top_k: int, top_p: float) -> None:
    """4,000 rows drafted from a cyclic prompt: the triples (t1, t2, t3) fit the exact
    distribution (chi-square, cells of expected count 5 or more), and the recorded log-probs
    are the sampler's (at the temperature, over the full distribution)."""
    vocab, n = 6, 4000
    p = _markov(vocab, right)
    model = TableModel(mx.array(np.log(p), dtype=mx.float32))
    history = [0, 1, 2, 3, 4, 5] * 3 + [0]
    cache = merged_cache([[KVCache()] for _ in range(n)])
    mx.random.seed(11)
    out = speculative.decode(model, cache, [0] * n, [history] * n, 3,
                             picker(temperature, top_p=top_p, top_k=top_k), set(), 4)
    assert out.drafted >= 2 * n and out.accepted > (0.3 if right > 0.5 else 0.01) * n
    q = _next(p, temperature, top_k, top_p)
    exact = q[0][:, None, None] * q[:, :, None] * q[None, :, :]  # P(t1, t2, t3) from token 0
    seen = np.zeros_like(exact)
    for t in out.tokens:
        seen[tuple(t)] += 1
    expected = exact.ravel() * n
    big = expected >= 5
    cells = np.append(seen.ravel()[big], seen.ravel()[~big].sum())
    want = np.append(expected[big], expected[~big].sum())
    cells, want = cells[want > 0], want[want > 0]
    stat = float(((cells - want) ** 2 / want).sum())
    assert stat < _chi2_critical(len(cells) - 1), (stat, len(cells))
    logq = np.log(_next(p, temperature, 0))  # log-probs at T over the full distribution
    for t, lp in zip(out.tokens[:200], out.logprobs[:200], strict=True):
        prev = [0, *t[:-1]]
        np.testing.assert_allclose(lp, logq[prev, t], atol=1e-5)


def test_lengths_and_token_counts_follow_the_model_to_the_end() -> None:
    """Aggregate statistics over whole completions, with an EOS (token 5, on the drafted cycle)
    and a 12-token budget: each row's length and its count of every token (i.i.d. over rows)
    have the exact chain's means (z-tests at 4.5 standard errors)."""
    vocab, n, budget, eos = 6, 3000, 12, 5
    p = _markov(vocab, 0.7)
    model = TableModel(mx.array(np.log(p), dtype=mx.float32))
    history = [0, 1, 2, 3, 4] * 4 + [0]
    cache = merged_cache([[KVCache()] for _ in range(n)])
    mx.random.seed(4)
    out = speculative.decode(model, cache, [0] * n, [history] * n, budget, picker(1.0), {eos}, 4)
    assert out.accepted > n and any(f == "stop" for f in out.finish)
    alive = p[0].copy()  # P(token t = x, no EOS before it), t = 1
    length, counts = 0.0, np.zeros(vocab)
    for _ in range(budget):
        length += alive.sum()
        counts += alive
        alive = np.where(np.arange(vocab) == eos, 0.0, alive) @ p
    lengths = np.array([len(t) for t in out.tokens], dtype=float)
    per_row = np.array([np.bincount(t, minlength=vocab) for t in out.tokens], dtype=float)
    for got, want in [(lengths, length), *((per_row[:, x], counts[x]) for x in range(vocab))]:
        assert abs(got.mean() - want) < 4.5 * got.std() / math.sqrt(n) + 1e-9, (got.mean(), want)


def test_wrong_drafts_leave_the_same_distribution_as_no_drafts() -> None:
    """A table whose drafted continuation is never likely: drafting changes nothing but the
    work (same lengths and first-token frequencies as decoding without drafts)."""
    vocab, n = 6, 3000
    p = _markov(vocab, 0.05)
    model = TableModel(mx.array(np.log(p), dtype=mx.float32))
    history = [0, 1, 2, 3, 4, 5] * 3 + [0]
    cache = merged_cache([[KVCache()] for _ in range(n)])
    mx.random.seed(2)
    out = speculative.decode(model, cache, [0] * n, [history] * n, 2, picker(1.0), set(), 4)
    first = np.bincount([t[0] for t in out.tokens], minlength=vocab) / n
    np.testing.assert_allclose(first, p[0], atol=4 * math.sqrt(0.25 / n))
    assert out.forwards == 2 * n - out.accepted  # a kept draft saves its row one pass


@pytest.fixture(scope="module")
def micro(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A random 2-layer model (float32) and prompts of a repeated random segment: it falls into
    loops that its drafts predict, each row at its own time (ragged acceptance)."""
    model, tok = mlx_lm.load(str(make_model_dir(tmp_path_factory.mktemp("spec") / "m", "micro", seed=3)))
    rng = np.random.default_rng(0)
    return model, tok, [list(map(int, rng.integers(3, 500, 12))) * 2 for _ in range(6)]


def _rollouts(model: nn.Module, prompts: list, temperature: float, draft: int, seed: int = 0
              ) -> tuple[list[dict], dict]:
    mx.random.seed(seed)
    params = SamplingParams(temperature=temperature, max_new_tokens=40, draft_tokens=draft)
    return generate(model, prompts, 3, params, [2])


def test_greedy_tokens_are_the_same_with_drafts(micro: tuple) -> None:
    model, _, prompts = micro
    plain, _ = _rollouts(model, prompts, 0.0, 0)
    drafted, stats = _rollouts(model, prompts, 0.0, 4)
    assert [s["tokens"] for s in drafted] == [s["tokens"] for s in plain]
    assert stats["gen/tokens_per_pass"] > 1.5 and stats["gen/draft_accept"] > 0.5


@pytest.mark.parametrize("bits", [0, 4])
def test_recorded_logprobs_are_a_full_forwards(micro: tuple, bits: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows accept different numbers of tokens and are rolled per row: each row's recorded
    log-probs (T = 0.5) still equal one forward of its prompt + completion, which a cache
    holding another row's positions, a rejected token or a wrong position would not."""
    model, _, prompts = micro
    if bits:
        model = copy.deepcopy(model)
        nn.quantize(model, group_size=32, bits=bits)
    ragged = []
    trim = speculative._trim_rows
    monkeypatch.setattr(speculative, "_trim_rows",
                        lambda cache, junk: (ragged.append(max(junk) > min(junk)),
                                             trim(cache, junk)))
    seqs, stats = _rollouts(model, prompts, 0.5, 4, seed=3)
    assert sum(ragged) >= 5 and stats["gen/draft_accept"] > 0.3
    worst = 0.0
    for i, s in enumerate(seqs):
        prompt = prompts[i // 3]
        logits = model(mx.array(prompt + s["tokens"])[None])[0, len(prompt) - 1:-1] / 0.5
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        ref = mx.take_along_axis(lp, mx.array(s["tokens"])[:, None], axis=-1)[:, 0]
        worst = max(worst, float(mx.abs(ref - mx.array(s["logprobs"])).max()))
    assert worst < 1e-4


def test_a_kept_cache_holds_its_rows_prompt_and_tokens(micro: tuple) -> None:
    model, _, prompts = micro
    caches = [prefill(model, p) for p in prompts]
    mx.random.seed(5)
    out = speculative.decode(model, merged_cache(caches), [p[-1] for p in prompts], prompts, 30,
                             picker(0.5), {2}, 4, keep_caches=True)
    assert out.accepted > 10
    for p, toks, kept in zip(prompts, out.tokens, out.caches, strict=True):
        seq = p + toks
        n = kept[0].offset
        assert len(p) - 1 <= n < len(seq)
        fresh = prefill(model, seq[:n + 1])
        for a, b in zip(kept, fresh, strict=True):
            np.testing.assert_allclose(np.array(a.state[0][..., :n, :]),
                                       np.array(b.state[0][..., :n, :]), atol=1e-4)


def test_off_in_yaml_is_off_and_torch_is_refused() -> None:
    """YAML 1.1 reads `off` as false: `speculative: off` must still mean off (it was refused as
    `False is not one of off, ngram`)."""
    assert load(None, ["generation.speculative=off"]).generation.speculative == "off"
    cfg = load(None, ["generation.speculative=ngram", "generation.draft_tokens=3"])
    assert SamplingParams.from_config(cfg.generation).draft_tokens == 3
    assert SamplingParams.from_config(load(None, []).generation).draft_tokens == 0
    with pytest.raises(ConfigError, match="generation.speculative ngram is MLX-only"):
        check(load(None, ["generation.speculative=ngram", "model.backend=torch"]))


@pytest.mark.slow
def test_a_drafted_run_trains_with_the_samplers_logprobs(tmp_path: Path) -> None:
    """Two steps of the quickstart with drafting, 4-bit, two-turn conversations: the sampler's
    log-probs agree with the trainer's (policy/sampler_kl at float rounding, as without
    drafting: about 1e-10 here), and the drafting metrics are logged."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "train", "--config",
                        "configs/quickstart.yaml", "--output-dir", str(out), "--no-dashboard",
                        "--max-steps", "2", "--set", "data.eval_file=",
                        "--set", "logging.baseline_eval_batches=0",
                        "--set", "generation.speculative=ngram", "--set", "model.quantize=4",
                        "--set", "generation.max_turns=2", "--set", "logging.tensorboard=false"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["policy/sampler_kl"] < 1e-6 and row["policy/sampler_far_frac"] == 0
        assert row["gen/tokens_per_pass"] >= 1.0 and 0 <= row["gen/draft_accept"] <= 1


def test_a_rows_draft_length_follows_its_acceptance() -> None:
    assert speculative.next_size(4, 4, 4, 8) == 6  # kept whole: 2 more
    assert speculative.next_size(7, 7, 7, 8) == 8  # ... up to draft_tokens
    assert speculative.next_size(4, 4, 2, 8) == 3  # cut short: 1 less
    assert speculative.next_size(1, 1, 0, 8) == 1  # ... down to 1
    assert speculative.next_size(4, 2, 2, 8) == 6  # a shorter draft (the match ran out), kept
