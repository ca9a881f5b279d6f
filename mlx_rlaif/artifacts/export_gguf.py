"""A run's adapters to a folder Ollama and llama.cpp take: `NAME-TYPE.gguf`, `Modelfile` and the
model card `README.md`, written atomically (all three, or nothing).

The steps: mlx-lm loads base + adapters (fuse.py), the architecture and tokenizer are checked
before anything is fused (one line when llama.cpp could not run the result), the adapters are
folded into float weights (a quantized base is dequantized first, said through `say`), gguf.py
writes the file and modelfile.py the Modelfile, from the tokenizer's chat template and
end-of-sequence tokens and the run's system prompt. The name (`--name`, else the base's last
path part with other characters as '-') is checked before anything loads: it is a file name
inside `out`, never a path (modelfile.check_name).

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
    base_cfg = json.loads((tok_dir / "config.json").read_text())
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
