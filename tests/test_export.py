"""convert, fuse, export-peft and the per-checkpoint MLX export, on a tiny random Qwen2 model.

The adapters get random non-zero lora_b, so every fused or exported model differs visibly from
the base, and "equal to base + adapter" is a real check.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load

from mlx_rlaif import cli
from mlx_rlaif.artifacts import checkpoint, fuse
from mlx_rlaif.artifacts import peft as peft_format
from mlx_rlaif.artifacts.lora import lora_layers
from mlx_rlaif.backends.mlx.policy import adapter_config_for, load_policy, lora_disabled
from mlx_rlaif.config import LoraConfig

TOKENS = mx.array([[1, 17, 33, 100, 2, 40, 7, 300, 12]])


@pytest.fixture()
def run_cli(monkeypatch):
    """`mlx-rlaif ...` in-process with only this file's commands registered."""
    monkeypatch.setattr(cli, "COMMANDS", {"convert": "convert", "fuse": "fuse",
                                          "export-peft": "export_peft"})
    return lambda *argv: cli.main([str(a) for a in argv])


def logits(model) -> np.ndarray:
    return np.array(model(TOKENS).astype(mx.float32))


def make_run(base: Path, run_dir: Path, magnitude: float, lora: LoraConfig | None = None,
             seed: int = 1):
    """A run directory with one checkpoint whose adapters have random lora_b."""
    policy = load_policy(str(base), lora or LoraConfig(rank=4, scale=2.0))
    mx.random.seed(seed)
    for _, m in policy.model.named_modules():
        if hasattr(m, "lora_b"):
            m.lora_b = mx.random.normal(m.lora_b.shape) * magnitude
    mx.eval(policy.model.parameters())
    ckpt = checkpoint.save_checkpoint(run_dir, "checkpoint-e1-b1-gs1", policy.model,
                                      adapter_config_for(policy), checkpoint.LoopState(step=1))
    return policy, ckpt


def with_and_without_adapter(policy) -> tuple[np.ndarray, np.ndarray]:
    adapted = logits(policy.model)
    with lora_disabled(policy.model):
        base = logits(policy.model)
    return adapted, base


def maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


@pytest.fixture(scope="module")
def q4_base(tmp_path_factory, micro_model) -> Path:
    out = tmp_path_factory.mktemp("q4") / "q4"
    from mlx_lm.convert import convert

    convert(str(micro_model), str(out), quantize=True, q_bits=4, q_group_size=32)
    return out


# --- convert --------------------------------------------------------------------------------


def test_convert_hf_layout_float_and_quantized(micro_model, tmp_path, run_cli):
    ref, _ = load(str(micro_model))
    assert run_cli("convert", "--hf-path", micro_model, "--mlx-path", tmp_path / "f32") == 0
    model, tok = load(str(tmp_path / "f32"))
    assert maxdiff(logits(model), logits(ref)) < 1e-5
    assert tok.eos_token_id is not None

    assert run_cli("convert", "--hf-path", micro_model, "--mlx-path", tmp_path / "q8", "-q",
                   "--q-bits", "8", "--q-group-size", "32") == 0
    config = json.loads((tmp_path / "q8" / "config.json").read_text())
    assert config["quantization"]["bits"] == 8 and config["quantization"]["group_size"] == 32
    q8, _ = load(str(tmp_path / "q8"))
    assert any(type(m).__name__ == "QuantizedLinear" for _, m in q8.named_modules())
    err = maxdiff(logits(q8), logits(ref))
    assert 0 < err < 0.05 * np.abs(logits(ref)).max()  # 8-bit: close, not identical
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary directory left behind


