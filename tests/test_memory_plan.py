"""The memory model and the plan made from it (backends/mlx/memory.py, train/memory_plan.py):
the arithmetic by hand, the choices on small models, a run that cannot fit refused with the
setting named, the Metal-only limits with the device query monkeypatched."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_rlaif.backends.mlx import memory
from mlx_rlaif.backends.mlx.memory import GiB, Shape, Work
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.train import memory_plan

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20
# 2 layers, width 64, MLP 128, 4 heads of 16, 2 key/value heads, vocab 4096; 1 MB of weights
S = Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=4096,
          weight_bytes=MB, act_bytes=4, lora_params=1000)
W = Work(prompts=2, group=4, prompt_len=20, new_tokens=100, train_rows=8)


def test_arithmetic_by_hand() -> None:
    # keys + values: 2 x 2 layers x 2 heads x 16 x 4 bytes = 512 bytes per position per row;
    # 300 positions are allocated as 512 (mlx-lm grows its caches by 256)
    assert memory.kv_cache_bytes(S, 3, 300) == 512 * 3 * 512
    assert memory.kv_cache_bytes(S, 1, 256) == 512 * 256
    # decoding 8 rows of 20 + 100 positions (allocated: 256): 8 x 512 x 256 = 1 MB of cache,
    # one layer's half again while it grows, the 2 prompts' caches (20 -> 256 positions),
    # 4 float32 vocabulary-sized buffers per row
    assert memory.decode_bytes(S, W, 8) == (MB + MB // 2 + 2 * 512 * 256 + 4 * 4 * 8 * 4096)
    # drafting 4 tokens: a step 5 positions wide (5x the vocabulary-sized buffers), and the cache
    # longer by up to 64 + 5 positions of padding: 189 positions, still allocated as 256
    drafted = Work(**{**W.__dict__, "draft_tokens": 4})
    assert memory.decode_bytes(S, drafted, 8) == (MB + MB // 2 + 2 * 512 * 256
                                                  + 4 * 4 * 8 * 5 * 4096)
    # 200 + 100 + 69 positions: 512 allocated
    longer = Work(**{**W.__dict__, "draft_tokens": 4, "prompt_len": 200})
    assert memory.decode_bytes(S, longer, 8) == (2 * MB + MB + 2 * 512 * 256
                                                 + 4 * 4 * 8 * 5 * 4096)
    # a completion row: its prompt's last token + 100 tokens, padded to 8: 104 positions
    assert W.width == 104
    # one block keeps (7 x 64 + 2 x 32 + 3 x 128) floats = 896 floats = 3584 bytes a position
    assert memory.block_bytes(S) == 3584
    # 4 rows x 104 positions = 416; every block (2): 416 x 2 x 3584; checkpointed: each block's
    # input (64 floats) and five blocks' worth (recomputed activations and their gradients)
    assert memory.activation_bytes(S, W, 4, False) == 416 * 2 * 3584
    assert memory.activation_bytes(S, W, 4, True) == 416 * (2 * 64 * 4 + 5 * 3584)
    # the chunk of logits: 64 MB / (4 x 4096) = 4096 positions; 416 + 1 prompt x 20 are fewer
    assert memory.head_bytes(S, W, 436, 9) == 9 * 4 * 4096 * 436
    # the update of 4 rows: hidden states and their gradient (2 x 416 x 64 floats) + the
    # prompt's keys and values gathered to the 4 rows (2 layers x 2 x 32 floats x 20
    # positions) + kept activations + one block's scores (3 copies, 4 heads, 104 x 124) + the
    # loss's 4 chunks of 1 prompt x 20 + 416 positions: all at once (one pass); 6 where the
    # entropies are differentiated (the backward pass recomputes the logits)
    body = 416 * 2 * 3584 + 3 * 4 * 4 * 4 * 104 * 124
    expected = 2 * 416 * 64 * 4 + 2 * 2 * 32 * 4 * 4 * 20 + body
    assert memory.update_bytes(S, W, 4, False) == expected + 4 * 4 * 4096 * 436
    assert memory.update_bytes(S, replace(W, entropy_grad=True), 4, False) == (
        expected + 6 * 4 * 4096 * 436)
    # more positions than a chunk: 4 chunks of 4,096 positions in flight beside the activations
    long = replace(W, new_tokens=2047, train_rows=4)  # 2048 positions a row, 8,192 in all
    body = 8192 * 2 * 3584 + 3 * 4 * 4 * 4 * 2048 * 2068
    head = 4 * 4 * 4096 * 4096
    assert memory.update_bytes(S, long, 4, False) == (
        2 * 8192 * 64 * 4 + 2 * 2 * 32 * 4 * 4 * 20 + body + head)
    # a chunk of 128 MB (a 32 GB budget: 1/256) holds twice the positions
    assert memory.head_bytes(S, replace(long, chunk_mb=128), 8212, 6) == 6 * 4 * 4096 * 8192
    # bfloat16: half the bytes of every activation, the head's bfloat16 output beside each
    # float32 chunk; mlx-lm's SwiGLU (no CPU kernel) keeps 2 more intermediate-sized arrays
    half = replace(S, act_bytes=2, cpu_kernels=False)
    assert memory.block_bytes(half) == (7 * 64 + 2 * 32 + 5 * 128) * 2
    assert memory.head_bytes(half, W, 436, 6) == 6 * (4 + 2) * 4096 * 436
    # weights + adapters with their gradient, summed gradient and AdamW's two moments
    assert memory.fixed_bytes(S) == MB + 5 * 4 * 1000


def test_plan_takes_everything_when_it_fits() -> None:
    p = memory.plan(S, W, 8 * GiB)
    assert (p.decode_width, p.micro_batch, p.checkpoint) == (8, 8, False)
    assert p.peak == memory.peak_bytes(S, W, 8, 8, False) <= 8 * GiB


def test_plan_shrinks_micro_batch_then_checkpoints() -> None:
    deep = replace(S, layers=24)  # checkpointing saves memory only where there are many blocks
    full = memory.fixed_bytes(deep) + memory.update_bytes(deep, W, 8, False)
    p = memory.plan(deep, W, full - 1)  # one row less fits
    assert p.micro_batch < 8 and not p.checkpoint
    assert memory.fixed_bytes(deep) + memory.update_bytes(deep, W, p.micro_batch, False) < full
    one = memory.fixed_bytes(deep) + memory.update_bytes(deep, W, 1, False)
    p = memory.plan(deep, W, one - 1)  # not even one row without checkpointing
    assert p.checkpoint and p.micro_batch >= 1
    with pytest.raises(ConfigError, match="training.grad_checkpoint"):
        memory.plan(deep, W, one - 1, checkpoint="off")


def test_plan_keeps_the_configs_choices_and_names_them() -> None:
    p = memory.plan(S, W, 8 * GiB, decode_width=3, micro_batch=2, checkpoint="on")
    assert (p.decode_width, p.micro_batch, p.checkpoint) == (3, 2, True)
    two = memory.fixed_bytes(S) + memory.update_bytes(S, W, 2, False)
    with pytest.raises(ConfigError, match="training.micro_batch_size"):
        memory.plan(S, W, two - 1, micro_batch=2, checkpoint="off")
    room = memory.fixed_bytes(S) + memory.decode_bytes(S, W, 2)
    with pytest.raises(ConfigError, match="generation.completion_batch_size"):
        memory.plan(S, W, room, decode_width=8)
    assert memory.pick_width(S, W, memory.decode_bytes(S, W, 2), 0) == 2  # the most that fit


def test_plan_refuses_weights_over_budget() -> None:
    with pytest.raises(ConfigError, match="model.quantize"):
        memory.plan(S, W, MB)


def test_activation_target_bounds_the_micro_batch() -> None:
    big = replace(S, layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64)
    long = replace(W, prompts=2, group=8, new_tokens=1024, train_rows=16)
    p = memory.plan(big, long, 16 * GiB)
    assert p.micro_batch < 16
    assert memory.activation_bytes(big, long, p.micro_batch, p.checkpoint) <= (
        memory.ACTIVATION_TARGET)


def test_the_activation_aim_scales_with_the_budget() -> None:
    """The issue's GPU run: 2 x 8 x 256 of the 0.5B shape in bfloat16 on a 105 GB budget was
    split into micro-batches of 4 by a fixed 1 GB aim; the aim is now 1/16 of the budget (at
    least 1 GB), and the logits chunk and compile limit scale the same way."""
    big = Shape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
                vocab=151936, weight_bytes=GiB, act_bytes=2, lora_params=4_400_000,
                cpu_kernels=False)
    step = Work(prompts=2, group=8, prompt_len=48, new_tokens=256, train_rows=16)
    assert memory.plan(big, step, 105 * GiB).micro_batch == 16
    assert memory.plan(big, step, 12 * GiB).micro_batch < 16  # a 16 GB Mac: the 1 GB aim
    assert memory.activation_aim(12 * GiB) == GiB
    assert memory.activation_aim(105 * GiB) == 105 * GiB // 16
    assert memory.logits_chunk_mb(8 * GiB) == 64 and memory.logits_chunk_mb(100 * GiB) == 400
    assert memory.compile_max_logits_mb(0) == 64
    assert memory.compile_max_logits_mb(32 * GiB) == 2048


def test_auto_checkpoints_a_row_over_the_activation_target() -> None:
    """Bounded memory whatever the length: where one sequence's activations are over
    ACTIVATION_TARGET, `auto` checkpoints (even with room to spare); `off` keeps one row."""
    big = replace(S, layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64)
    long = replace(W, prompts=1, group=4, new_tokens=1024, train_rows=4)
    assert memory.activation_bytes(big, long, 1, False) > memory.ACTIVATION_TARGET
    p = memory.plan(big, long, 16 * GiB)  # the aim: 1 GB
    assert p.checkpoint and p.micro_batch >= 1
    assert memory.activation_bytes(big, long, p.micro_batch, True) <= memory.ACTIVATION_TARGET
    off = memory.plan(big, long, 16 * GiB, checkpoint="off")
    assert (off.micro_batch, off.checkpoint) == (1, False)
    short = replace(long, new_tokens=64)  # under the aim: no checkpointing
    assert not memory.plan(big, short, 16 * GiB).checkpoint


def test_shape_of_a_loaded_model(micro_model: Path) -> None:
    policy = load_policy(str(micro_model))
    s = memory.shape_of(policy.model)
    assert (s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
        2, 64, 128, 4, 2, 16, 512)
    # rank 8 on q (64+64), k and v (64+32), o (64+64), gate, up, down (64+128): 1024 x 8 a block
    assert s.lora_params == 2 * 1024 * 8
    assert s.act_bytes == 4
    q = memory.shape_of(load_policy(str(micro_model), quantize=4).model)
    assert q.weight_bytes < s.weight_bytes / 3 and q.act_bytes == 4  # float32 scales
    assert q.lora_params == s.lora_params



def test_the_plan_counts_the_copies_decoding_makes(micro_model: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused adapters' copy and, on MLX's CPU build, the transposed block weights: by hand,
    a block's linear weights are 64x(64+32+32+64) + 3 x 64x128 = 36,864 floats, 2 blocks, 4
    bytes each."""
    from mlx_rlaif import cpu

    model = load_policy(str(micro_model)).model
    cfg = load(None, [])
    block = 2 * 36_864 * 4
    on_cpu = cpu.active()
    assert memory_plan.fused_bytes(model, cfg) == block * (2 if on_cpu else 1)
    monkeypatch.setattr(cpu, "on_cpu", lambda: False)  # a GPU: fused only
    assert memory_plan.fused_bytes(model, cfg) == block
    monkeypatch.setenv("MLX_RLAIF_CPU_KERNELS", "0")
    cfg = load(None, ["generation.fuse_lora_max_mb=0"])
    assert memory_plan.fused_bytes(model, cfg) == 0

