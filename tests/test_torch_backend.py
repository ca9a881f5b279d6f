"""The torch backend (CPU here): reference = adapters off (exactly the base), sampler vs trainer
log-probs, the loss gradient against finite differences, micro-batch invariance, the optimizer
against mlx's AdamW, and checkpoints that MLX loads (and the reverse) with the same log-probs."""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from mlx_rlaif.algo.aggregation import aggregation_weights  # noqa: E402
from mlx_rlaif.artifacts import checkpoint  # noqa: E402
from mlx_rlaif.artifacts.lora import lora_layers  # noqa: E402
from mlx_rlaif.backends.batch import build  # noqa: E402
from mlx_rlaif.backends.mlx import policy as mb  # noqa: E402
from mlx_rlaif.backends.mlx.loss import token_logprobs  # noqa: E402
from mlx_rlaif.backends.sampling import SamplingParams  # noqa: E402
from mlx_rlaif.backends.torch import policy as tb  # noqa: E402
from mlx_rlaif.backends.torch import rollout as tr  # noqa: E402
from mlx_rlaif.backends.torch import update as tu  # noqa: E402
from mlx_rlaif.config import LoraConfig  # noqa: E402
from mlx_rlaif.config import load as load_config  # noqa: E402
from mlx_rlaif.errors import UsageError  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
TASKS = [Task("a", "Write add"), Task("b", "Return the sum of a list of numbers please")]


