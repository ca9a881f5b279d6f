"""The shared-prompt forward (each prompt once for its G completions) against the full forward:
same log-probs, same loss gradient, same update, same reference; unsupported caches detected."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import RotatingKVCache

from mlx_rlaif import checkpoint, shared_prompt
from mlx_rlaif.backends.mlx import load_policy, lora_modules
from mlx_rlaif.batch import aggregation_weights, build, build_group, prompt_groups
from mlx_rlaif.config import load as load_config
from mlx_rlaif.losses import logprobs_and_entropy, rl_loss
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.train import Run, make_optimizer, reference_logprobs, update


def _perturb(model: nn.Module) -> None:
    mx.random.seed(1)
    for m in lora_modules(model):
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())


def _rollouts(vocab: int = 500) -> list[Rollout]:
    """Two prompts (7 and 4 tokens) with completions of uneven lengths, rows interleaved."""
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(3, vocab, 7).tolist()), tuple(rng.integers(3, vocab, 4).tolist())]
    out = []
    for i, n in enumerate([5, 9, 3, 6, 1]):
        p = prompts[i % 2]
        toks = tuple(rng.integers(3, vocab, n).tolist())
        out.append(Rollout(Task(f"t{i % 2}", "p"), p, toks, tuple(rng.normal(-5, 1, n).tolist()),
                           "", "stop", 1.0))
    return out


def test_groups_follow_prompts() -> None:
    assert prompt_groups(_rollouts()) == [[0, 2, 4], [1, 3]]
    with pytest.raises(ValueError, match="different prompts"):
        build_group(_rollouts()[:2], [0, 0], [1, 1])


def test_logprobs_equal_the_full_forward(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = _rollouts()
    full = build(rollouts, [0.0] * 5, [1.0] * 5)
    lp_full = np.array(logprobs_and_entropy(policy.model(full["tokens"][:, :-1]),
                                            full["tokens"][:, 1:])[0])
    for rows in prompt_groups(rollouts):
        g = build_group([rollouts[i] for i in rows], [0.0] * len(rows), [1.0] * len(rows))
        logits = shared_prompt.logits(policy.model, g["prefix"], g["tokens"][:, :-1])
        lp = np.array(logprobs_and_entropy(logits, g["tokens"][:, 1:])[0])
        for k, i in enumerate(rows):
            r, start = rollouts[i], len(rollouts[i].prompt_tokens) - 1
            want = lp_full[i, start:start + len(r.tokens)]
            np.testing.assert_allclose(lp[k, :len(r.tokens)], want, atol=2e-5)
            assert want.min() < -1.0  # not a trivially flat distribution


def test_loss_gradient_equals_the_full_forward(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = _rollouts()
    adv = np.linspace(-1, 1, 5)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 10)
    ref = [np.array(r.logprobs) - 0.2 for r in rollouts]
    rl = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3"]).rl
    vg = nn.value_and_grad(policy.model, partial(rl_loss, rl=rl, kl_coef=0.1, temperature=0.8))
    (loss_full, _), g_full = vg(policy.model, build(rollouts, adv, w, ref))
    loss, grads = 0.0, None
    for rows in prompt_groups(rollouts):
        mb = build_group([rollouts[i] for i in rows], adv[rows], [w[i] for i in rows],
                         [ref[i] for i in rows])
        (part, _), g = vg(policy.model, mb)
        loss += part.item()
        grads = g if grads is None else tree_map(mx.add, grads, g)
    assert loss == pytest.approx(loss_full.item(), rel=1e-5, abs=1e-7)
    flat, flat_full = dict(tree_flatten(grads)), dict(tree_flatten(g_full))
    assert max(np.abs(np.array(v)).max() for v in flat_full.values()) > 1e-4
    for k, v in flat_full.items():
        np.testing.assert_allclose(np.array(flat[k]), np.array(v), atol=2e-5, rtol=1e-3)


def _update(micro_model: Path, tmp: Path, share: bool, rollouts: list[Rollout]) -> dict:
    cfg = load_config(None, [f"training.share_prompt={str(share).lower()}", "rl.kl_penalty=0.1"])
    policy = load_policy(str(micro_model), cfg.lora, seed=0)
    _perturb(policy.model)
    run = Run(cfg, policy, None, make_optimizer(cfg, 10), tmp,
              checkpoint.LoopState(kl_coef=0.1), lambda t: [])
    ref = reference_logprobs(policy.model, rollouts, cfg)
    update(run, rollouts, np.linspace(-1, 1, len(rollouts)), ref)
    params = {k: np.array(v) for k, v in tree_flatten(policy.model.trainable_parameters())}
    return {"ref": ref, "params": params}


def test_update_and_reference_equal_with_and_without_sharing(micro_model: Path,
                                                             tmp_path: Path) -> None:
    rollouts = _rollouts()
    on, off = (_update(micro_model, tmp_path, s, rollouts) for s in (True, False))
    for a, b, r in zip(on["ref"], off["ref"], rollouts, strict=True):
        assert a.shape == b.shape == (len(r.tokens),)
        np.testing.assert_allclose(a, b, atol=2e-5)
    for k, v in off["params"].items():
        np.testing.assert_allclose(on["params"][k], v, atol=1e-6, rtol=1e-4)


class _Rotating(nn.Module):
    """A model whose cache is a sliding window: the full forward must be used."""

    layers = [nn.Linear(2, 2)]

    def make_cache(self) -> list:
        return [RotatingKVCache(max_size=8)]


def test_supported_only_with_plain_kv_caches(micro_model: Path) -> None:
    assert shared_prompt.supported(load_policy(str(micro_model)).model)
    assert not shared_prompt.supported(_Rotating())
