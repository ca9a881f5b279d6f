"""A run's adapters to a folder Ollama and llama.cpp take: `NAME-TYPE.gguf`, `Modelfile` and the
model card `README.md`, written atomically (all three, or nothing).

The steps: mlx-lm loads base + adapters (fuse.py), the architecture and tokenizer are checked
before anything is fused (one line when llama.cpp could not run the result), the adapters are
folded into float weights (a quantized base is dequantized first, said through `say`), gguf.py
writes the file and modelfile.py the Modelfile, from the tokenizer's chat template and
end-of-sequence tokens and the run's system prompt. The name (`--name`, else the base's last
path part with other characters as '-') is checked before anything loads: it is a file name
inside `out`, never a path (modelfile.check_name).

The model's own files are checked before anything loads, each fault one line naming the file and
field (`check_model_files`): special token ids in config.json and generation_config.json (an
integer in the vocabulary, or a list of them), added tokens in tokenizer.json that gguf would
number past the vocabulary (one renamed in `added_tokens` but not in `model.vocab`), and text
that is not UTF-8 (a lone surrogate) in the tokenizer's JSON files.

Not covered: what gguf.py and modelfile.py list; several types in one call (run it per type).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import gguf, hub_push, modelfile
from .atomic import atomic_dir

MODELFILE = "Modelfile"


@dataclass(frozen=True)
class Exported:
    gguf: gguf.GgufInfo
    modelfile: Path
    card: Path


def tokenizer_dir(base: str) -> Path:
    """The local directory holding the base model's tokenizer.json."""
    from mlx_lm.utils import _download

    from ..assets import model_source

    path = Path(_download(model_source(base)))
    if not (path / "tokenizer.json").is_file():
        raise UsageError(f"{base} has no tokenizer.json: GGUF export needs the fast "
                         "(tokenizer.json) form of its tokenizer")
    return path


SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_json(path: Path) -> Any:
    """A model file's JSON; one line naming the file when it is not JSON or holds text that is
    not UTF-8 (a lone surrogate escaped as \\ud800)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeError as e:
        raise UsageError(f"{path}: holds text that is not UTF-8 ({e.reason}): fix the file") \
            from None
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e}): fix the file") from None
    return data


def _is_id(v: Any, n_vocab: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n_vocab


def check_special_ids(path: Path, cfg: Any, n_vocab: int) -> None:
    """Token ids in `cfg` (config.json, generation_config.json): None, an id in the vocabulary
    or a non-empty list of them."""
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: not a JSON object: fix the file")
    for key in SPECIAL_IDS:
        v = cfg.get(key)
        if v is None or _is_id(v, n_vocab) or (
                isinstance(v, list) and v and all(_is_id(x, n_vocab) for x in v)):
            continue
        raise UsageError(f"{path}: {key} {v!r}: must be a token id (an integer from 0 to "
                         f"{n_vocab - 1}) or a list of them: fix the file")


def check_added_tokens(path: Path, tok: Any) -> None:
    """tokenizer.json's added tokens that are not in `model.vocab` must take the ids right after
    it, in order (gguf numbers them so): a token renamed in `added_tokens` alone is named."""
    vocab = ((tok.get("model") or {}).get("vocab") if isinstance(tok, dict) else None)
    added = tok.get("added_tokens") if isinstance(tok, dict) else None
    if not isinstance(vocab, dict) or not isinstance(added, list):
        return
    extra = sorted((t.get("id"), t.get("content")) for t in added
                   if isinstance(t, dict) and t.get("content") not in vocab)
    for want, (got, content) in enumerate(extra, len(vocab)):
        if got != want:
            raise UsageError(f"{path}: added_tokens: {content!r} (id {got}) is not in "
                             f"model.vocab, so its id must be {want} (the vocabulary has "
                             f"{len(vocab)} tokens): an added token renamed here but not in "
                             "model.vocab? fix the file")


def check_model_files(tok_dir: Path) -> dict[str, Any]:
    """The base's config.json (returned), generation_config.json, tokenizer.json and
    tokenizer_config.json, checked as GGUF export reads them."""
    cfg = read_json(tok_dir / "config.json")
    n_vocab = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    if not _is_id(n_vocab, 1 << 31) or not n_vocab:
        raise UsageError(f"{tok_dir / 'config.json'}: vocab_size {n_vocab!r}: must be a "
                         "positive integer: fix the file")
    check_special_ids(tok_dir / "config.json", cfg, n_vocab)
    if (tok_dir / "generation_config.json").is_file():
        check_special_ids(tok_dir / "generation_config.json",
                          read_json(tok_dir / "generation_config.json"), n_vocab)
    check_added_tokens(tok_dir / "tokenizer.json", read_json(tok_dir / "tokenizer.json"))
    if (tok_dir / "tokenizer_config.json").is_file():
        read_json(tok_dir / "tokenizer_config.json")
    return cfg


def float_weights(fused: Any) -> dict[str, Any]:
    """The fused model's tensors as float32 numpy arrays, Hugging Face names."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    return {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(fused.parameters())}


