"""A teacher model in the student's process (distill.kind teacher): loaded once through mlx-lm,
frozen, never given adapters, and its log-probs of the student's sampled tokens.

The teacher reads the student's token ids as they are, so its tokenizer must encode text to the
same ids: `tokenizer_mismatch` compares the two whole vocabularies (`get_vocab()`, added tokens
included), their added tokens with their special flags, the set of end-of-sequence ids as
mlx-lm's wrappers see them (`eos_token_ids`: config.json, generation_config.json and the
tokenizer's own), and the encodings of probe strings (code, prose, whitespace, the special
tokens, the chat-template markers, and text around every added token's content of either
tokenizer); a difference stops the run at load, before the teacher's weights are read, in one
line naming both tokenizers (no re-tokenization: not in scope).

Before its weights are loaded the teacher is planned from its files (`weight_files.preflight`): the
safetensors headers (their tensors must lie inside the files), config.json against them (the
number of layers, the embedding's rows and width, at least a parameter per layer and hidden
unit), and the weights' bytes against the memory budget left beside the student; a teacher that
fails stops the run in one line naming it and the fix, before mlx-lm builds its model (a config
of 10**9 layers would otherwise grow the process until it is killed). The run's full memory
plan (memory_plan.py) counts the loaded teacher's weights and forward after that. Loaded, the
teacher runs one forward of three tokens (probe.py, as the policy does): a teacher that fails
inside mlx-lm stops the run at load in one line, not at its first pass. The
forward is the reference pass's (`update.policy_logprobs`: micro-batches sized by the memory
plan, each prompt computed once for its group, the head's log-probs a chunk of positions at a
time): only the sampled tokens' log-probs are kept, never a [rows, positions, vocabulary]
tensor.

Not covered: teachers with another tokenizer (cross-tokenizer distillation), teachers behind
APIs (no log-probs over the student's tokens), the torch backend (config.check refuses it);
the config-against-weights check knows mlx-lm's `model.layers.N.` and `embed_tokens` names
(weights named otherwise are checked for their bytes only; weights with more layers than the
config, as extra prediction layers, are left to mlx-lm's strict load); weight formats other than safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...assets import model_source
from ...config import Config
from ...cpu.kernels import training_fast_paths
from ...errors import UsageError
from ...records import Rollout
from .loss import Split, split_head
from .policy import is_quantized, load_model
from .probe import probe
from .weight_files import preflight, read_config

PROBES = (
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += v[i]; }",
    "Write a function that returns the n-th Fibonacci number.",
    "    \t\n  x = [1, 2, 3]  # comment\n\n",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "naïve café – “quotes” 数字 🙂",
    "fn main() { println!(\"{}\", 42); }",
)


@dataclass
class Teacher:
    model: nn.Module
    tokenizer: Any
    path: str
    split: Split | None


def tokenizer_name(tokenizer: Any, path: str) -> str:
    """How a tokenizer is named in messages: its name_or_path, else the model's path."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    return str(getattr(inner, "name_or_path", "") or path)


def tokenizer_mismatch(student: Any, teacher: Any) -> str | None:
    """Where the two tokenizers differ (None: the same vocabulary with its added tokens and
    their special flags, the same set of end-of-sequence ids, every probe encoded to the same
    ids)."""
    va, vb = vocabulary(student), vocabulary(teacher)
    if va is not None and vb is not None and va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()), key=str)[:1]
        return f"vocabularies of {len(va)} and {len(vb)} tokens differ (first: {diff[0]!r})"
    aa, ab = added_tokens(student), added_tokens(teacher)
    if aa != ab:
        diff = sorted(set(aa.items()) ^ set(ab.items()), key=str)[:1]
        return f"added tokens differ (first: id, text, special {diff[0]!r})"
    eos_a, eos_b = eos_ids(student), eos_ids(teacher)
    if eos_a != eos_b:
        return f"end-of-sequence ids {eos_a} for the student, {eos_b} for the teacher"
    for text in probes(aa, ab):
        a, b = student.encode(text), teacher.encode(text)
        if list(a) != list(b):
            return f"{text[:24]!r} is {list(a)[:6]}... for the student, {list(b)[:6]}... " \
                   "for the teacher"
    return None


