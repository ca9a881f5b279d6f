"""A teacher model in the student's process (distill.kind teacher): loaded once through mlx-lm,
frozen, never given adapters, and its log-probs of the student's sampled tokens.

The teacher reads the student's token ids as they are, so its tokenizer must encode text to the
same ids: `tokenizer_mismatch` compares the two on probe strings (code, prose, whitespace, the
special tokens, the chat-template markers) and the end-of-sequence ids; a difference stops the
run at load in one line naming both tokenizers (no re-tokenization: not in scope). The
forward is the reference pass's (`update.policy_logprobs`: micro-batches sized by the memory
plan, each prompt computed once for its group, the head's log-probs a chunk of positions at a
time): only the sampled tokens' log-probs are kept, never a [rows, positions, vocabulary]
tensor.

Not covered: teachers with another tokenizer (cross-tokenizer distillation), teachers behind
APIs (no log-probs over the student's tokens), the torch backend (config.check refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ... import cpu
from ...config import Config
from ...cpu.experts import float32_experts
from ...cpu.kernels import training_fast_paths
from ...errors import UsageError
from ...records import Rollout
from .device import kind_of, quantized_problem
from .loss import Split, split_head
from .policy import is_quantized, load_model

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
    """Where the two tokenizers differ (None: the same vocabulary where both list theirs, every
    probe encoded to the same ids, the same end-of-sequence id)."""
    va, vb = vocabulary(student), vocabulary(teacher)
    if va is not None and vb is not None and va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()), key=str)[:1]
        return f"vocabularies of {len(va)} and {len(vb)} tokens differ (first: {diff[0]!r})"
    for text in PROBES:
        a, b = student.encode(text), teacher.encode(text)
        if list(a) != list(b):
            return f"{text[:24]!r} is {list(a)[:6]}... for the student, {list(b)[:6]}... " \
                   "for the teacher"
    eos_a = getattr(student, "eos_token_id", None)
    eos_b = getattr(teacher, "eos_token_id", None)
    if eos_a != eos_b:
        return f"end-of-sequence id {eos_a} for the student, {eos_b} for the teacher"
    return None


def vocabulary(tokenizer: Any) -> dict[str, int] | None:
    """The token -> id map of a tokenizer (None where it gives none)."""
    get = getattr(tokenizer, "get_vocab", None)
    try:
        return dict(get()) if callable(get) else None
    except Exception:  # noqa: BLE001  (a tokenizer whose vocabulary cannot be listed)
        return None


def load_teacher(path: str, student_tokenizer: Any, student_path: str, quantize: int = 0,
                 trust_remote_code: bool = False) -> Teacher:
    """The teacher, frozen (quantized to `quantize` bits at load where it is not already);
    UsageError in one line where its tokenizer does not encode the student's text to the same
    ids."""
    model, tokenizer = load_model(path, trust_remote_code)
    why = tokenizer_mismatch(student_tokenizer, tokenizer)
    if why is not None:
        raise UsageError(f"distill.teacher {path}: its tokenizer "
                         f"({tokenizer_name(tokenizer, path)}) does not encode text to the "
                         f"student's ({tokenizer_name(student_tokenizer, student_path)}) ids "
                         f"({why}): pick a teacher of the same model family")
    problem = quantized_problem(kind_of(), mx.__version__) if quantize or is_quantized(model) \
        else None
    if problem:
        raise UsageError(f"distill.teacher_quantize: {problem}")
    if quantize and not is_quantized(model):
        from mlx_lm.utils import quantize_model

        quantize_model(model, {}, None, quantize)
    if cpu.on_cpu():  # as the policy: GatherMM runs only in float32 on MLX's CPU build
        float32_experts(model)
    model.freeze()
    model.train(False)
    mx.eval(model.parameters())
    return Teacher(model, tokenizer, path, split_head(model))


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
