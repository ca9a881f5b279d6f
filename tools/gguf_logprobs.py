"""How close llama.cpp runs an exported GGUF to MLX: next-token log-probs, per tensor type.

    python tools/gguf_logprobs.py            # needs llama-cpp-python and the dev extra

A random-weight Qwen2 of width 64 with Qwen2.5's real tokenizer (mlx_rlaif.testing.randmodel,
`qwen-micro`) gets random non-zero LoRA adapters; `export-gguf`'s library call writes it as each
type; llama-cpp-python loads each file and scores three prompts (the tests' prompts,
tests/test_gguf.py). Printed per type: the largest |log p(llama.cpp) - log p(MLX)| over MLX's 20
most likely tokens at every position, the same against MLX running the weights the file holds
(gguf's own dequantization: what is left is llama.cpp's arithmetic), the share of positions whose
most likely token agrees, and the file's size. BENCHMARKS.md has the results.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_rlaif.artifacts import checkpoint, export_gguf, fuse
from mlx_rlaif.backends.mlx.policy import adapter_config_for, load_policy
from mlx_rlaif.config import LoraConfig
from mlx_rlaif.testing.randmodel import make_model_dir

PROMPTS = ("def add(a, b):\n    return",
           "Write a function that reverses a string. Use slicing, 3 lines at most!",
           "<|im_start|>user\nSort [3, 1, 2] in Python.<|im_end|>\n<|im_start|>assistant\n")
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")


def make_run(root: Path, seed: int) -> Path:
    base = make_model_dir(root / "base", "qwen-micro", seed=seed, tokenizer="qwen")
    policy = load_policy(str(base), LoraConfig(rank=4), seed=seed)
    mx.random.seed(seed)
    moved = [(k, 0.05 * mx.random.normal(v.shape) if k.endswith("lora_b") else v)
             for k, v in tree_flatten(policy.model.trainable_parameters())]
    policy.model.update(tree_unflatten(moved))
    checkpoint.save_checkpoint(root / "run", "checkpoint-final-gs1", policy.model,
                               adapter_config_for(policy), checkpoint.LoopState(step=1))
    return root / "run"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(llm, model, tok) -> tuple[float, float]:
    """(largest top-20 log-prob gap, share of positions with the same most likely token)."""
    worst, same, n = 0.0, 0, 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == list(ids)
        llm.reset()
        llm.eval(ids)
        a = log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float64))
        b = log_softmax(np.array(model(mx.array([ids]))[0].astype(mx.float32), np.float64))
        top = np.argsort(-b, -1)[:, :20]
        worst = max(worst, float(np.abs(np.take_along_axis(a, top, -1)
                                        - np.take_along_axis(b, top, -1)).max()))
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += len(ids)
    return worst, same / n


def as_stored(model, path: Path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, 2)
    model = fuse.clone_modules(model)
    model.update(tree_unflatten([
        (k, mx.array(np.asarray(stored[names.get_name(k, try_suffixes=(".weight", ".bias"))],
                                np.float32).reshape(v.shape)))
        for k, v in tree_flatten(model.parameters())]))
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp), args.seed)
        adapter = checkpoint.resolve(run)
        base = checkpoint.base_model_of(adapter)
        model, tok, cfg = fuse.load_with_adapters(base, adapter)
        fused = fuse.fuse(model, cfg, fuse.Quantization())[0]
        print("| type | max top-20 log-prob gap vs MLX (float) | vs MLX on the file's weights "
              "| same most likely token | file MiB |")
        print("|---|---|---|---|---|")
        for t in TYPES:
            out = export_gguf.export(adapter, base, Path(tmp) / t, t, say=lambda s: None)
            llm = Llama(model_path=str(out.gguf.path), logits_all=True, n_ctx=256,
                        verbose=False)
            gap, agree = compare(llm, fused, tok)
            same_w = compare(llm, as_stored(fused, out.gguf.path), tok)[0] \
                if t.startswith("q") else gap
            mib = out.gguf.path.stat().st_size / 2**20
            print(f"| {t} | {gap:.4f} | {same_w:.4f} | {100 * agree:.0f}% | {mib:.1f} |")


if __name__ == "__main__":
    main()