def added_tokens(tokenizer: Any) -> dict[int, tuple[str, bool]]:
    """id -> (text, special) of a tokenizer's added tokens ({} where it lists none)."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        decoder = dict(getattr(inner, "added_tokens_decoder", None) or {})
    except Exception:  # noqa: BLE001  (a tokenizer whose added tokens cannot be listed)
        return {}
    return {int(i): (str(getattr(t, "content", t)), bool(getattr(t, "special", False)))
            for i, t in decoder.items()}


def eos_ids(tokenizer: Any) -> list[int]:
    """The end-of-sequence ids as mlx-lm's wrapper sees them (its `eos_token_ids`, else the
    tokenizer's one `eos_token_id`), sorted."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        one = getattr(tokenizer, "eos_token_id", None)
        ids = [] if one is None else [one]
    return sorted(ids, key=str)


def probes(*added: dict[int, tuple[str, bool]]) -> list[str]:
    """PROBES, and for every added token's text of either tokenizer that text inside prose."""
    texts = sorted({text for a in added for text, _ in a.values()})
    return [*PROBES, *(f"it is {t} that x, {t}{t} and x{t}" for t in texts)]


def vocabulary(tokenizer: Any) -> dict[str, int] | None:
    """The token -> id map of a tokenizer (None where it gives none)."""
    get = getattr(tokenizer, "get_vocab", None)
    try:
        return dict(get()) if callable(get) else None
    except Exception:  # noqa: BLE001  (a tokenizer whose vocabulary cannot be listed)
        return None


def load_teacher(path: str, student_tokenizer: Any, student_path: str, quantize: int = 0,
                 trust_remote_code: bool = False, room: int | None = None) -> Teacher:
    """The teacher, frozen (quantized to `quantize` bits at load where it is not already);
    UsageError in one line, before its weights are read, where its tokenizer does not encode
    the student's text to the same ids, its config disagrees with its weight files or its
    weights are over `room` bytes (the budget less the student's weights; None: unchecked)."""
    local = local_dir(path)
    if local is not None:
        preflight(f"distill.teacher {path}", "teacher", local, room, quantize)  # first: the
        # tokenizer loader reads config.json
        check_tokenizer(path, local, student_tokenizer, student_path)
    model, tokenizer = load_model(path, trust_remote_code, quantize, "distill.teacher_quantize: ",
                                  planned=local is not None)
    why = tokenizer_mismatch(student_tokenizer, tokenizer)
    if why is not None:
        raise mismatch_error(path, tokenizer, student_tokenizer, student_path, why)
    model.freeze()
    model.train(False)
    probe(model, bool(quantize) or is_quantized(model), train=False,
          name=f"distill.teacher {path}: ")
    mx.eval(model.parameters())
    return Teacher(model, tokenizer, path, split_head(model))


def mismatch_error(path: str, tokenizer: Any, student_tokenizer: Any, student_path: str,
                   why: str) -> UsageError:
    return UsageError(f"distill.teacher {path}: its tokenizer "
                      f"({tokenizer_name(tokenizer, path)}) does not encode text to the "
                      f"student's ({tokenizer_name(student_tokenizer, student_path)}) ids "
                      f"({why}): pick a teacher of the same model family")


def local_dir(path: str) -> Path | None:
    """The teacher's directory on this machine (a hub id fetched as mlx-lm fetches it); None
    where it cannot be had (mlx-lm's loader then says why in one line)."""
    from mlx_lm.utils import _download

    try:
        p = Path(_download(model_source(path)))
    except UsageError:
        raise
    except Exception:  # noqa: BLE001  (the loader reports a path it cannot fetch)
        return None
    return p if (p / "config.json").is_file() else None


def check_tokenizer(path: str, local: Path, student_tokenizer: Any, student_path: str) -> None:
    """The teacher's tokenizer alone, loaded as mlx-lm's `load` loads it (end-of-sequence ids
    from config.json too), against the student's: UsageError in one line where they differ."""
    from mlx_lm.utils import load_tokenizer

    try:
        tokenizer = load_tokenizer(local, {}, eos_token_ids=read_config(local).get(
            "eos_token_id"))
    except Exception:  # noqa: BLE001  (the loader reports a tokenizer it cannot load)
        return
    why = tokenizer_mismatch(student_tokenizer, tokenizer)
    if why is not None:
        raise mismatch_error(path, tokenizer, student_tokenizer, student_path, why)


def teacher_logprobs(teacher: Teacher, rollouts: list[Rollout], cfg: Config
                     ) -> list[np.ndarray]:
    """The teacher's log-probs of each rollout's completion tokens (after its prompt), at the
    sampling temperature, in micro-batches as the reference pass."""
    from .update import policy_logprobs

    with training_fast_paths(teacher.model):
        return policy_logprobs(teacher.model, rollouts, cfg, teacher.split)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters as loaded (quantized included)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
