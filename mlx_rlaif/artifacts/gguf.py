"""A fused model as one GGUF file: what llama.cpp, Ollama and LM Studio's GGUF engine load.

The model arrives fused and in float (artifacts/fuse.py: adapters folded into dequantized
weights), as a flat `{mlx name: array}` dict with its config.json and tokenizer directory. Written
with the `gguf` package (llama.cpp's own Python library): its tensor-name map turns the Hugging
Face names mlx-lm keeps into GGUF's (`model.layers.0.self_attn.q_proj.weight` ->
`blk.0.attn_q.weight`), its quantizers make q8_0 / q4_0 blocks, `BpeVocab` and `SpecialVocab` read
the tokenizer (tokens, merges, special ids, the chat template) and `GGUFWriter` writes the file.

Covered: Qwen2/2.5 (`qwen2`), Qwen3 (`qwen3`: q/k norms) and Llama 3 (`llama`: q/k rows permuted
to llama.cpp's rotary layout, Llama 3.1's `llama3` RoPE scaling as the `rope_freqs` tensor),
tied or separate output embeddings, tensor types f32, f16, bf16, q8_0 and q4_0 (the 4-bit type the
`gguf` package can write; its k-quants only read). Tokenizers: byte-level BPE with Qwen2's or
Llama 3's pre-tokenizer (`tokenizer.ggml.pre` qwen2 / llama-bpe, recognised from the split regex
in tokenizer.json); anything else is refused with one line, since llama.cpp would tokenize it
wrongly without saying so.

Which tensors keep more precision: 1-D tensors (norms, biases) stay f32 in every type, as
llama.cpp's converter does; a matrix whose rows are not a whole number of quantization blocks
falls back to f16; with q4_0 the token embedding (the output layer too, when tied) is q8_0, so
the 4-bit file loses its precision in the blocks and not in every logit.

Not covered: other architectures (MoE, multimodal, Mistral, Gemma, Phi), SentencePiece
tokenizers, k-quants (q4_K_M: llama.cpp's `llama-quantize` makes them from our f16 file), rope
scaling other than llama3's, writing in pieces (the converted tensors are held in memory once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError

# config.json's model_type -> the gguf package's MODEL_ARCH member
ARCHS: dict[str, str] = {"qwen2": "QWEN2", "qwen3": "QWEN3", "llama": "LLAMA"}
ARCH_NAMES = "Qwen2/Qwen2.5 (qwen2), Qwen3 (qwen3), Llama 3 (llama)"

# --type -> (tensor type of the matrices, llama.cpp's file type)
TYPES: dict[str, tuple[str, str]] = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
}

# the pre-tokenizer split regex of tokenizer.json -> llama.cpp's name for it
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, str] = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}


@dataclass(frozen=True)
class GgufInfo:
    """What was written: the file, its type, the architecture, counts."""

    path: Path
    type: str
    arch: str
    tensors: int
    vocab: int
    pre_tokenizer: str


def require() -> None:
    """One line when the gguf package is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError("GGUF export needs the gguf package: pip install 'mlx-rlaif[gguf]' "
                         "(or pip install gguf)") from None


def arch_of(config: Mapping[str, Any]) -> str:
    """The gguf MODEL_ARCH member name for config.json's model_type, or one line naming the
    supported ones."""
    mt = config.get("model_type")
    if mt not in ARCHS:
        raise UsageError(f"GGUF export does not support model_type {mt!r}: it supports "
                         f"{ARCH_NAMES}; for others use llama.cpp's convert_hf_to_gguf.py on a "
                         "fused model (mlx-rlaif fuse --dequantize)")
    return ARCHS[mt]


def check_type(name: str) -> str:
    if name not in TYPES:
        raise UsageError(f"unknown GGUF type {name!r}: pick one of {', '.join(TYPES)}")
    return name


