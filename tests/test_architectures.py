"""Every architecture users bring trains, or is refused at load in one line that names the fix.

Tiny random models of mlx-lm's architectures (mlx_rlaif/testing/archs.py: dense, MoE, hybrid
SSM / linear-attention / convolution, nested text_config) each train 2 steps in float32,
bfloat16 and 4-bit (`model.quantize=4`), in process, or are refused with one line
(`REFUSED`). Beside the sweep: 16-bit experts held in float32 on the CPU build and counted by
the memory plan; the body/head split of the architectures that scale or nest their head; the
memory plan's shapes read from nested configs, hybrid and MoE blocks; the refusal through the
CLI (exit code 2, one line, no traceback); an error inside mlx-lm's model code at load.

README.md and docs/models.md carry the table this sweep gives.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from recording_hub import RecordingHub

from mlx_rlaif.backends.mlx import memory
from mlx_rlaif.backends.mlx.loss import split_head
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.config import load
from mlx_rlaif.cpu.experts import Float32SwitchLinear
from mlx_rlaif.errors import UsageError
from mlx_rlaif.testing.archs import ARCHS, make_arch_dir

ROOT = Path(__file__).resolve().parent.parent
MODES = ("float32", "bfloat16", "4-bit")
# (model_type, mode) -> what the one-line refusal must say
REFUSED = {
    # mlx-lm's seed_oss multiplies by the tied embedding's weight itself (`h @ W.T`), which a
    # quantized embedding holds packed
    ("seed_oss", "4-bit"): r"seed_oss\.py:\d+ `return h @ self\.model\.embed_tokens\.weight\.T`"
                           r".*model\.quantize: 0",
}
VERSION = re.escape(__import__("mlx_lm").__version__)


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Model directories, built on first use: (model_type, dtype) -> path."""
    root, made = tmp_path_factory.mktemp("archs"), {}

    def get(model_type: str, dtype: str) -> Path:
        if (model_type, dtype) not in made:
            made[model_type, dtype] = make_arch_dir(root / f"{model_type}-{dtype}", model_type,
                                                    dtype)
        return made[model_type, dtype]
    return get  # type: ignore[return-value]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("arch-tasks") / "tasks.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Write a function f{i}.", "language": "python"})
                         + "\n" for i in range(2)))
    return p


def two_steps(model: Path, tasks: Path, out: Path, mode: str) -> list[dict]:
    """2 RL steps of 1 prompt x 2 completions of at most 4 tokens, an entropy bonus and a KL
    penalty so that the gradient is never zero; the steps' metrics."""
    cfg = load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=syntax", "generation.max_new_tokens=4", "generation.num_samples_per_prompt=2",
        "training.batch_size=1", "training.max_steps=2", "rl.drop_zero_std=false",
        "rl.entropy_coef=0.05", "rl.kl_penalty=0.1", "logging.tensorboard=false",
        "logging.baseline_eval_batches=0", "logging.collect_dataset=false",
        "training.save_every_epochs=0", "data.eval_file=",
        *(["model.quantize=4"] if mode == "4-bit" else [])])
    from mlx_rlaif.train import train

    hub = RecordingHub()
    train(cfg, hub=hub)
    return [m for _, m in hub.steps]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", list(ARCHS))
def test_every_architecture_trains_two_steps_or_is_refused_in_one_line(
        model_type: str, mode: str, arch_dirs, tasks: Path, tmp_path: Path) -> None:
    model = arch_dirs(model_type, "bfloat16" if mode == "bfloat16" else "float32")
    if (model_type, mode) in REFUSED:
        with pytest.raises(UsageError) as e:
            two_steps(model, tasks, tmp_path / "run", mode)
        line = str(e.value)
        assert "\n" not in line
        assert re.search(rf"the {model_type} model fails .* in mlx-lm {VERSION} ", line), line
        assert re.search(REFUSED[model_type, mode], line), line
        return
    steps = two_steps(model, tasks, tmp_path / "run", mode)
    assert len(steps) == 2
    for m in steps:
        for key in ("loss/total", "optim/grad_norm", "kl/mean", "policy/entropy"):
            assert math.isfinite(m[key]), (key, m[key])
        assert m["optim/grad_norm"] > 0  # the adapters were trained