def test_convert_refuses_a_non_empty_destination(micro_model, tmp_path, run_cli, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert run_cli("convert", "--hf-path", micro_model, "--mlx-path", out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--mlx-path" in err and "not empty" in err
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


def test_convert_rejects_a_directory_without_a_model(tmp_path, run_cli, capsys):
    (tmp_path / "empty").mkdir()
    assert run_cli("convert", "--hf-path", tmp_path / "empty", "--mlx-path", tmp_path / "o") == 2
    assert "config.json" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --- fuse -----------------------------------------------------------------------------------


def test_fuse_float_equals_base_plus_adapter(micro_model, tmp_path, run_cli):
    policy, _ = make_run(micro_model, tmp_path / "run", 0.05)
    adapted, base = with_and_without_adapter(policy)
    assert maxdiff(adapted, base) > 0.5  # the adapter matters
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "fused") == 0
    fused, _ = load(str(tmp_path / "fused"))
    assert not any("lora" in type(m).__name__.lower() for _, m in fused.named_modules())
    assert maxdiff(logits(fused), adapted) < 1e-4
    assert "quantization" not in json.loads((tmp_path / "fused" / "config.json").read_text())


def test_fuse_quantized_is_within_quantization_error(micro_model, tmp_path, run_cli):
    policy, _ = make_run(micro_model, tmp_path / "run", 0.05)
    adapted, base = with_and_without_adapter(policy)
    assert run_cli("convert", "--hf-path", micro_model, "--mlx-path", tmp_path / "base8", "-q",
                   "--q-bits", "8", "--q-group-size", "32") == 0
    base_err = maxdiff(logits(load(str(tmp_path / "base8"))[0]), base)  # quantizing the base
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "fused8", "--quantize", "8",
                   "--q-group-size", "32") == 0
    fused8, _ = load(str(tmp_path / "fused8"))
    assert json.loads((tmp_path / "fused8" / "config.json").read_text())[
        "quantization"]["bits"] == 8
    err = maxdiff(logits(fused8), adapted)
    assert err < 3 * base_err + 1e-3, (err, base_err)
    assert err < 0.1 * maxdiff(adapted, base)


def test_fuse_onto_a_quantized_base_keeps_the_adapter(q4_base, tmp_path, run_cli):
    policy, _ = make_run(q4_base, tmp_path / "run", 0.05)
    adapted, base = with_and_without_adapter(policy)
    effect = maxdiff(adapted, base)
    # default: the base's own precision (4-bit), adapter folded into dequantized weights
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "q4fused") == 0
    cfg = json.loads((tmp_path / "q4fused" / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4 and cfg["quantization"]["group_size"] == 32
    fused = logits(load(str(tmp_path / "q4fused"))[0])
    assert maxdiff(fused, base) > 0.5 * effect  # the adapter was not dropped
    assert maxdiff(fused, adapted) < maxdiff(fused, base)
    # --dequantize: float weights, exactly base + adapter
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "float", "--dequantize") == 0
    assert "quantization" not in json.loads((tmp_path / "float" / "config.json").read_text())
    assert maxdiff(logits(load(str(tmp_path / "float"))[0]), adapted) < 1e-4


def test_fuse_refuses_when_4bit_rounding_would_drop_the_adapter(q4_base, tmp_path, run_cli,
                                                                 capsys):
    policy, _ = make_run(q4_base, tmp_path / "run", 0.005)  # a small, late-training-size update
    adapted, base = with_and_without_adapter(policy)
    assert maxdiff(adapted, base) > 0.05  # the adapter does change the outputs
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "lost") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dequantize" in err and "correlation" in err
    assert not (tmp_path / "lost").exists()
    # 8 bits keeps it
    assert run_cli("fuse", tmp_path / "run", "--out", tmp_path / "kept", "--quantize", "8",
                   "--q-group-size", "32") == 0
    kept = logits(load(str(tmp_path / "kept"))[0])
    assert maxdiff(kept, adapted) < maxdiff(kept, base)


def test_adapter_correlation_of_float_and_zero_adapters(micro_model, tmp_path):
    policy, _ = make_run(micro_model, tmp_path / "run", 0.05)
    lora = lora_layers(policy.model)
    assert fuse.adapter_correlation(lora, fuse.fuse_float(policy.model)) == pytest.approx(
        1.0, abs=1e-5)
    zero = load_policy(str(micro_model), LoraConfig(rank=4, scale=2.0))  # lora_b = 0
    fused = fuse.fuse_float(zero.model)
    assert fuse.adapter_correlation(lora_layers(zero.model), fused) is None


