"""The MLX policy: reference = LoRA off (exactly the base), sampler vs trainer log-probs,
the loss gradient against finite differences, and micro-batch invariance of the update."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from batches import mx_batch
from mlx.utils import tree_flatten
from mlx_lm import load

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.batch import build
from mlx_rlaif.backends.mlx.loss import rl_loss, token_logprobs
from mlx_rlaif.backends.mlx.policy import load_policy, lora_disabled
from mlx_rlaif.backends.mlx.rollout import sample
from mlx_rlaif.backends.mlx.update import make_optimizer, update
from mlx_rlaif.backends.sampling import SamplingParams
from mlx_rlaif.config import load as load_config
from mlx_rlaif.records import Task


def _perturb_lora(model: nn.Module, seed: int = 1, std: float = 0.05) -> None:
    """Random non-zero lora_b so the adapter changes the output."""
    mx.random.seed(seed)
    for m in [m for _, m in lora_layers(model)]:
        m.lora_b = std * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())


def _tokens(n: int = 3, t: int = 12, vocab: int = 300, seed: int = 0) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.integers(3, vocab, size=(n, t)).astype(np.int32))


def test_lora_off_logprobs_equal_base_exactly(micro_model: Path):
    base, _ = load(str(micro_model))
    policy = load_policy(str(micro_model))
    _perturb_lora(policy.model)
    toks = _tokens()
    n_lora = len([m for _, m in lora_layers(policy.model)])
    with_lora, _ = token_logprobs(policy.model, toks)
    with lora_disabled(policy.model):
        assert not [m for _, m in lora_layers(policy.model)]
        off, _ = token_logprobs(policy.model, toks)
    ref, _ = token_logprobs(base, toks)
    assert not np.allclose(np.array(with_lora), np.array(ref))  # the adapter matters
    assert np.array_equal(np.array(off), np.array(ref))  # bit-for-bit the base
    mods = [m for _, m in lora_layers(policy.model)]
    assert len(mods) == n_lora and all(m.scale == policy.lora.scale for m in mods)  # restored
    again, _ = token_logprobs(policy.model, toks)
    assert np.array_equal(np.array(again), np.array(with_lora))


def test_sampler_logprobs_match_recomputed(micro_model: Path):
    policy = load_policy(str(micro_model))
    _perturb_lora(policy.model)
    tasks = [Task("a", "Write add"), Task("b", "Return the sum of a list of numbers please")]
    params = SamplingParams(temperature=0.7, max_new_tokens=16)
    mx.random.seed(0)
    rollouts, stats = sample(policy.model, policy.tokenizer, tasks, params, 3)
    assert len(rollouts) == 6 and stats["gen/decode_width"] == 6  # all P x G at once
    assert [r.task.id for r in rollouts] == ["a"] * 3 + ["b"] * 3
    n = len(rollouts)
    b = mx_batch(build(rollouts, [0.0] * n, [0.0] * n))
    logp, _ = token_logprobs(policy.model, b["tokens"], temperature=0.7)
    diff = np.abs(np.array(logp) - np.array(b["old_logp"])) * np.array(b["mask"])
    assert diff.max() < 2e-3
    assert np.array(b["mask"]).sum() == sum(len(r.tokens) for r in rollouts)


def test_prefill_once_matches_plain_insert(micro_model: Path):
    policy = load_policy(str(micro_model))
    tasks = [Task("a", "Write a function"), Task("b", "Sum a list of numbers")]
    out = {}
    for once in (True, False):
        mx.random.seed(5)
        r, _ = sample(policy.model, policy.tokenizer, tasks,
                      SamplingParams(temperature=0.0, max_new_tokens=8, prefill_once=once), 2)
        out[once] = [x.tokens for x in r]
    assert out[True] == out[False]  # greedy: same tokens either way


def _rollouts(policy, n_tasks: int = 2, g: int = 4):
    tasks = [Task(f"t{i}", f"Write function {i} that returns {i}") for i in range(n_tasks)]
    mx.random.seed(11)
    rollouts, _ = sample(policy.model, policy.tokenizer, tasks,
                         SamplingParams(temperature=1.0, max_new_tokens=10), g)
    return rollouts


def test_loss_gradient_matches_finite_differences(micro_model: Path):
    policy = load_policy(str(micro_model))
    _perturb_lora(policy.model)
    rollouts = _rollouts(policy)
    n = len(rollouts)
    adv = np.linspace(-1, 1, n)
    w = aggregation_weights([len(r.tokens) for r in rollouts], "token", 10)
    ref = [np.array(r.logprobs) - 0.1 for r in rollouts]  # a reference that differs
    mb = mx_batch(build(rollouts, adv, w, ref))
    mb["old_logp"] = mb["old_logp"] + 0.05 * mb["mask"]  # ratios away from 1, some clipped
    rl = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3"]).rl
    fn = partial(rl_loss, rl=rl, kl_penalty=0.1, temperature=1.0)
    (_, _), grads = nn.value_and_grad(policy.model, fn)(policy.model, mb)
    flat = dict(tree_flatten(grads))
    params = dict(tree_flatten(policy.model.trainable_parameters()))
    name = next(k for k in flat if k.endswith("lora_a"))
    g = np.array(flat[name])
    idx = np.unravel_index(np.argmax(np.abs(g)), g.shape)
    eps = 1e-3

    def loss_at(delta: float) -> float:
        p = np.array(params[name])
        p[idx] += delta
        policy.model.load_weights([(name, mx.array(p))], strict=False)
        return fn(policy.model, mb)[0].item()

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    loss_at(0.0)
    assert g[idx] == pytest.approx(numeric, rel=2e-2, abs=1e-5)


def _run_update(micro_model: Path, micro_batch_size: int, rollouts, adv, tmp: Path) -> dict:
    cfg = load_config(None, [f"training.micro_batch_size={micro_batch_size}",
                             "rl.entropy_coef=0.01", "rl.kl_penalty=0"])
    policy = load_policy(str(micro_model), cfg.lora, seed=0)
    _perturb_lora(policy.model)
    update(policy, make_optimizer(cfg.training, 10), rollouts, adv, None, cfg, 0.0)
    return {k: np.array(v) for k, v in tree_flatten(policy.model.trainable_parameters())}


def test_update_does_not_depend_on_micro_batch_size(micro_model: Path, tmp_path: Path):
    policy = load_policy(str(micro_model))
    rollouts = _rollouts(policy, n_tasks=3, g=2)
    adv = np.linspace(-1, 1, len(rollouts))
    whole = _run_update(micro_model, 0, rollouts, adv, tmp_path)
    split = _run_update(micro_model, 2, rollouts, adv, tmp_path)
    start = load_policy(str(micro_model), seed=0)
    _perturb_lora(start.model)
    before = dict(tree_flatten(start.model.trainable_parameters()))
    moved = max(np.abs(whole[k] - np.array(before[k])).max() for k in whole)
    assert moved > 1e-6  # the update did something
    for k in whole:
        np.testing.assert_allclose(whole[k], split[k], atol=1e-6, rtol=1e-4)


def test_checkpoint_round_trip_and_mlx_lm_loads_it(micro_model: Path, tmp_path: Path):
    cfg = load_config(None, [])
    policy = load_policy(str(micro_model), cfg.lora)
    _perturb_lora(policy.model)
    from mlx_rlaif.backends.mlx.policy import adapter_config_for

    ckpt = checkpoint.save_checkpoint(tmp_path, "checkpoint-e1-b1-gs1", policy.model,
                                      adapter_config_for(policy), checkpoint.LoopState(step=1))
    assert checkpoint.resolve(tmp_path) == ckpt
    model, _ = load(str(micro_model), adapter_path=str(ckpt))  # mlx-lm's own loader
    toks = _tokens()
    a, _ = token_logprobs(model, toks)
    b, _ = token_logprobs(policy.model, toks)
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)
    again = load_policy(str(micro_model), adapter=ckpt)
    c, _ = token_logprobs(again.model, toks)
    np.testing.assert_allclose(np.array(c), np.array(b), atol=1e-6)
    assert replace(checkpoint.load_state(ckpt)).step == 1


def test_a_float_model_quantized_at_load_is_never_whole_in_memory(tmp_path: Path):
    """Failing first (issue 58's cost run: a Qwen2.5-1.5B-shape float32 teacher quantized to 4
    bits at load took the run's MLX peak from 2.58 to 7.82 GB, the float model read whole
    before its quantization): the weights are read one tensor at a time after it, so the load
    adds less than half the float weights' bytes to the peak (the quantized copy plus one float
    tensor), and the quantized model computes what mlx-lm's eager load and quantization do."""
    from mlx_lm.utils import quantize_model

    from mlx_rlaif.backends.mlx.policy import is_quantized
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = make_model_dir(tmp_path / "m", "tiny-teacher")
    floats = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    mx.clear_cache()
    held = mx.get_active_memory()
    mx.reset_peak_memory()
    model = load_policy(str(path), quantize=4).model
    added = mx.get_peak_memory() - held
    assert is_quantized(model) and 0 < added < floats / 2, (added, floats)
    eager, _ = load(str(path))
    quantize_model(eager, {}, None, 4)
    x = mx.array([[5, 9, 300, 42]])
    assert mx.array_equal(model(x), eager(x)).item()  # LoRA starts at zero: the base's output


def test_weights_that_fail_when_read_are_one_line(tmp_path: Path):
    """The weights are read lazily, after the headers: a file cut short in between (a
    download or a disk failing under the run) is a one-line UsageError naming the model, not
    a traceback from the first forward."""
    import os

    from mlx_rlaif.backends.mlx.policy import read_weights
    from mlx_rlaif.errors import UsageError
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = make_model_dir(tmp_path / "m", "micro")
    model, _ = load(str(path), lazy=True)
    os.truncate(next(path.glob("*.safetensors")), 2000)
    with pytest.raises(UsageError, match="its weights could not be read") as e:
        read_weights(model, str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)
