"""What both backends share about sampling: the sampling parameters, prompt token ids from a
task (the tokenizer's chat template, or the plain text), and a conversation's next user turn
(`Reply`, `feedback_tokens`).

Not covered: stop strings, logits processors (neither backend supports them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..records import Task


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    prefill_once: bool = True
    completion_batch_size: int = 0  # 0: every sequence at once
    fuse_lora_max_mb: int = 256  # backends.mlx.policy.lora_fused (0: never)
    draft_tokens: int = 0  # backends.mlx.speculative: tokens drafted per row and step (0: off)

    @classmethod
    def from_config(cls, gen: Any) -> SamplingParams:
        draft = gen.draft_tokens if gen.speculative == "ngram" else 0
        return cls(gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens, gen.prefill_once,
                   gen.completion_batch_size, gen.fuse_lora_max_mb, draft)


def format_prompt(tokenizer: Any, task: Task, chat_template: bool = True,
                  system_prompt: str = "") -> list[int]:
    """Prompt token ids: the tokenizer's chat template when it has one (and it is enabled)."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": task.prompt})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    text = f"{system_prompt}\n\n{task.prompt}" if system_prompt else task.prompt
    ids = tokenizer.encode(text)
    bos = getattr(tokenizer, "bos_token_id", None)
    return list(ids) if ids else ([bos] if bos is not None else [0])


@dataclass(frozen=True)
class Reply:
    """What follows one answer of a conversation: the feedback turn's token ids (None: the
    conversation ends here), its text, and whether the answer passed the visible tests."""

    tokens: list[int] | None
    feedback: str = ""
    passed: bool | None = None


def feedback_tokens(tokenizer: Any, text: str, eos_id: int, chat_template: bool = True) -> list[int]:
    """The token ids that follow an answer ended by `eos_id` to give the student `text` as the
    next user turn and open its next answer: through the chat template when there is one (what
    the template writes after an assistant message's end marker, then the user turn and the
    generation prompt), else as plain text between blank lines."""
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        return list(tokenizer.encode(f"\n\n{text}\n\n", add_special_tokens=False))
    turn = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    before = tokenizer.apply_chat_template(turn, tokenize=False)
    after = tokenizer.apply_chat_template([*turn, {"role": "user", "content": text}],
                                          tokenize=False, add_generation_prompt=True)
    end = tokenizer.decode([eos_id])
    cut = before.rfind(end)
    tail = before[cut + len(end):] if cut >= 0 else ""
    return list(tokenizer.encode(tail + after[len(before):], add_special_tokens=False))


def prompt_formatter(tokenizer: Any, model_cfg: Any = None) -> Callable[[Task], list[int]]:
    chat = getattr(model_cfg, "chat_template", True)
    system = getattr(model_cfg, "system_prompt", "")
    return lambda task: format_prompt(tokenizer, task, chat, system)
