"""The shared-prompt forward (each prompt once for its G completions) against the full forward:
same log-probs, same loss gradient, same update, same reference (the base model's forward);
unsupported caches detected."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten
from mlx_lm.models.cache import RotatingKVCache

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.batch import build, build_shared, prompt_groups
from mlx_rlaif.backends.mlx import shared_prompt
from mlx_rlaif.backends.mlx import update as update_module
from mlx_rlaif.backends.mlx.loss import logprobs_and_entropy, rl_loss
from mlx_rlaif.backends.mlx.policy import load_policy, lora_disabled
from mlx_rlaif.backends.mlx.update import make_optimizer, reference_logprobs, update
from mlx_rlaif.config import load as load_config
from mlx_rlaif.records import Rollout, Task


def _perturb(model: nn.Module) -> None:
    mx.random.seed(1)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())


def _rollouts(vocab: int = 500) -> list[Rollout]:
    """Three prompts (7, 4 and 1 tokens) with completions of uneven lengths, rows interleaved."""
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(3, vocab, n).tolist()) for n in (7, 4, 1)]
    out = []
    for i, n in enumerate([5, 9, 3, 6, 1, 4, 2]):
        p = prompts[i % 3]
        toks = tuple(rng.integers(3, vocab, n).tolist())
        out.append(Rollout(Task(f"t{i % 3}", "p"), p, toks, tuple(rng.normal(-5, 1, n).tolist()),
                           "", "stop", 1.0))
    return out


def test_groups_and_layout() -> None:
    rollouts = _rollouts()
    assert prompt_groups(rollouts) == [[0, 3, 6], [1, 4], [2, 5]]
    b = mx_batch(build_shared(rollouts, [0.0] * 7, [1.0] * 7))
    assert b["prefix"].shape == (3, 6) and b["prefix_len"].tolist() == [6, 3, 0]
    assert b["group"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert b["prefix"][1].tolist()[:3] == [0, 0, 0]  # left padding
    assert b["tokens"][2, 0].item() == rollouts[2].prompt_tokens[-1]
    assert b["mask"].sum(axis=1).tolist() == [5, 9, 3, 6, 1, 4, 2]


def _full_logprobs(model: nn.Module, rollouts: list[Rollout]) -> list[np.ndarray]:
    full = mx_batch(build(rollouts, [0.0] * len(rollouts), [1.0] * len(rollouts)))
    lp = np.array(logprobs_and_entropy(model(full["tokens"][:, :-1]), full["tokens"][:, 1:])[0])
    return [lp[i, len(r.prompt_tokens) - 1:len(r.prompt_tokens) - 1 + len(r.tokens)]
            for i, r in enumerate(rollouts)]


@pytest.mark.parametrize("rows", [list(range(7)), [0, 3, 6], [4, 2]])
def test_logprobs_equal_the_full_forward(micro_model: Path, rows: list[int]) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = [_rollouts()[i] for i in rows]
    want = _full_logprobs(policy.model, rollouts)
    b = mx_batch(build_shared(rollouts, [0.0] * len(rows), [1.0] * len(rows)))
    logits = shared_prompt.logits(policy.model, b, b["tokens"][:, :-1])
    lp = np.array(logprobs_and_entropy(logits, b["tokens"][:, 1:])[0])
    for i, r in enumerate(rollouts):
        np.testing.assert_allclose(lp[i, :len(r.tokens)], want[i], atol=2e-5)
        assert want[i].min() < -1.0  # not a trivially flat distribution


def test_loss_gradient_equals_the_full_forward(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = _rollouts()
    adv = np.linspace(-1, 1, 7)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 10)
    ref = [np.array(r.logprobs) - 0.2 for r in rollouts]
    rl = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3"]).rl
    vg = nn.value_and_grad(policy.model, partial(rl_loss, rl=rl, kl_penalty=0.1, temperature=0.8))
    (loss_full, _), g_full = vg(policy.model, mx_batch(build(rollouts, adv, w, ref)))
    (loss, _), grads = vg(policy.model, mx_batch(build_shared(rollouts, adv, w, ref)))
    assert loss.item() == pytest.approx(loss_full.item(), rel=1e-5, abs=1e-7)
    flat, flat_full = dict(tree_flatten(grads)), dict(tree_flatten(g_full))
    assert max(np.abs(np.array(v)).max() for v in flat_full.values()) > 1e-4
    for k, v in flat_full.items():
        np.testing.assert_allclose(np.array(flat[k]), np.array(v), atol=2e-5, rtol=1e-3)
        assert np.isfinite(np.array(flat[k])).all()


def test_reference_is_the_base_models_forward(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts = _rollouts()
    ref = reference_logprobs(policy.model, rollouts, load_config(None, []))
    with lora_disabled(policy.model):
        base = _full_logprobs(policy.model, rollouts)
    tuned = _full_logprobs(policy.model, rollouts)
    for a, b in zip(ref, base, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)
    assert max(np.abs(a - c).max() for a, c in zip(ref, tuned, strict=True)) > 1e-3


def _update(micro_model: Path, tmp: Path, share: bool, rollouts: list[Rollout],
            micro_batch: int = 0) -> dict:
    cfg = load_config(None, [f"training.share_prompt={str(share).lower()}", "rl.kl_penalty=0.1",
                             f"training.micro_batch_size={micro_batch}"])
    policy = load_policy(str(micro_model), cfg.lora, seed=0)
    _perturb(policy.model)
    ref = reference_logprobs(policy.model, rollouts, cfg)
    m, _ = update(policy, make_optimizer(cfg.training, 10), rollouts,
                  np.linspace(-1, 1, len(rollouts)), ref, cfg, 0.1)
    assert m["kl/mean"] > 1e-4  # the perturbed adapters moved the policy off the reference
    params = {k: np.array(v) for k, v in tree_flatten(policy.model.trainable_parameters())}
    return {"ref": ref, "params": params, "metrics": m}


def test_update_and_reference_equal_with_and_without_sharing(micro_model: Path,
                                                             tmp_path: Path) -> None:
    rollouts = _rollouts()
    off = _update(micro_model, tmp_path, False, rollouts)
    for on in (_update(micro_model, tmp_path, True, rollouts),
               _update(micro_model, tmp_path, True, rollouts, micro_batch=2)):
        assert on["metrics"]["kl/mean"] == pytest.approx(off["metrics"]["kl/mean"], rel=1e-4)
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


def test_reference_on_two_streams_equals_one_stream(micro_model: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    policy = load_policy(str(micro_model))
    _perturb(policy.model)
    rollouts, cfg = _rollouts(), load_config(None, [])
    out = {}
    for n in (1, 2):
        monkeypatch.setattr(update_module, "reference_streams",
                            lambda cfg, rows, n=n: update_module._cpu_streams()[:n])
        out[n] = reference_logprobs(policy.model, rollouts, cfg)
    for a, b, r in zip(out[1], out[2], rollouts, strict=True):
        assert a.shape == b.shape == (len(r.tokens),)
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_halves_split_at_the_group_boundary_nearest_the_middle() -> None:
    rollouts = _rollouts()  # groups [0, 3, 6], [1, 4], [2, 5]
    order = [0, 3, 6, 1, 4, 2, 5]
    assert update_module.halves(rollouts, (order, True)) == [([0, 3, 6], True),
                                                             ([1, 4, 2, 5], True)]
    one = [0, 3, 6]  # a single group: split by rows
    assert update_module.halves(rollouts, (one, True)) == [([0], True), ([3, 6], True)]
