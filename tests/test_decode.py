"""The decode loop (decode.py): the inverse-CDF sampler draws from softmax(logits / T) and reports
its log-probs, greedy and top-k go as documented, rows stop at EOS and leave the batch cache, and
prefilled groups decode as the plain forward of each whole row would, batched prefills as
per-prompt ones."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from mlx_rlaif.backends.mlx.decode import decode, merged_cache, picker
from mlx_rlaif.backends.mlx.loss import token_logprobs
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.mlx.rollout import generate
from mlx_rlaif.backends.sampling import SamplingParams
from mlx_rlaif.cpu.kernels import fast_cpu_kernels
from mlx_rlaif.testing.randmodel import make_model_dir

PROBS = [0.5, 0.25, 0.125, 0.125, 0.0]


def _logits(rows: int) -> mx.array:
    return mx.array(np.log(np.array([PROBS] * rows) + 1e-30).astype(np.float32))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampler_draws_from_the_tempered_softmax(temperature: float) -> None:
    mx.random.seed(0)
    n = 40000
    tok, logp = picker(temperature)(_logits(n))
    p = np.array(PROBS) ** (1 / temperature)
    p /= p.sum()  # T = 0.5: 16/22, 4/22, 1/22, 1/22, 0
    freq = np.bincount(np.array(tok), minlength=5) / n
    np.testing.assert_allclose(freq, p, atol=4 * math.sqrt(0.25 / n))
    assert freq[4] == 0.0  # a zero-probability token is never drawn
    np.testing.assert_allclose(np.array(logp), np.log(p[np.array(tok)]), atol=1e-5)


def test_greedy_and_top_k_report_full_distribution_logprobs() -> None:
    logits = mx.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tok, logp = picker(0.0)(logits)  # temperature 0: argmax, log-probs at temperature 1
    assert tok.tolist() == [1, 0]
    np.testing.assert_allclose(np.array(logp), [2 - math.log(1 + math.e**2 + math.e),
                                                3 - math.log(math.e**3 + 2)], atol=1e-6)
    tok, logp = picker(2.0, top_k=1)(logits)  # truncated to one token, ratio vs the full T=2
    assert tok.tolist() == [1, 0]
    np.testing.assert_allclose(np.array(logp)[1], 1.5 - math.log(math.e**1.5 + 2), atol=1e-6)
    mx.random.seed(1)
    tok, _ = picker(1.0, top_k=50)(mx.zeros((2000, 3)))  # top-k beyond the vocabulary: no cut
    assert sorted(set(tok.tolist())) == [0, 1, 2]


class CountingModel(nn.Module):
    """Next token = input + 1 (mod 8) with certainty; writes one key per row per step into its
    cache, so a cache that lost track of the rows fails the shape checks."""

    def __call__(self, x: mx.array, cache: list) -> mx.array:
        kv = mx.zeros((x.shape[0], 1, x.shape[1], 2))
        keys, _ = cache[0].update_and_fetch(kv, kv)
        assert keys.shape[0] == x.shape[0]
        return 30.0 * mx.eye(8)[(x + 1) % 8]


def test_rows_stop_at_eos_and_leave_the_batch() -> None:
    caches = [[KVCache()] for _ in range(3)]
    for c, n in zip(caches, (2, 4, 3), strict=True):  # prompts of different lengths
        c[0].update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))
    out = decode(CountingModel(), merged_cache(caches), [5, 1, 2], 6, picker(1.0), {7})
    assert out.tokens == [[6, 7], [2, 3, 4, 5, 6, 7], [3, 4, 5, 6, 7]]
    assert out.finish == ["stop", "stop", "stop"]
    assert out.widths == [3, 3, 2, 2, 2, 1]  # row 0 leaves after step 2, row 2 after step 5
    np.testing.assert_allclose(np.concatenate(out.logprobs), 0.0, atol=1e-6)
    short = decode(CountingModel(), merged_cache([[KVCache()]]), [0], 3, picker(1.0), {7})
    assert short.tokens == [[1, 2, 3]] and short.finish == ["length"]
    cache = merged_cache([[KVCache()]])
    none = decode(CountingModel(), cache, [0], 0, picker(1.0), {7})  # no step at all
    assert none.tokens == [[]] and none.widths == [] and cache[0].keys is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefilled_groups_match_the_full_forward(micro_model: Path, tmp_path: Path,
                                                 dtype: str) -> None:
    """The sampler's log-probs are the trainer's (the PPO ratio starts at 1): decoding's RoPE and
    attention kernels round as the full forward does, bfloat16 included."""
    path = micro_model if dtype == "float32" else make_model_dir(tmp_path / "m", "micro", 3, dtype)
    policy = load_policy(str(path))
    prompts = [[3, 17, 29, 40, 51], [8, 9]]
    params = SamplingParams(temperature=0.7, max_new_tokens=12, completion_batch_size=3)
    mx.random.seed(2)
    seqs, stats = generate(policy.model, prompts, 2, params, eos_ids=[])
    assert stats["gen/decode_width"] == 3  # 4 rows in batches of 3 and 1
    for i, s in enumerate(seqs):
        assert len(s["tokens"]) == 12 and s["finish_reason"] == "length"
        row = mx.array([prompts[i // 2] + s["tokens"]])
        with fast_cpu_kernels(policy.model):  # as the update computes them
            logp, _ = token_logprobs(policy.model, row, temperature=0.7)
        n = len(prompts[i // 2])
        np.testing.assert_allclose(np.array(logp)[0, n - 1:], s["logprobs"],
                                   atol=2e-4 if dtype == "float32" else 2e-3)


@pytest.mark.parametrize("prompts", [[[5], [7]], [[5], [7, 8, 9, 10]], [[3, 4, 5], [6, 7]]])
def test_batched_prefill_decodes_as_per_prompt_prefills(micro_model: Path,
                                                        prompts: list[list[int]]) -> None:
    """The prompts' one left-padded prefill (1-token prompts: nothing to prefill) gives the
    tokens and log-probs of prefilling each prompt on its own and merging the caches."""
    policy = load_policy(str(micro_model))
    out = {}
    for once in (True, False):  # prefill_once=False: each row prefilled on its own, merged
        mx.random.seed(1)
        seqs, _ = generate(policy.model, prompts, 2,
                           SamplingParams(temperature=1.0, max_new_tokens=6, prefill_once=once),
                           eos_ids=[])
        out[once] = seqs
    for a, b in zip(out[True], out[False], strict=True):
        assert a["tokens"] == b["tokens"]
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)


@pytest.mark.parametrize("shared_cores", [False, True])
def test_the_prompts_prefill_on_every_core_unless_scoring_shares_them(
        micro_model: Path, monkeypatch: pytest.MonkeyPatch, shared_cores: bool) -> None:
    """The prefill's products have many rows: every core (`train_threads`), except while
    scoring runs alongside (0: the count is left as it is)."""
    import contextlib

    from mlx_rlaif.backends.mlx import rollout

    asked = []

    @contextlib.contextmanager
    def record(n: int | None = None):
        asked.append(n)
        yield

    monkeypatch.setattr(rollout, "blas_threads", record)
    policy = load_policy(str(micro_model))
    generate(policy.model, [[3, 4, 5], [6, 7]], 2,
             SamplingParams(temperature=1.0, max_new_tokens=2), eos_ids=[],
             shared_cores=shared_cores)
    assert asked == [0 if shared_cores else rollout.train_threads()]