def pre_tokenizer(tokenizer_json: Mapping[str, Any]) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer (qwen2, llama-bpe), from its split
    regex; one line when llama.cpp would not recognise it."""
    model = tokenizer_json.get("model", {})
    found = [p.get("pattern", {}).get("Regex") for p in _pre_steps(tokenizer_json)
             if p.get("type") == "Split"]
    if model.get("type") == "BPE" and len(found) == 1 and found[0] in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[found[0]]
    raise UsageError("GGUF export needs a byte-level BPE tokenizer with Qwen2's or Llama 3's "
                     "pre-tokenizer (llama.cpp would tokenize this one wrongly); this model's "
                     f"tokenizer is a {model.get('type', '?')} with split {found or 'none'}")


def _pre_steps(tokenizer_json: Mapping[str, Any]) -> list[dict]:
    pre = tokenizer_json.get("pre_tokenizer") or {}
    return list(pre.get("pretokenizers", [pre]))


def vocab(tokenizer_dir: Path, n_vocab: int) -> tuple[list[bytes], list[int]]:
    """Token texts and types for ids 0..n_vocab-1 (gguf's BpeVocab): normal tokens, special
    added tokens as CONTROL, other added tokens USER_DEFINED, ids past the tokenizer (embedding
    rows it does not fill) as UNUSED `[PAD{id}]`, as llama.cpp's converter does."""
    import gguf

    bpe = gguf.vocab.BpeVocab(tokenizer_dir)
    special = {t["content"]: bool(t.get("special"))
               for t in json.loads((tokenizer_dir / "tokenizer.json").read_text())
               .get("added_tokens", [])}
    tokens, types = [], []
    for text, _score, kind in bpe.all_tokens():
        raw = text if isinstance(text, bytes) else str(text).encode()
        if kind == gguf.TokenType.CONTROL and not special.get(raw.decode(), True):
            kind = gguf.TokenType.USER_DEFINED
        tokens.append(raw)
        types.append(int(kind))
    if len(tokens) > n_vocab:
        raise UsageError(f"the tokenizer has {len(tokens)} tokens, the model's embedding only "
                         f"{n_vocab} rows: pass the base model the tokenizer belongs to")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]".encode())
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, types


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Llama's q/k rows from Hugging Face's rotary layout (halves) to llama.cpp's (pairs)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(config: Mapping[str, Any]) -> np.ndarray | None:
    """Llama 3.1's per-frequency RoPE scaling (`rope_scaling.rope_type: llama3`) as llama.cpp's
    `rope_freqs` tensor; None without scaling. Other scaling types are refused."""
    rs = config.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if not rs or kind in (None, "default"):
        return None
    if kind != "llama3":
        raise UsageError(f"GGUF export does not support rope_scaling type {kind!r} (only "
                         "llama3's): use llama.cpp's convert_hf_to_gguf.py on a fused model")
    dim = head_dim(config)
    freqs = 1.0 / (config.get("rope_theta", 10000.0) ** (np.arange(0, dim, 2) / dim))
    factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), \
        rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def head_dim(config: Mapping[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def tensor_type(gguf_name: str, shape: tuple[int, ...], type_name: str, tied: bool) -> str:
    """The GGML type of one tensor (see the module docstring for the rules)."""
    import gguf

    want = TYPES[type_name][0]
    if len(shape) < 2:
        return "F32"
    if type_name == "q4_0" and (gguf_name == "output.weight"
                                or (tied and gguf_name == "token_embd.weight")):
        want = "Q8_0"
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[want]][0]
    if shape[-1] % block:
        return "F16"
    return want


def gguf_tensors(weights: Mapping[str, np.ndarray], config: Mapping[str, Any],
                 arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) for every tensor, in llama.cpp's layout."""
    import gguf

    n_blocks = int(config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], n_blocks)
    for name, w in weights.items():
        if "rotary_emb.inv_freq" in name:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise UsageError(f"tensor {name} has no GGUF name for {arch.lower()}: the model is "
                             f"not one of {ARCH_NAMES}")
        w = np.asarray(w, dtype=np.float32)
        if arch == "LLAMA" and name.endswith("q_proj.weight"):
            w = permute_rotary(w, int(config["num_attention_heads"]))
        elif arch == "LLAMA" and name.endswith("k_proj.weight"):
            w = permute_rotary(w, int(config.get("num_key_value_heads")
                                      or config["num_attention_heads"]))
        yield new, w
    factors = llama3_rope_factors(config)
    if factors is not None:
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors


def add_hparams(writer: Any, config: Mapping[str, Any], arch: str, type_name: str) -> None:
    """The architecture metadata llama.cpp reads."""
    import gguf

    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config.get("num_key_value_heads")
                                 or config["num_attention_heads"]))
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    dim = head_dim(config)
    if dim != config["hidden_size"] // config["num_attention_heads"] or arch == "QWEN3":
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    if arch == "LLAMA":
        writer.add_rope_dimension_count(dim)
        writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(gguf.LlamaFileType[TYPES[type_name][1]])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_gguf(path: Path, weights: Mapping[str, np.ndarray], config: Mapping[str, Any],
               tokenizer_dir: Path, type_name: str, name: str, add_bos: bool = False) -> GgufInfo:
    """Write `weights` (a fused float model, Hugging Face names) as one GGUF file at `path`.
    `add_bos`: whether the tokenizer puts its bos token before a text (llama.cpp does the same
    when it tokenizes for the model)."""
    import gguf

    arch = arch_of(config)
    check_type(type_name)
    tok_json = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    pre = pre_tokenizer(tok_json)
    n_vocab = int(config["vocab_size"])
    tokens, types = vocab(Path(tokenizer_dir), n_vocab)
    tied = "lm_head.weight" not in weights
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]])
    writer.add_name(name)
    add_hparams(writer, config, arch, type_name)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(Path(tokenizer_dir), load_merges=True, n_vocab=n_vocab).add_to_gguf(writer)
    writer.add_add_bos_token(add_bos)
    count = 0
    for gname, w in gguf_tensors(weights, config, arch):
        qtype = gguf.GGMLQuantizationType[tensor_type(gname, w.shape, type_name, tied)]
        data = w if qtype == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(w, qtype)
        writer.add_tensor(gname, data, raw_dtype=qtype)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GgufInfo(Path(path), type_name, arch.lower(), count, n_vocab, pre)