def chat_format_of(tokenizer: Any) -> modelfile.ChatFormat:
    template = getattr(tokenizer, "chat_template", None)
    rendered = None
    if template:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": modelfile.PROBE_USER}], tokenize=False,
            add_generation_prompt=True)
    return modelfile.chat_format(template, rendered)


def adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer puts its bos token before a text it encodes."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer.encode("a")
    return bos is not None and bool(ids) and ids[0] == bos


def stop_tokens(tokenizer: Any) -> list[str]:
    ids = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    return [tokenizer.convert_ids_to_tokens(int(i)) for i in ids]


def system_prompt(adapter_dir: Path, override: str | None) -> str | None:
    if override is not None:
        return override or None
    cfg = hub_push.run_config(adapter_dir)
    text = (cfg.get("model") or {}).get("system_prompt") if isinstance(cfg, dict) else None
    return text or None


def export(adapter_dir: Path, base: str, out: Path, type_name: str, name: str | None = None,
           system: str | None = None, say: Callable[[str], object] = print,
           status: Callable[[str], object] = lambda s: None) -> Exported:
    """Fuse `adapter_dir` into `base` and write the GGUF, Modelfile and card into `out`."""
    from . import fuse

    gguf.check_type(type_name)
    name = modelfile.check_name(name) if name is not None else modelfile.default_name(base)
    gguf.require()
    tok_dir = tokenizer_dir(base)
    base_cfg = check_model_files(tok_dir)
    gguf.arch_of(base_cfg)
    gguf.pre_tokenizer(json.loads((tok_dir / "tokenizer.json").read_text()))
    model, tokenizer, config = fuse.load_with_adapters(base, adapter_dir)
    fmt = chat_format_of(tokenizer)
    q = config.get("quantization")
    if q:
        say(f"the base is {q.get('bits', '?')}-bit: dequantized to float, adapters folded in, "
            f"then written as {type_name}")
    status("fusing the adapters into float weights")
    fused, cfg, _corr = fuse.fuse(model, config, fuse.Quantization())
    weights = float_weights(fused)
    del fused, model
    file_name = f"{name}-{type_name}.gguf"
    status(f"writing {file_name}")
    with atomic_dir(out) as tmp:
        info = gguf.write_gguf(tmp / file_name, weights, cfg, tok_dir, type_name, name,
                               add_bos=adds_bos(tokenizer))
        text = modelfile.modelfile(file_name, fmt, stop_tokens(tokenizer),
                                   system_prompt(adapter_dir, system))
        (tmp / MODELFILE).write_text(text)
        hub_push.write_card(tmp, "gguf", base, adapter_dir)
    return Exported(replace(info, path=out / file_name), out / MODELFILE, out / hub_push.CARD)