def _rollouts(P: int, G: int, n: int, vocab: int) -> list[Rollout]:
    rng = np.random.default_rng(0)
    out = []
    for p in range(P):
        prompt = tuple(int(t) for t in rng.integers(3, vocab, size=12))
        for _ in range(G):
            toks = tuple(int(t) for t in rng.integers(3, vocab, size=n))
            out.append(Rollout(Task(f"t{p}", "x" * 12), prompt, toks, (-3.0,) * n, "", "length",
                               1.0))
    return out


@pytest.mark.slow
def test_the_plan_keeps_a_real_update_within_its_budget(tmp_path: Path) -> None:
    """On a 65,536-word vocabulary (the loss's chunks matter), a budget the whole batch does not
    fit: the plan micro-batches, and the update's measured MLX peak stays within the budget."""
    from mlx_rlaif.backends.mlx import update as upd
    from mlx_rlaif.cpu.kernels import training_fast_paths
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = make_model_dir(tmp_path / "wide", "wide-vocab", seed=1)
    cfg = load(None, [f"model.path={path}", "training.batch_size=2",
                      "generation.num_samples_per_prompt=4", "generation.max_new_tokens=120"])
    policy = load_policy(str(path), cfg.lora)
    s = memory.shape_of(policy.model)
    work = memory_plan.work_of(cfg, 13)
    whole = memory.peak_bytes(s, work, 8, 8, False)
    budget = int(0.75 * whole) + 1
    run_cfg, line = memory_plan.resolve(
        replace(cfg, training=replace(cfg.training, max_memory_gb=budget / GiB)), policy.model,
        [Task("t", "x" * 12)], lambda t: [1] * 13)
    assert 0 < run_cfg.training.micro_batch_size < 8, line
    assert f"micro-batches of {run_cfg.training.micro_batch_size} sequences" in line
    rollouts = _rollouts(2, 4, 120, 65536)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    with training_fast_paths(policy.model):
        upd.update(policy, upd.make_optimizer(run_cfg.training, 10), rollouts,
                   np.linspace(-1, 1, 8), [np.full(120, -3.0)] * 8, run_cfg, 0.02)
    assert mx.get_peak_memory() - before + memory.fixed_bytes(s) <= budget