def _perturb(policy: tb.TorchPolicy, seed: int = 1, std: float = 0.05) -> None:
    """Random non-zero lora_B so the adapter changes the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def _tokens(n: int = 3, t: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, size=(n, t)).astype(np.int64)


def _logp(policy: tb.TorchPolicy, toks: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    with torch.no_grad():
        return tb.token_logprobs(policy.model, torch.from_numpy(toks), temperature)[0].numpy()


def _batch(rollouts, adv=None, ref=None, agg="token"):
    n = len(rollouts)
    w = aggregation_weights([len(r.tokens) for r in rollouts], agg, 16)
    return build(rollouts, [0.0] * n if adv is None else adv, w, ref)


@pytest.fixture(scope="module")
def rollouts(micro_model: Path):
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    out, _ = tr.sample(policy, TASKS, SamplingParams(temperature=1.0, max_new_tokens=10), 3,
                       seed=11)
    return out


def test_lora_off_logprobs_equal_base_exactly(micro_model: Path, rollouts):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(micro_model), dtype=torch.float32)
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    cfg = load_config(None, ["training.micro_batch_size=4"])
    ref = tu.reference_logprobs(policy, rollouts, cfg)
    expected = []
    for s in (slice(0, 4), slice(4, 6)):  # the same micro-batches: bit-for-bit the same math
        b = tu.to_torch(_batch(rollouts[s]), torch.device("cpu"))
        with torch.no_grad():
            lp = tb.token_logprobs(base, b["tokens"])[0].numpy()
        expected += [lp[i, len(r.prompt_tokens) - 1:][: len(r.tokens)]
                     for i, r in enumerate(rollouts[s])]
    assert all(np.array_equal(a, e) for a, e in zip(ref, expected, strict=True))
    toks = _tokens()
    with torch.no_grad():
        plain = tb.token_logprobs(base, torch.from_numpy(toks))[0].numpy()
    assert not np.allclose(_logp(policy, toks), plain)  # the adapter matters, and is back on


def test_sampler_logprobs_match_recomputed(micro_model: Path):
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    params = SamplingParams(temperature=0.7, max_new_tokens=16)
    rollouts, stats = tr.sample(policy, TASKS, params, 3, seed=0)
    assert len(rollouts) == 6 and stats["gen/decode_width"] == 6  # all P x G at once
    assert {"gen/tokens", "gen/seconds", "gen/tokens_per_sec"} <= set(stats)
    assert [r.task.id for r in rollouts] == ["a"] * 3 + ["b"] * 3
    assert len({len(r.prompt_tokens) for r in rollouts}) == 2  # left padding is exercised
    b = tu.to_torch(_batch(rollouts), torch.device("cpu"))
    with torch.no_grad():
        logp = tb.token_logprobs(policy.model, b["tokens"], temperature=0.7)[0]
    diff = ((logp - b["old_logp"]).abs() * b["mask"]).max().item()
    assert diff < 2e-3
    assert b["mask"].sum().item() == stats["gen/tokens"] == sum(len(r.tokens) for r in rollouts)
    again, _ = tr.sample(policy, TASKS, params, 3, seed=0)
    assert [r.tokens for r in again] == [r.tokens for r in rollouts]  # seeded
    chunked, st = tr.sample(policy, TASKS, replace(params, completion_batch_size=4), 3, seed=0)
    assert st["gen/decode_width"] == 4 and len(chunked) == 6


def test_live_policy_logprobs_are_the_samplers(micro_model: Path, rollouts):
    """policy_logprobs (rl.guidance's log-probs of a reference answer) is the live policy's,
    adapters on: the sampler's numbers, not the reference's."""
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    cfg = load_config(None, ["generation.temperature=1.0"])
    live = tu.policy_logprobs(policy, rollouts, cfg)
    ref = tu.reference_logprobs(policy, rollouts, cfg)
    for r, a, b in zip(rollouts, live, ref, strict=True):
        assert np.abs(a - np.asarray(r.logprobs)).max() < 2e-3
        assert not np.allclose(a, b)


def _raw_mass_above_and_rank(policy: tb.TorchPolicy, params: SamplingParams):
    """For each sampled token: the untempered probability mass of likelier tokens, its rank."""
    rollouts, _ = tr.sample(policy, TASKS, params, 4, seed=2)
    b = tu.to_torch(_batch(rollouts), torch.device("cpu"))
    with torch.no_grad():
        raw = torch.softmax(policy.model(input_ids=b["tokens"][:, :-1]).logits, -1)
    picked = raw.gather(-1, b["tokens"][:, 1:, None])[..., 0]
    likelier = raw > picked[..., None]
    on = b["mask"].bool()
    return (raw * likelier).sum(-1)[on], likelier.sum(-1)[on]


def test_truncation_acts_on_the_untempered_distribution(micro_model: Path):
    """mlx-lm's order: top-p / top-k on the raw distribution, then temperature (a tempered
    nucleus of 0.1 at T = 3 would hold many more tokens than the raw one)."""
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy, std=0.5)
    above, _ = _raw_mass_above_and_rank(policy, SamplingParams(3.0, top_p=0.1, max_new_tokens=8))
    assert (above < 0.1 + 1e-5).all()
    _, rank = _raw_mass_above_and_rank(policy, SamplingParams(3.0, top_k=3, max_new_tokens=8))
    assert (rank < 3).all()


def test_kl_estimators():  # the MLX test's numbers
    logp, ref, d = torch.tensor([0.0]), torch.tensor([math.log(0.5)]), math.log(0.5)
    assert tu.kl_estimate(logp, ref, "k1").item() == pytest.approx(-d)  # 0.6931
    assert tu.kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)  # 0.2402
    assert tu.kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - d - 1)  # 0.1931


@pytest.mark.parametrize("ratio, adv, loss, clipped", [
    (1.5, 1.0, -1.28, True),  # positive advantage, ratio above 1 + 0.28: clipped
    (1.5, -1.0, 1.5, False),  # negative advantage: the pessimistic unclipped term wins
    (0.5, 1.0, -0.5, False),
    (0.5, -1.0, 0.8, True),  # negative advantage, ratio below 1 - 0.2: clipped
    (1.1, 2.0, -2.2, False),  # inside the trust region
])
def test_clipped_surrogate(ratio, adv, loss, clipped):
    logp = torch.tensor([[math.log(ratio)]])
    pg, r, c = tu.clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([adv]), 0.2, 0.28)
    assert pg.item() == pytest.approx(loss, rel=1e-5)
    assert r.item() == pytest.approx(ratio, rel=1e-5)
    assert bool(c.item()) is clipped


def test_cut_at_first_eos():
    assert tr._cut([5, 2, 7], [-1.0, -2.0, -3.0], {2}) == ([5, 2], [-1.0, -2.0], "stop")
    assert tr._cut([5, 6], [-1.0, -2.0], {2}) == ([5, 6], [-1.0, -2.0], "length")


def test_loss_gradient_matches_finite_differences(micro_model: Path, rollouts):
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    policy.model.to(torch.float64)
    n = len(rollouts)
    ref = [np.array(r.logprobs) - 0.1 for r in rollouts]  # a reference that differs
    b = tu.to_torch(_batch(rollouts, np.linspace(-1, 1, n), ref), torch.device("cpu"))
    shift = torch.from_numpy(np.random.default_rng(0).normal(0, 0.3, b["mask"].shape))
    b["old_logp"] = b["old_logp"] + shift.float() * b["mask"]  # ratios away from 1, some clipped
    rl = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3"]).rl
    loss, aux = tu.rl_loss(policy.model, b, rl, 0.1, 1.0)
    loss.backward()
    assert 0 < aux["clipped"].item() < aux["tokens"].item()
    name, p = next((k, v) for k, v in policy.model.named_parameters() if "lora_A" in k)
    idx = np.unravel_index(p.grad.abs().argmax().item(), p.shape)
    eps = 1e-4  # RMSNorm computes in float32 even in a float64 model: not smaller

    def loss_at(delta: float) -> float:
        with torch.no_grad():
            p[idx] += delta
            value = tu.rl_loss(policy.model, b, rl, 0.1, 1.0)[0].item()
            p[idx] -= delta
        return value

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    assert p.grad[idx].item() == pytest.approx(numeric, rel=2e-3)


def _update(micro_model: Path, rollouts, micro_batch_size: int, adv: np.ndarray):
    cfg = load_config(None, [f"training.micro_batch_size={micro_batch_size}",
                             "rl.entropy_coef=0.01", "rl.kl_penalty=0"])
    policy = tb.load_policy(str(micro_model), cfg.lora, seed=0, device="cpu")
    _perturb(policy)
    opt = tu.make_optimizer(policy, cfg, 10)
    metrics, skipped = tu.update(policy, opt, rollouts, adv, None, cfg, 0.0)
    weights = {k: v.detach().numpy().copy() for k, v in policy.model.named_parameters()
               if v.requires_grad}
    return weights, metrics, skipped


def test_update_moves_lora_and_ignores_micro_batch_size(micro_model: Path, rollouts):
    adv = np.linspace(-1, 1, len(rollouts))
    whole, metrics, skipped = _update(micro_model, rollouts, 0, adv)
    split, split_metrics, _ = _update(micro_model, rollouts, 4, adv)
    for key in ("loss/total", "optim/grad_norm", "policy/entropy"):  # same global divisor
        assert split_metrics[key] == pytest.approx(metrics[key], rel=1e-5)
    start = tb.load_policy(str(micro_model), seed=0, device="cpu")
    _perturb(start)
    before = {k: v.detach().numpy() for k, v in start.model.named_parameters() if v.requires_grad}
    assert max(np.abs(whole[k] - before[k]).max() for k in whole) > 1e-6
    for k in whole:  # Adam's first step is ~lr * sign(g): float noise in tiny g shows up
        np.testing.assert_allclose(whole[k], split[k], atol=1e-5, rtol=1e-4)
    assert skipped == 0
    assert {"loss/total", "loss/policy", "policy/entropy", "policy/clipfrac", "policy/ratio_mean",
            "policy/approx_kl", "kl/sample_train", "optim/grad_norm", "optim/lr",
            "train/tokens", "train/tokens_per_sec"} <= set(metrics)
    assert metrics["kl/sample_train"] < 1e-8  # first iteration: trainer == sampler


def _graph(policy: tb.TorchPolicy, toks: np.ndarray, on: bool) -> tuple[int, dict]:
    """(bytes the autograd graph keeps outside checkpointed regions, the LoRA gradients) of
    the summed log-probs, with per-block checkpointing on or off."""
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    policy.model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            tb.checkpointed_blocks(policy.model, on):
        loss = tb.token_logprobs(policy.model, torch.from_numpy(toks))[0].sum()
        loss.backward()
    return sum(saved), {k: p.grad.clone() for k, p in policy.model.named_parameters()
                        if p.requires_grad}


def test_checkpointed_blocks_keep_less_and_give_the_same_gradients(micro_model: Path):
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    toks = _tokens(4, 24)
    kept_off, grads_off = _graph(policy, toks, False)
    kept_on, grads_on = _graph(policy, toks, True)
    assert kept_on < 0.5 * kept_off  # the blocks' activations are recomputed, not kept
    for k in grads_off:
        torch.testing.assert_close(grads_on[k], grads_off[k], rtol=1e-5, atol=1e-7)
    blocks = policy.model.get_base_model().model.layers
    assert all("forward" not in vars(b) for b in blocks)  # restored on leaving


def test_update_checkpoints_blocks_only_when_on(micro_model: Path, rollouts, monkeypatch):
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    adv = np.linspace(-1, 1, len(rollouts))
    for mode, expect in (("auto", False), ("on", True)):
        cfg = load_config(None, [f"training.grad_checkpoint={mode}", "rl.kl_penalty=0"])
        policy = tb.load_policy(str(micro_model), cfg.lora, seed=0, device="cpu")
        calls.clear()
        tu.update(policy, tu.make_optimizer(policy, cfg, 10), rollouts, adv, None, cfg, 0.0)
        assert bool(calls) is expect, mode


def test_non_finite_update_is_skipped(micro_model: Path, rollouts):
    adv = np.full(len(rollouts), np.nan)
    weights, metrics, skipped = _update(micro_model, rollouts, 0, adv)
    start = tb.load_policy(str(micro_model), seed=0, device="cpu")
    _perturb(start)
    assert skipped == 1
    for k, v in start.model.named_parameters():
        if v.requires_grad:
            assert np.array_equal(weights[k], v.detach().numpy())


def test_optimizer_is_mlx_adamw_with_the_same_schedule():
    from mlx_rlaif.backends.mlx.update import make_optimizer

    cfg = load_config(None, ["training.learning_rate=0.01", "training.warmup_steps=2",
                             "training.lr_schedule=cosine", "training.weight_decay=0.1"])
    mlx_opt = make_optimizer(cfg.training, 6)
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 4)).astype(np.float32)
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = tu.AdamW([p], tu.lr_schedule(cfg.training, 6), weight_decay=0.1)
    params = {"w": mx.array(w0)}
    for _ in range(6):
        g = rng.normal(size=w0.shape).astype(np.float32)
        params = mlx_opt.apply_gradients({"w": mx.array(g)}, params)
        p.grad = torch.from_numpy(g)
        opt.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(mlx_opt.learning_rate.item(), rel=1e-5)
        np.testing.assert_allclose(p.detach().numpy(), np.array(params["w"]), atol=1e-6)
    # hand-computed: warmup from 1e-5 to 1e-2 over 2 steps, then cosine over 4 to 1e-3
    lr = tu.lr_schedule(cfg.training, 6)
    assert [lr(0), lr(1), lr(2), lr(4), lr(6)] == pytest.approx(
        [1e-5, 0.005005, 0.01, 0.0055, 0.001])


def test_checkpoint_loads_in_mlx_and_resumes(micro_model: Path, rollouts, tmp_path: Path):
    from mlx_lm import load as mlx_load

    lora = LoraConfig(rank=4, scale=10.0, num_layers=1, keys=("self_attn.q_proj", "mlp.down_proj"))
    cfg = load_config(None, ["rl.kl_penalty=0"])
    policy = tb.load_policy(str(micro_model), lora, device="cpu")
    _perturb(policy)
    opt = tu.make_optimizer(policy, cfg, 10)
    tu.update(policy, opt, rollouts, np.linspace(-1, 1, len(rollouts)), None, cfg, 0.0)
    state = checkpoint.LoopState(step=3, epoch=1, cursor=2, kl_penalty=0.05)
    ckpt = tb.save_checkpoint(policy, opt, tmp_path, "checkpoint-e1-b3-gs3", state,
                              {"checkpoint_summary.json": {"global_step": 3}}, "rl: {}\n")
    assert checkpoint.latest_checkpoint(tmp_path) == ckpt
    assert {p.name for p in ckpt.iterdir()} == {
        "adapters.safetensors", "adapter_config.json", "optimizer.pt", "state.json",
        "checkpoint_summary.json", "config.yaml", "manifest.json"}
    saved = checkpoint.load_adapter_config(ckpt)
    assert saved["num_layers"] == 1 and saved["lora_parameters"]["keys"] == list(lora.keys)
    toks = _tokens()
    model, _ = mlx_load(str(micro_model), adapter_path=str(ckpt))  # mlx-lm's own loader
    mlx_logp = np.array(token_logprobs(model, mx.array(toks.astype(np.int32)))[0])
    np.testing.assert_allclose(mlx_logp, _logp(policy, toks), atol=1e-4)
    from_ckpt = tb.load_policy(str(micro_model), adapter=ckpt, device="cpu")  # its lora cfg
    assert from_ckpt.num_layers == 1 and from_ckpt.lora.keys == lora.keys
    np.testing.assert_array_equal(_logp(from_ckpt, toks), _logp(policy, toks))
    again = tb.load_policy(str(micro_model), lora, seed=5, device="cpu")
    opt2 = tu.make_optimizer(again, cfg, 10)
    assert tb.restore(again, opt2, ckpt) == state
    np.testing.assert_array_equal(_logp(again, toks), _logp(policy, toks))
    assert opt2.param_groups[0]["updates"] == 1
    for p1, p2 in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"], strict=True):
        assert torch.equal(opt.state[p1]["v"], opt2.state[p2]["v"])


def test_mlx_checkpoint_loads_in_torch_and_the_update_agrees(micro_model: Path, rollouts,
                                                              tmp_path: Path):
    from mlx_rlaif.backends.mlx.update import make_optimizer, update

    cfg = load_config(None, ["rl.entropy_coef=0.01", "rl.kl_estimator=k3", "rl.kl_penalty=0.1",
                             "training.micro_batch_size=4", "rl.loss_agg=sequence"])
    mpol = mb.load_policy(str(micro_model), cfg.lora)
    mx.random.seed(1)
    for _, m in lora_layers(mpol.model):
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    ckpt = checkpoint.save_checkpoint(tmp_path, "checkpoint-e1-b1-gs1", mpol.model,
                                      mb.adapter_config_for(mpol), checkpoint.LoopState(step=1))
    tpol = tb.load_policy(str(micro_model), adapter=ckpt, device="cpu")
    toks = _tokens()
    mlx_logp = np.array(token_logprobs(mpol.model, mx.array(toks.astype(np.int32)))[0])
    np.testing.assert_allclose(_logp(tpol, toks), mlx_logp, atol=1e-4)
    # the same update on both backends: same loss terms, same gradient norm
    adv = np.linspace(-1, 1, len(rollouts))
    ref = tu.reference_logprobs(tpol, rollouts, cfg)
    topt = tu.make_optimizer(tpol, cfg, 10)
    t_metrics, _ = tu.update(tpol, topt, rollouts, adv, ref, cfg, 0.1)
    m_metrics, _ = update(mpol, make_optimizer(cfg.training, 10), rollouts, adv, ref, cfg, 0.1)
    for key in ("loss/total", "loss/policy", "loss/kl", "kl/mean", "policy/entropy",
                "policy/ratio_mean", "policy/clipfrac", "optim/grad_norm", "optim/lr",
                "train/tokens"):
        assert t_metrics[key] == pytest.approx(m_metrics[key], rel=1e-4, abs=1e-6), key
    assert math.isfinite(t_metrics["loss/total"]) and t_metrics["optim/grad_norm"] > 0


def test_bad_keys_and_missing_dependencies_are_usage_errors(micro_model: Path, monkeypatch):
    with pytest.raises(UsageError, match="lora.keys"):
        tb.load_policy(str(micro_model), LoraConfig(keys=("no_such_proj",)), device="cpu")
    monkeypatch.setitem(sys.modules, "peft", None)
    monkeypatch.delitem(sys.modules, "mlx_rlaif.backends.torch.policy")
    with pytest.raises(UsageError, match=r"pip install 'mlx-rlaif\[torch\]'"):
        importlib.import_module("mlx_rlaif.backends.torch.policy")


def test_the_same_loop_runs_on_torch_and_resumes_identically(micro_model, prompts_file, tmp_path):
    """model.backend=torch drives train.train end to end; 4 steps == 2 + resume + 2."""
    from recording_hub import RecordingHub

    from mlx_rlaif.train import train

    def cfg(out, steps):
        return load_config(None, [
            f"model.path={micro_model}", "model.backend=torch", "model.device=cpu",
            f"data.train_file={prompts_file}", f"training.output_dir={out}",
            f"training.max_steps={steps}", "training.num_epochs=3", "reward.type=syntax",
            "generation.max_new_tokens=8", "generation.num_samples_per_prompt=2",
            "rl.entropy_coef=0.05", "rl.drop_zero_std=false", "training.learning_rate=0.01"])

    hub = RecordingHub()
    straight = train(cfg(tmp_path / "a", 4), hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2, 3, 4] and hub.steps[-1][1]["kl/mean"] > 0
    first = train(cfg(tmp_path / "b", 2), hub=RecordingHub())
    resumed = train(cfg(tmp_path / "b", 4), resume_from=checkpoint.latest_checkpoint(first),
                    hub=RecordingHub())
    a = mx.load(str(checkpoint.latest_checkpoint(straight) / checkpoint.ADAPTERS))
    b = mx.load(str(checkpoint.latest_checkpoint(resumed) / checkpoint.ADAPTERS))
    for k in a:
        np.testing.assert_allclose(np.array(a[k]), np.array(b[k]), atol=1e-6)


def test_chunked_logprobs_and_gradients_equal_the_full_ones(micro_model: Path, monkeypatch):
    """The head a chunk of positions at a time (torch.utils.checkpoint), as on MLX: the same
    log-probs, entropies and adapter gradients as the full logits."""
    policy = tb.load_policy(str(micro_model), device="cpu")
    _perturb(policy)
    assert policy.split is not None
    toks = torch.from_numpy(_tokens(n=3, t=12))

    def run(split):
        policy.model.zero_grad(set_to_none=True)
        logp, ent = tb.token_logprobs(policy.model, toks, 0.8, with_entropy=True, split=split)
        (logp.sum() + 0.1 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters()
                 if p.grad is not None}
        return logp.detach(), ent.detach(), grads

    full = run(None)
    monkeypatch.setattr(tb, "LOGITS_CHUNK_MB", 0)  # chunks of one position
    chunked = run(policy.split)
    torch.testing.assert_close(chunked[0], full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked[1], full[1], rtol=1e-5, atol=1e-5)
    assert full[2] and set(chunked[2]) == set(full[2])
    for k, g in full[2].items():
        torch.testing.assert_close(chunked[2][k], g, rtol=1e-3, atol=2e-5)
