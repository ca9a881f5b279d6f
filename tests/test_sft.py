"""`mlx-rlaif sft`: strict config, completion-only loss, RL-format checkpoints, and RL started
from the SFT adapter (`train --init-adapter`)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_rlaif import cli
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.mlx.rollout import sample
from mlx_rlaif.backends.sampling import SamplingParams
from mlx_rlaif.config import LoraConfig
from mlx_rlaif.errors import ConfigError, DataError
from mlx_rlaif.records import Task
from mlx_rlaif.train import sft

PROMPTS = [f"Write a Python function number {i} that returns {i}." for i in range(4)]


@pytest.fixture()
def run_cli(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"sft": "sft", "train": "train"})
    return lambda *argv: cli.main([str(a) for a in argv])


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def sft_config(tmp_path: Path, model: Path, data: Path, *sets: str) -> Path:
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(f"model:\n  path: {model}\nlora:\n  rank: 4\nsft:\n  train_file: {data}\n"
                   f"training:\n  output_dir: {tmp_path / 'sft_run'}\n  batch_size: 4\n"
                   "  learning_rate: 0.001\n  num_epochs: 40\n  save_every_epochs: 0\n"
                   + "".join(f"  {s}\n" for s in sets))
    return cfg


# --- config and data ------------------------------------------------------------------------


def test_config_is_strict_and_needs_a_train_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sft:\n  trian_file: x.jsonl\n")
    with pytest.raises(ConfigError, match="sft.trian_file: did you mean sft.train_file"):
        sft.load_config(bad)
    with pytest.raises(ConfigError, match="sft.train_file is empty"):
        sft.load_config(None, ["training.batch_size=2"])
    with pytest.raises(ConfigError, match="unknown config key rl"):
        sft.load_config(None, ["sft.train_file=a.jsonl", "rl.kl_penalty=0.1"])
    cfg = sft.load_config(None, ["sft.train_file=a.jsonl"])
    assert cfg.training.output_dir == "runs/sft" and cfg.sft.max_seq_length == 2048


def test_shipped_sft_config_loads():
    root = Path(__file__).resolve().parent.parent
    cfg = sft.load_config(root / "configs" / "sft.yaml")
    assert cfg.sft.train_file and cfg.training.output_dir


def test_read_examples_completion_teacher_code_skips_and_fences(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "a", "completion": "x = 1"},
        {"prompt": "b", "teacher_code": "def f():\n    return 2\n", "language": "python"},
        {"prompt": "c", "teacher_code": None},
        {"prompt": "d", "completion": "", "teacher_code": "y = 3"},
    ])
    cfg = sft.load_config(None, [f"sft.train_file={data}"])
    examples, skipped = sft.read_examples(data, cfg.sft)
    assert [e.completion for e in examples] == ["x = 1", "def f():\n    return 2\n", "y = 3"]
    assert skipped == 1
    fenced = sft.load_config(None, [f"sft.train_file={data}", "sft.fence_code=true"])
    assert sft.read_examples(data, fenced.sft)[0][1].completion == (
        "```python\ndef f():\n    return 2\n```")
    write_jsonl(data, [{"completion": "x"}])
    with pytest.raises(DataError, match=r"d\.jsonl:1: missing or empty 'prompt'"):
        sft.read_examples(data, cfg.sft)


# --- the loss -------------------------------------------------------------------------------


def test_loss_counts_completion_tokens_only(micro_model):
    policy = load_policy(str(micro_model), LoraConfig(rank=4))
    cfg = sft.load_config(None, ["sft.train_file=x.jsonl"])
    examples = [sft.Example("Write add", "def add(a, b):\n    return a + b\n"),
                sft.Example("Say hi", "print('hi')")]
    data, dropped = sft.tokenize(examples, policy.tokenizer, cfg.model, 2048)
    assert dropped == 0
    assert data[0][0][-1] == policy.tokenizer.eos_token_id  # completions end like samples do
    tokens, lengths = next(sft.batches(data, 2, 2048, seed=0))
    loss, ntoks, _ = sft.loss_and_grads(policy.model, tokens, lengths, micro=0)
    # by hand: mean negative log-likelihood of each completion token given everything before it
    nll = []
    for toks, offset in data:
        lg = np.array(policy.model(mx.array([toks]))[0].astype(mx.float32))
        logp = lg - np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
            lg.max(-1, keepdims=True)
        nll += [-logp[i - 1, toks[i]] for i in range(offset, len(toks))]
    assert int(ntoks.item()) == len(nll) == sum(len(t) - o for t, o in data)
    assert loss.item() == pytest.approx(float(np.mean(nll)), rel=1e-4)


def test_micro_batches_give_the_same_loss_and_gradient(micro_model):
    policy = load_policy(str(micro_model), LoraConfig(rank=4))
    cfg = sft.load_config(None, ["sft.train_file=x.jsonl"])
    examples = [sft.Example(p, "x = 1\n" * (i + 1)) for i, p in enumerate(PROMPTS)]
    data, _ = sft.tokenize(examples, policy.tokenizer, cfg.model, 2048)
    tokens, lengths = next(sft.batches(data, 4, 2048, seed=0))
    whole = sft.loss_and_grads(policy.model, tokens, lengths, micro=0)
    split = sft.loss_and_grads(policy.model, tokens, lengths, micro=1)
    assert whole[0].item() == pytest.approx(split[0].item(), rel=1e-5)
    g1, g2 = dict(tree_flatten(whole[2])), dict(tree_flatten(split[2]))
    assert any(float(mx.abs(v).max()) > 0 for v in g1.values())
    for k, v in g1.items():
        assert np.allclose(np.array(v), np.array(g2[k]), rtol=1e-3, atol=1e-6), k


# --- end to end -----------------------------------------------------------------------------


def test_sft_then_train_init_adapter_continues_from_it(micro_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "train.jsonl",
                       [{"prompt": p, "teacher_code": "x = 1\n"} for p in PROMPTS])
    assert run_cli("sft", "--config", sft_config(tmp_path, micro_model, data)) == 0
    run = tmp_path / "sft_run"
    ckpt = checkpoint.latest_checkpoint(run)
    assert ckpt.name == "checkpoint-final-gs40"
    adapter_cfg = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_cfg["base_model"] == str(micro_model)
    assert adapter_cfg["lora_parameters"]["rank"] == 4
    assert checkpoint.load_state(ckpt).step == 40
    losses = [r["loss/sft"] for r in map(json.loads, (run / "batches.jsonl").read_text()
                                         .splitlines()) if "loss/sft" in r]
    assert len(losses) == 40 and np.mean(losses[-5:]) < 0.2 * losses[0]

    # the SFT model answers what it was taught (greedy) on an unseen prompt
    policy = load_policy(str(micro_model), adapter=run)
    unseen = Task("new", "Write a Python function number 9 that returns 9.")
    rollouts, _ = sample(policy.model, policy.tokenizer, [unseen],
                         SamplingParams(temperature=0.0, max_new_tokens=8), 1)
    assert rollouts[0].text == "x = 1\n" and rollouts[0].finish_reason == "stop"

    # RL from the SFT adapter: rank and weights come from it, and the first step's samples
    # already score like the SFT model
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"prompt": p} for p in PROMPTS])
    rl = tmp_path / "rl_run"
    assert run_cli("train", "--model", micro_model, "--train-file", tasks, "--output-dir", rl,
                   "--init-adapter", run, "--max-steps", "1", "--no-dashboard",
                   "--set", "reward.type=syntax", "--set", "generation.max_new_tokens=8",
                   "--set", "generation.temperature=0.3", "--set", "training.batch_size=2",
                   "--set", "generation.num_samples_per_prompt=2",
                   "--set", "logging.tensorboard=false") == 0
    first = json.loads((rl / "batches.jsonl").read_text().splitlines()[0])
    assert first["reward/mean"] >= 0.75
    rl_ckpt = checkpoint.latest_checkpoint(rl)
    assert json.loads((rl_ckpt / "adapter_config.json").read_text())[
        "lora_parameters"]["rank"] == 4
    before, after = mx.load(str(ckpt / "adapters.safetensors")), mx.load(
        str(rl_ckpt / "adapters.safetensors"))
    assert set(before) == set(after)
    for k in before:
        if k.endswith("lora_b"):
            size = float(mx.abs(before[k]).max())
            assert size > 1e-3  # SFT moved lora_b away from its zero init
            assert float(mx.abs(after[k] - before[k]).max()) < 0.2 * size, k


def test_a_time_budget_ends_sft_after_the_step_that_passes_it(micro_model, tmp_path, run_cli):
    data = write_jsonl(tmp_path / "train.jsonl",
                       [{"prompt": p, "completion": "x = 1\n"} for p in PROMPTS])
    cfg = sft_config(tmp_path, micro_model, data, "max_minutes: 0.00001")
    assert run_cli("sft", "--config", cfg) == 0
    ckpt = checkpoint.latest_checkpoint(tmp_path / "sft_run")
    assert ckpt.name == "checkpoint-final-gs1" and checkpoint.load_state(ckpt).step == 1