def test_fuse_without_base_model_recorded_asks_for_model(micro_model, tmp_path, run_cli, capsys):
    _, ckpt = make_run(micro_model, tmp_path / "run", 0.05)
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    del cfg["base_model"]
    (ckpt / "adapter_config.json").write_text(json.dumps(cfg))
    assert run_cli("fuse", ckpt, "--out", tmp_path / "o") == 1
    assert "--model" in capsys.readouterr().err
    assert run_cli("fuse", ckpt, "--out", tmp_path / "o", "--model", micro_model) == 0


def test_write_mlx_model_leaves_the_training_model_alone(micro_model, tmp_path):
    policy, ckpt = make_run(micro_model, tmp_path / "run", 0.05)
    before = logits(policy.model)
    out = fuse.write_mlx_model(policy.model, policy.tokenizer, ckpt, bits=None)
    assert out == ckpt / "mlx_model"
    assert maxdiff(logits(load(str(out))[0]), before) < 1e-4
    info = json.loads((out / "export.json").read_text())
    assert info["bits"] is None and info["adapter_correlation"] == pytest.approx(1.0, abs=1e-5)
    assert maxdiff(logits(policy.model), before) == 0.0
    assert lora_layers(policy.model)  # still a LoRA model that can keep training


# --- PEFT -------------------------------------------------------------------------------------

PEFT_LORA = LoraConfig(rank=4, scale=2.5, num_layers=1,
                       keys=("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"))


def test_export_peft_names_shapes_and_alpha(micro_model, tmp_path, run_cli):
    make_run(micro_model, tmp_path / "run", 0.3, PEFT_LORA)
    assert run_cli("export-peft", tmp_path / "run", "--out", tmp_path / "peft",
                   "--base-name", "Qwen/Qwen2.5-Coder-0.5B-Instruct") == 0
    cfg = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 10  # 2.5 * 4
    assert cfg["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    assert cfg["layers_to_transform"] == [1]  # micro has 2 blocks; num_layers=1 adapts the last
    assert cfg["base_model_name_or_path"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    w = mx.load(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert len(w) == 6
    # hidden 64, kv heads 2 x head dim 16 = 32, intermediate 128
    assert w["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, 64)
    assert w["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"].shape == (32, 4)
    assert w["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].shape == (4, 128)


def test_peft_export_reloaded_through_hf_names_gives_the_same_logits(micro_model, tmp_path):
    policy, _ = make_run(micro_model, tmp_path / "run", 0.3, PEFT_LORA)
    adapted = logits(policy.model)
    peft_format.export_peft(tmp_path / "run", tmp_path / "peft")
    cfg = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    weights, params = peft_format.mlx_from_peft(
        mx.load(str(tmp_path / "peft" / "adapter_model.safetensors")), cfg)
    assert params == {"rank": 4, "scale": 2.5, "dropout": 0.0}
    fresh = load_policy(str(micro_model), LoraConfig(rank=params["rank"], scale=params["scale"],
                                                     num_layers=1, keys=PEFT_LORA.keys))
    assert maxdiff(logits(fresh.model), adapted) > 0.5  # fresh adapters: lora_b = 0
    fresh.model.load_weights(list(weights.items()), strict=False)
    assert maxdiff(logits(fresh.model), adapted) < 1e-5


def test_peft_export_gives_the_same_logits_in_transformers(micro_model, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    policy, _ = make_run(micro_model, tmp_path / "run", 0.3, PEFT_LORA)
    adapted = logits(policy.model)
    peft_format.export_peft(tmp_path / "run", tmp_path / "peft")
    hf = AutoModelForCausalLM.from_pretrained(str(micro_model), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(hf, str(tmp_path / "peft")).eval()
    ids = torch.tensor(np.array(TOKENS))
    with torch.no_grad():
        out = model(ids).logits.numpy()
        with model.disable_adapter():
            plain = model(ids).logits.numpy()
    assert maxdiff(plain, adapted) > 0.5
    assert maxdiff(out, adapted) < 1e-4


def test_export_peft_refuses_dora(micro_model, tmp_path, run_cli, capsys):
    _, ckpt = make_run(micro_model, tmp_path / "run", 0.1)
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    (ckpt / "adapter_config.json").write_text(json.dumps({**cfg, "fine_tune_type": "dora"}))
    assert run_cli("export-peft", ckpt, "--out", tmp_path / "peft") == 2
    assert "only LoRA" in capsys.readouterr().err
    assert not (tmp_path / "peft").exists()