def test_resolve_writes_the_choices_into_the_config(micro_model: Path) -> None:
    cfg = load(None, [f"model.path={micro_model}", "training.batch_size=2",
                      "generation.num_samples_per_prompt=4", "training.max_memory_gb=8"])
    policy = load_policy(str(micro_model))
    run_cfg, line = memory_plan.resolve(cfg, policy.model, [Task("t", "hello")], lambda t: [1, 2])
    t = run_cfg.training
    # everything fits: the whole batch stays 0 (one pass), auto checkpointing resolves to off
    assert (t.micro_batch_size, t.grad_checkpoint, run_cfg.generation.completion_batch_size) == (
        0, "off", 0)
    assert t.max_memory_gb == 8.0
    assert line.startswith("memory: budget 8.00 GB (training.max_memory_gb); plan: weights")
    assert "decoding 8 sequences at once, micro-batches of 8 sequences, checkpointing off" in line
    assert memory_plan.longest_prompt(lambda t: [0] * len(t.prompt),
                                      [Task(str(i), "x" * i) for i in range(1, 30)]) == 29


def test_train_refuses_a_run_that_cannot_fit(tmp_path: Path) -> None:
    """The CLI stops before the loop, exit code 2, one line naming the setting; nothing written."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "train", "--output-dir", str(out),
         "--no-dashboard", "--set", "training.max_memory_gb=0.001", "--set", "reward.type=syntax",
         "--set", "data.eval_file="],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "training.max_memory_gb" in proc.stderr and "model.quantize" in proc.stderr
    assert not (out / "config.yaml").exists()


# --- Apple silicon: the device query monkeypatched ---------------------------------------------


def test_budget_from_the_config_or_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory.device_budget(2.5) == (int(2.5 * GiB), "training.max_memory_gb")
    from mlx_rlaif.backends.mlx import device

    metal = device.Device("metal", "Apple M2", 16 * GiB)
    monkeypatch.setattr(device, "current", lambda: metal)
    assert memory.device_budget(0) == (int(0.85 * 16 * GiB),
                                       "85% of MLX's recommended working set")
    monkeypatch.setattr(device, "current", lambda: device.Device("cpu", "AMD EPYC"))
    monkeypatch.setattr(memory, "available_ram", lambda: 10 * GiB)
    assert memory.device_budget(0) == (int(0.85 * 10 * GiB), "85% of the available RAM")


def test_metal_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx_lm.utils

    calls: list[str] = []
    monkeypatch.setattr(mlx_lm.utils, "maybe_set_recommended_wired_limit",
                        lambda: calls.append("wired") or 123)
    monkeypatch.setattr(mx, "clear_cache", lambda: calls.append("clear"))
    monkeypatch.setattr(mx, "get_cache_memory", lambda: 2 * GiB)
    monkeypatch.setattr(memory, "recommended_working_set", lambda: None)  # not Metal: nothing
    assert memory.set_device_limits() is None
    assert not memory.clear_cache_if_large(10 * GiB)
    assert calls == []
    monkeypatch.setattr(memory, "recommended_working_set", lambda: 16 * GiB)
    assert memory.set_device_limits() == 123
    assert not memory.clear_cache_if_large(30 * GiB)  # 2 GB is under 10% of 30 GB
    assert memory.clear_cache_if_large(10 * GiB)  # and over 10% of 10 GB
    assert calls == ["wired", "clear"]
