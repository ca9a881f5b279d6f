"""Log-probs in bounded memory (backends/mlx/loss.py): through the model's own body and head,
chunk by chunk with each chunk's logits recomputed in the backward pass, in one pass of the
transformer. Values and gradients equal the full computation, compiled or not; the transformer
runs forward once per micro-batch; under the phase's memory limit the vocabulary-sized memory
does not grow with the sequences."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.batch import build_shared
from mlx_rlaif.backends.mlx import loss
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import RLConfig
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.testing.randmodel import make_model_dir


def _perturb(model: nn.Module) -> None:
    mx.random.seed(7)
    for _, m in lora_layers(model):
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)


def _rollouts(n: int, width: int, vocab: int, seed: int = 0) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = tuple(int(t) for t in rng.integers(3, vocab, size=5 + (i // 2)))
        toks = tuple(int(t) for t in rng.integers(3, vocab, size=width - (i % 3)))
        out.append(Rollout(Task(f"t{i // 2}", "p"), prompt, toks,
                           tuple(float(x) for x in rng.normal(-3, 0.1, len(toks))), "", "stop",
                           0.8))
    return out


def _batch(rollouts: list[Rollout]) -> dict[str, mx.array]:
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    ref = [np.array(r.logprobs) - 0.05 for r in rollouts]
    return mx_batch(build_shared(rollouts, np.linspace(-1, 1, len(rollouts)), w, ref))


def test_the_split_is_the_models_own_head(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    split = policy.split
    assert split is not None and split.body is policy.model.model and split.vocab == 512
    x = mx.array([[5, 9, 13]])
    np.testing.assert_allclose(np.array(split.head(split.body(x))), np.array(policy.model(x)),
                               atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("entropy_coef", [0.01, 0.0])  # recomputed logits; d logp in the forward
def test_chunked_values_and_gradients_equal_the_full_computation(
        micro_model: Path, compiled: bool, entropy_coef: float) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    mb = _batch(_rollouts(6, 11, 512))
    rl = RLConfig(entropy_coef=entropy_coef, kl_penalty=0.1)
    full = nn.value_and_grad(policy.model, partial(loss.rl_loss, rl=rl, kl_penalty=0.1,
                                                   temperature=0.8))
    (l_full, aux_full), g_full = full(policy.model, mb)
    assert loss.chunk_tokens(512, 1e-9) == 1 and len(loss.chunk_slices(policy.split, 66, 1e-9)) > 1
    chunked = nn.value_and_grad(policy.model, partial(  # chunks of one position
        loss.rl_loss, rl=rl, kl_penalty=0.1, temperature=0.8, split=policy.split, limit_mb=1e-9))
    fn = (mx.compile(lambda b: chunked(policy.model, b), inputs=[policy.model.state],
                     outputs=[policy.model.state]) if compiled
          else lambda b: chunked(policy.model, b))
    (l_chunk, aux_chunk), g_chunk = fn(mb)
    lp_full, ent_full = loss.micro_batch_stats(policy.model, None, mb, 0.8)
    lp, ent = loss.micro_batch_stats(policy.model, policy.split, mb, 0.8, 1e-9)  # reference
    np.testing.assert_allclose(np.array(lp), np.array(lp_full), atol=2e-5)
    np.testing.assert_allclose(np.array(ent), np.array(ent_full), atol=2e-5)
    assert l_chunk.item() == pytest.approx(l_full.item(), rel=1e-5, abs=1e-7)
    for k in ("entropy", "kl", "ratio"):
        assert aux_chunk[k].item() == pytest.approx(aux_full[k].item(), rel=1e-5), k
    flat_full, flat_chunk = dict(tree_flatten(g_full)), dict(tree_flatten(g_chunk))
    assert max(np.abs(np.array(v)).max() for v in flat_full.values()) > 1e-4
    for k, v in flat_full.items():
        scale = np.abs(np.array(v)).max()
        np.testing.assert_allclose(np.array(flat_chunk[k]), np.array(v), rtol=1e-4,
                                   atol=max(1e-7, 1e-4 * scale), err_msg=k)


def test_one_transformer_forward_per_micro_batch(micro_model: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked update runs the body forward once per micro-batch and iteration (the old one
    ran it twice: once for the hidden states, once inside the gradient). Uncompiled, so each
    call of the body is one forward of the graph."""
    from mlx_rlaif.backends.mlx import memory, update
    from mlx_rlaif.config import load

    monkeypatch.setattr(loss, "LOGITS_CHUNK_MB", 0)  # chunks of one position
    monkeypatch.setattr(memory, "LOGITS_CHUNK_MB", 0, raising=False)
    monkeypatch.setattr(update, "compiled", lambda fn, model, *more: fn)
    policy = load_policy(str(micro_model))
    memory.shape_of(policy.model)  # its caches' sizes: measured once per model, not counted
    body = type(policy.split.body)
    calls = []
    real = body.__call__
    monkeypatch.setattr(body, "__call__", lambda self, *a, **k: calls.append(1) or real(
        self, *a, **k))
    cfg = load(None, ["training.share_prompt=false", "training.micro_batch_size=2",
                      "rl.num_iterations=2"])
    rollouts = _rollouts(6, 9, 512)
    opt = update.make_optimizer(cfg.training, 10)
    ref = [np.array(r.logprobs) for r in rollouts]
    m, _ = update.update(policy, opt, rollouts, np.linspace(-1, 1, 6), ref, cfg, 0.1)
    assert np.isfinite(m["loss/total"])
    assert len(calls) == 3 * 2  # 3 micro-batches x 2 iterations


@pytest.fixture(scope="module")
def wide_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("wide") / "model", "wide-vocab", seed=1)


def _peak_gb(policy, n: int, width: int, limit_mb: float) -> float:
    from mlx_rlaif.backends.mlx import memory
    from mlx_rlaif.backends.mlx.update import grad_fn
    from mlx_rlaif.config import load

    mb = _batch(_rollouts(n, width, 65536, seed=n))
    fn = grad_fn(policy.model, load(None, []), policy.split)
    mx.eval(mb)
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    with memory.limited(before + int(0.3e9)):
        mx.eval(fn(mb, mx.array(0.1)))
    return (mx.get_peak_memory() - before) / 1e9


def test_vocabulary_memory_is_bounded_by_a_chunk(wide_vocab: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """At a 65,536-token vocabulary the float32 logits of 8 x 512 positions take 1.07 GB (the
    one-pass loss keeps several arrays of that size). Through chunks of 64 MB of logits, under a
    memory limit 0.3 GB over what is held (as the update runs: memory.limited), the peak stays
    near the limit: 4 x 256 and 8 x 512 positions peak alike. Without chunks the same limit
    cannot hold it (MLX only waits for running work: it never fails an allocation)."""
    policy = load_policy(str(wide_vocab))
    small = _peak_gb(policy, 4, 256, 64)
    large = _peak_gb(policy, 8, 512, 64)
    assert large < 0.45, large
    assert large - small < 0.1, (small, large)
    monkeypatch.setattr(loss, "chunk_tokens", lambda vocab, limit_mb=None: 10**9)  # one chunk
    assert _peak_gb(policy, 8, 512, 64) > 1.0
