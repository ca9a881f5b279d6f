"""Random-weight Qwen2 models in HF layout, for tests and benchmarks (no hub, no download).

`make_model_dir(path, shape)` writes config.json, model.safetensors and a byte-level BPE
tokenizer with a ChatML template, so `mlx_lm.load(path)` loads it like any HF model. Shapes:
`micro` and `tiny` (4 layers, width 256, vocab 4096: the benchmark's), `tiny-teacher` (6
layers, width 512: about 4x `tiny`'s weights, its toy tokenizer the same: a distillation
teacher for it, tools/bench_distill.py), `qwen0.5b` (Qwen2.5-0.5B's
shape: 24 layers, width 896, vocab 151,936) and `qwen-micro` (Qwen2.5's vocabulary on 2 layers
of width 64: the real tokenizer's paths, fast).

The tokenizer is a toy BPE (at most 4,096 ids, trained on a few lines of code; its ChatML template
has no system prompt; one end-of-sequence id) unless `tokenizer="qwen"`, which writes Qwen2.5's
real tokenizer (`testing/qwen_tokenizer.py`: needs the dev dependency qwen-tokenizer) for the
shapes with Qwen2.5's vocabulary: its 151,665 ids (the rest of the 151,936 rows are padding, as
in the real model), Qwen2.5-Coder-Instruct's ChatML template with the default system prompt,
eos `<|im_end|>`, and generation_config.json with both end-of-sequence ids (`<|im_end|>`,
`<|endoftext|>`), so the `qwen0.5b` fixture built that way runs the real paths: two stop ids,
the chat template, code decoded from real token ids.

Not covered: trained weights (see tools/make_tiny_model.py for the shipped model).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError

SHAPES: dict[str, dict] = {
    "micro": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "wide-vocab": dict(hidden_size=64, num_hidden_layers=1, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=65536),
    "tiny": dict(hidden_size=256, num_hidden_layers=4, intermediate_size=688,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=4096),
    "tiny-teacher": dict(hidden_size=512, num_hidden_layers=6, intermediate_size=1376,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=4096),
    "qwen0.5b": dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                     num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "qwen-micro": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=151936),
}
TOKENIZERS = ("toy", "qwen")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def is_even(n):\n    return n % 2 == 0\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "Write a Python function that returns the sum of a list of numbers.\n",
    "int main() { int x; std::cin >> x; std::cout << x * 2 << std::endl; }\n",
    "fn main() { let v: Vec<i32> = Vec::new(); println!(\"{}\", v.len()); }\n",
]


def make_tokenizer(path: Path, vocab_size: int, corpus: list[str] | None = None) -> None:
    """Train a byte-level BPE on `corpus` and write tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((corpus or _CORPUS) * 4, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "unk_token": None, "chat_template": CHATML, "model_max_length": 4096,
    }, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))


def write_qwen_tokenizer(path: Path, cfg: dict) -> None:
    """Qwen2.5's tokenizer and generation_config.json into `path`; `cfg` gets its token ids."""
    from . import qwen_tokenizer as qt

    ids = qt.ADDED_TOKENS[-1][0] + 1
    if cfg["vocab_size"] < ids:
        raise UsageError(f"Qwen2.5's tokenizer has {ids} ids, the shape {cfg['vocab_size']} "
                         f"embedding rows (Qwen2.5: {qt.VOCAB_SIZE}): use qwen0.5b or qwen-micro")
    qt.write_tokenizer(path)
    (path / "generation_config.json").write_text(json.dumps(qt.generation_config(), indent=2))
    cfg.update(eos_token_id=qt.IM_END, bos_token_id=qt.ENDOFTEXT)


def model_config(shape: str) -> dict:
    return {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": True, "torch_dtype": "float32",
        "eos_token_id": 2, "bos_token_id": None, **SHAPES[shape],
    }


def make_model_dir(path: str | Path, shape: str = "tiny", seed: int = 0,
                   dtype: str = "float32", tokenizer: str = "toy") -> Path:
    """Write a random-weight Qwen2 model of `shape` that mlx_lm.load reads, with the toy
    tokenizer or (`tokenizer="qwen"`) Qwen2.5's real one."""
    import mlx.core as mx
    from mlx_lm.models import qwen2
    from mlx_lm.utils import save_model

    path = Path(path)
    cfg = model_config(shape)
    if tokenizer == "qwen":
        write_qwen_tokenizer(path, cfg)
    elif tokenizer == "toy":
        make_tokenizer(path, min(cfg["vocab_size"], 4096))
    else:
        raise UsageError(f"unknown tokenizer {tokenizer!r}: pick one of {', '.join(TOKENIZERS)}")
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(cfg))
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    save_model(path, model)
    cfg["torch_dtype"] = dtype
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
