"""The shipped tiny model: loads with mlx-lm like any HF model, chats in ChatML, completes a
function stub and stops at eos."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-coder"


@pytest.fixture(scope="module")
def loaded():
    from mlx_lm import load

    return load(str(MODEL))


def test_files_and_size() -> None:
    names = {p.name for p in MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md"} <= names
    assert sum(p.stat().st_size for p in MODEL.iterdir()) < 25 * 2**20
    config = json.loads((MODEL / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["num_hidden_layers"] == 4 and config["hidden_size"] == 256
    assert config["vocab_size"] == 4096


def test_loads_as_qwen2_with_a_few_million_parameters(loaded) -> None:
    from mlx.utils import tree_flatten
    from mlx_lm.models.qwen2 import Model

    model, _ = loaded
    assert isinstance(model, Model)
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    assert 2_000_000 < n < 10_000_000


def test_chat_template_is_chatml_and_eos_is_im_end(loaded) -> None:
    _, tok = loaded
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.eos_token_ids == {tok.convert_tokens_to_ids("<|im_end|>")}
    assert tok.decode(tok.encode("def f(x):\n    return x + 12\n")) == "def f(x):\n    return x + 12\n"


def test_greedy_answer_completes_a_stub_and_ends_with_eos(loaded) -> None:
    import mlx_lm

    model, tok = loaded
    stub = 'def add_value(x, k=3):\n    """Returns x plus k."""\n'
    prompt = tok.apply_chat_template([{"role": "user", "content": stub}],
                                     add_generation_prompt=True)
    steps = list(mlx_lm.stream_generate(model, tok, prompt, max_tokens=64))
    assert steps[-1].finish_reason == "stop" and len(steps) < 32
    body = tok.decode([s.token for s in steps if s.token not in tok.eos_token_ids])
    # the model answers with the body (what a completion model writes for HumanEval); whether
    # it is right is the exec reward's business, measured in the model card
    assert body.startswith("   ") and "return" in body
    compile(stub + body, "<tiny>", "exec")