def test_sixteen_bit_experts_run_in_float32_on_the_cpu_and_the_plan_counts_them(arch_dirs
                                                                                ) -> None:
    """GatherMM runs only in float32 on MLX's CPU build: a bfloat16 MoE model's experts are held
    in float32 there (their bytes in the plan's weights), the rest of the model in bfloat16,
    and its outputs are those of the float32 model's up to bfloat16's resolution."""
    if mx.default_device() != mx.cpu:
        pytest.skip("the float32 experts are the CPU build's")
    policy = load_policy(str(arch_dirs("qwen3_moe", "bfloat16")))
    experts = [m for _, m in policy.model.named_modules() if isinstance(m, Float32SwitchLinear)]
    assert len(experts) == 2 * 3  # 2 layers x gate, up, down
    assert all(m.weight.dtype == mx.float32 for m in experts)
    assert policy.model.model.embed_tokens.weight.dtype == mx.bfloat16
    x = mx.array([[1, 2, 3, 4]])
    out = policy.model(x)
    assert out.dtype == mx.bfloat16
    ref = load_policy(str(arch_dirs("qwen3_moe", "float32"))).model(x)
    # bfloat16 activations may route a token to other experts: compared on the whole
    assert (mx.abs(out.astype(mx.float32) - ref).mean() / mx.abs(ref).mean()).item() < 0.1
    assert (out.argmax(-1) == ref.argmax(-1)).all().item()
    shape = memory.shape_of(policy.model)
    expert_bytes = sum(m.weight.nbytes for m in experts)
    assert expert_bytes == 2 * sum(m.weight.size for m in experts) * 2  # 4 bytes, not 2
    held = sum(v.nbytes for k, v in tree_flatten(policy.model.parameters()) if "lora" not in k)
    assert shape.weight_bytes == held and shape.act_bytes == 2


def test_experts_left_in_16_bits_are_refused_in_one_line_naming_the_quantization(
        arch_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a 16-bit expert layer is not converted (here: the conversion switched off), the
    CPU build's GatherMM error is one line naming model.quantize: 4, not a traceback."""
    if mx.default_device() != mx.cpu:
        pytest.skip("GatherMM's float32-only limit is the CPU build's")
    from mlx_rlaif.backends.mlx import policy

    monkeypatch.setattr(policy, "float32_experts", lambda model: 0)
    with pytest.raises(UsageError) as e:
        load_policy(str(arch_dirs("qwen3_moe", "bfloat16")))
    line = str(e.value)
    assert "\n" not in line
    assert re.search(rf"the qwen3_moe model fails at first use in mlx-lm {VERSION} .*GatherMM.*"
                     r"model\.quantize: 4", line), line


@pytest.mark.parametrize("model_type", ["granite", "granitemoehybrid", "nemotron_h", "mistral3",
                                        "qwen3_5"])
def test_the_head_splits_off_where_it_is_scaled_nested_or_under_a_backbone(
        model_type: str, arch_dirs) -> None:
    """Granite divides its logits by logits_scaling, Nemotron-H's transformer is `backbone`,
    Mistral 3 and Qwen3.5 nest theirs in `language_model`: each splits into body and head
    (so the loss's logits are chunked) and head(body(x)) is the model's output."""
    policy = load_policy(str(arch_dirs(model_type, "float32")))
    split = split_head(policy.model)
    assert split is not None and policy.split is not None
    x = mx.array([[5, 6, 7]])
    assert mx.allclose(split.head(split.body(x)), policy.model(x), atol=1e-5).item()
    assert not memory.shape_of(policy.model).full_logits


def test_the_memory_plan_reads_nested_configs_hybrid_and_moe_blocks(arch_dirs) -> None:
    shapes = {t: memory.shape_of(load_policy(str(arch_dirs(t, "float32"))).model)
              for t in ("qwen2", "qwen3_moe", "nemotron_h", "qwen3_5", "mistral3")}
    dense = shapes["qwen2"]
    # a dense block from its own layers is the formula's: 7 x 64 + 2 x 32 + 3 x 128 elements
    assert dense.layer_elems == (896, 896) and memory.block_bytes(dense) == 896 * 4
    assert memory.kv_elems(dense) == 2 * 2 * 2 * 16 and dense.state_bytes == 0
    # nested text_config: planned like the flat model
    for t in ("qwen3_5", "mistral3"):
        assert shapes[t] is not None and shapes[t].hidden == 64 and shapes[t].vocab == 512, t
    assert shapes["mistral3"].layer_elems == dense.layer_elems
    # MoE: 4 x 64 + q 64 + k 32 + v 32 + o 64 + router 4 + 2 active experts x (gate 32 + up
    # 32 + down 64) + the gated product (2 x 32): not the dense MLP of 128
    cpu_kernels = shapes["qwen3_moe"].cpu_kernels
    product = 2 * 32 * (1 if cpu_kernels else 1 + memory.UNFUSED_SWIGLU)
    assert shapes["qwen3_moe"].layer_elems == (256 + 192 + 4 + 2 * 128 + product,) * 2
    # hybrid: Mamba, attention, MoE blocks; only the attention block keeps keys and values
    # (2 x 2 heads x 16 a position), the Mamba block a fixed state per row
    h = shapes["nemotron_h"]
    assert len(set(h.layer_elems)) == 3
    assert memory.kv_elems(h) == 2 * 2 * 16 and h.state_bytes > 0
    assert memory.kv_cache_bytes(h, 3, 10) == 64 * 4 * 3 * 256 + 3 * h.state_bytes
    # qwen3_5: 1 of 2 layers full attention, the other linear attention with a state per row
    assert memory.kv_elems(shapes["qwen3_5"]) == 2 * 2 * 16 and shapes["qwen3_5"].state_bytes


def test_the_plan_counts_whole_rows_where_prompts_are_not_shared(arch_dirs) -> None:
    """A hybrid model's caches are not plain KV caches, so its update runs every row in full
    (shared_prompt.supported): the plan counts the prompt's positions in each row."""
    from mlx_rlaif.train.memory_plan import work_of

    cfg = load(None, ["training.batch_size=2", "generation.num_samples_per_prompt=4",
                      "generation.max_new_tokens=100"])
    dense = load_policy(str(arch_dirs("qwen2", "float32"))).model
    hybrid = load_policy(str(arch_dirs("nemotron_h", "float32"))).model
    assert work_of(cfg, 20, dense).shared and not work_of(cfg, 20, hybrid).shared
    w = work_of(cfg, 20, hybrid)
    assert (w.width, w.context) == (120, 0)  # 20 + 100 positions, none before them
    s = memory.shape_of(hybrid)
    # 4 rows of 120 positions: hidden states, kept activations, one block's scores (120 x
    # 120), the loss's 4 chunks of 480 positions; no prompt keys gathered to the rows
    positions = 4 * 120
    expected = (2 * positions * 64 * 4 + positions * sum(s.layer_elems) * 4
                + memory.scores_bytes(s, 4, 120, 120) + 4 * 4 * 512 * positions)
    assert memory.update_bytes(s, w, 4, False) == expected
    shared = work_of(cfg, 20, dense)
    assert (shared.width, shared.context) == (104, 20)


def test_a_soft_capped_head_takes_the_full_logits_and_the_plan_counts_them(arch_dirs) -> None:
    """Gemma 2 soft-caps its logits after the head: no split (the loss takes the full logits,
    and the sweep trains it that way), and the plan counts them whole."""
    policy = load_policy(str(arch_dirs("gemma2", "float32")))
    assert policy.split is None and memory.shape_of(policy.model).full_logits


def test_full_logits_are_counted_where_the_head_does_not_split() -> None:
    s = memory.Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
                     vocab=4096, weight_bytes=2**20, act_bytes=4, lora_params=1000)
    w = memory.Work(prompts=1, group=2, prompt_len=20, new_tokens=100, train_rows=2,
                    chunk_mb=1)  # 64 positions a chunk
    assert memory.head_bytes(s, w, 1000, 4) == 4 * 4 * 4096 * 64
    full = memory.Shape(**{**s.__dict__, "full_logits": True})
    assert memory.head_bytes(full, w, 1000, 4) == 4 * 4 * 4096 * 1000


@pytest.mark.slow
def test_the_cli_refuses_an_architecture_mlx_lm_cannot_run_in_one_line(arch_dirs, tasks: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model",
         str(arch_dirs("seed_oss", "float32")), "--train-file", str(tasks), "--output-dir",
         str(out), "--max-steps", "1", "--no-dashboard", "--set", "model.quantize=4",
         "--set", "data.eval_file=", "--set", "reward.type=syntax"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if "seed_oss" in ln]
    assert len(lines) == 1 and re.search(REFUSED["seed_oss", "4-bit"], lines[0]), r.stderr


def test_an_error_inside_mlx_lms_model_code_at_load_is_one_line(arch_dirs, tmp_path: Path
                                                                ) -> None:
    """A nemotron_h config without its layer pattern fails in mlx-lm's ModelArgs: one line
    naming the model type, the mlx-lm version and the line of mlx-lm that raised."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(arch_dirs("nemotron_h", "float32"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["hybrid_override_pattern"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError) as e:
        load_policy(str(bad))
    line = str(e.value)
    assert "\n" not in line
    assert re.search(rf"the nemotron_h model fails at load in mlx-lm {VERSION} .*nemotron_h\.py:"
                     r"\d+ .*layers_block_type or hybrid_override_pattern", line), line
