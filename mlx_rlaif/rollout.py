"""Rollouts: G completions for each of P prompts, all P x G decoding together.

Built on mlx-lm's `BatchGenerator` with the live LoRA weights (no sync step; small unquantized
models decode with the adapters fused into a temporary copy, `backends.mlx.lora_fused`). Each prompt
is prefilled once (`prefill_once`): its KV cache, holding all but the last prompt token, is given to
the G members of its group, and `BatchKVCache.merge` copies it into the batch, so no group member
recomputes it. The sampler's log-probability of each sampled token is kept, at the sampling
temperature over the full distribution (before top-p/top-k truncation), so the PPO ratio against
it is real and extra PPO iterations need no extra forward.

Not covered: stop strings (only EOS token ids stop), speculative decoding, prompts longer than the
model's context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from .backends.mlx import lora_fused
from .cpu_kernels import fast_cpu_kernels
from .losses import logprobs_and_entropy
from .records import Rollout, Task


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    prefill_once: bool = True
    completion_batch_size: int = 0  # 0: every sequence at once
    fuse_lora_max_mb: int = 256  # backends.mlx.lora_fused (0: never)

    @classmethod
    def from_config(cls, gen: Any) -> SamplingParams:
        return cls(gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens, gen.prefill_once,
                   gen.completion_batch_size, gen.fuse_lora_max_mb)


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


def prompt_formatter(tokenizer: Any, model_cfg: Any = None) -> Callable[[Task], list[int]]:
    chat = getattr(model_cfg, "chat_template", True)
    system = getattr(model_cfg, "system_prompt", "")
    return lambda task: format_prompt(tokenizer, task, chat, system)


def _prefill(model: nn.Module, prompt: list[int]) -> list[Any]:
    """A KV cache holding all but the last token of `prompt`."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _step_logprobs(rows: list[mx.array], tokens: list[int], temperature: float
                   ) -> list[float] | mx.array:
    """log softmax(logits / T)[token] for one decode step, from the generator's rows (already
    log softmax(logits), evaluated). [n]

    At T = 1 the value is read from the rows through numpy views: no device op, no sync, no copy
    of the [n, V] rows (a float list). Otherwise, and for bfloat16 rows that numpy cannot view,
    one lazy array for the caller to evaluate asynchronously."""
    if temperature == 1.0:
        try:
            return [float(np.asarray(r)[t]) for r, t in zip(rows, tokens, strict=True)]
        except (ValueError, TypeError, RuntimeError):  # bfloat16 has no buffer format
            pass
    lp = mx.stack(rows).astype(mx.float32)  # [n, V]
    idx = mx.array(tokens)
    if temperature == 1.0:
        return mx.take_along_axis(lp, idx[:, None], axis=-1)[:, 0]
    return logprobs_and_entropy(lp, idx, temperature)[0]  # entropy is lazy: never computed


def generate(model: nn.Module, prompts_P: Sequence[list[int]], group_size: int,
             params: SamplingParams, eos_ids: Sequence[int]) -> tuple[list[dict], dict]:
    """Sample `group_size` completions per prompt. Returns per-sequence dicts (prompt-major order,
    index p * G + g) with tokens, logprobs, finish_reason, and stats."""
    n = len(prompts_P) * group_size
    width = params.completion_batch_size or n
    sampler = make_sampler(params.temperature, top_p=params.top_p if params.top_p < 1 else 0.0,
                           top_k=params.top_k)
    gen = BatchGenerator(model, max_tokens=params.max_new_tokens,
                         stop_tokens=[[int(e)] for e in eos_ids], sampler=sampler,
                         completion_batch_size=width, prefill_batch_size=width)
    tic = time.perf_counter()
    if params.prefill_once:
        caches = [_prefill(model, p) for p in prompts_P]
        uids = gen.insert([[p[-1]] for p in prompts_P for _ in range(group_size)],
                          caches=[caches[i] for i in range(len(prompts_P))
                                  for _ in range(group_size)],
                          all_tokens=[list(p[:-1]) for p in prompts_P for _ in range(group_size)])
    else:
        uids = gen.insert([list(p) for p in prompts_P for _ in range(group_size)])
    slot = {uid: i for i, uid in enumerate(uids)}
    tokens: list[list[int]] = [[] for _ in range(n)]
    pending: list[tuple[list[int], list[float] | mx.array]] = []
    finish = ["length"] * n
    widths: list[int] = []
    try:
        while responses := gen.next_generated():
            widths.append(len(responses))
            idx = [slot[r.uid] for r in responses]
            toks = [int(r.token) for r in responses]
            lp = _step_logprobs([r.logprobs for r in responses], toks, params.temperature)
            if isinstance(lp, mx.array):
                mx.async_eval(lp)
            pending.append((idx, lp))
            for i, t, r in zip(idx, toks, responses, strict=True):
                tokens[i].append(t)
                if r.finish_reason is not None:
                    finish[i] = r.finish_reason
    finally:
        gen.close()
    logprobs: list[list[float]] = [[] for _ in range(n)]
    mx.eval([lp for _, lp in pending if isinstance(lp, mx.array)])
    for idx, lp in pending:
        for i, v in zip(idx, lp if isinstance(lp, list) else lp.tolist(), strict=True):
            logprobs[i].append(v)
    seconds = time.perf_counter() - tic
    ntok = sum(len(t) for t in tokens)
    stats = {
        "gen/tokens": float(ntok),
        "gen/seconds": seconds,
        "gen/tokens_per_sec": ntok / seconds if seconds > 0 else 0.0,
        "gen/decode_width": float(max(widths, default=0)),
        "gen/decode_width_mean": sum(widths) / len(widths) if widths else 0.0,
    }
    seqs = [{"tokens": t, "logprobs": lp, "finish_reason": f}
            for t, lp, f in zip(tokens, logprobs, finish, strict=True)]
    return seqs, stats


def sample(model: nn.Module, tokenizer: Any, tasks: Sequence[Task], params: SamplingParams,
           group_size: int, format: Callable[[Task], list[int]] | None = None
           ) -> tuple[list[Rollout], dict]:
    """Rollouts for `tasks` (P) with `group_size` (G) completions each, prompt-major (P x G)."""
    fmt = format or prompt_formatter(tokenizer)
    prompts_P = [fmt(t) for t in tasks]
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or {tokenizer.eos_token_id})
    with lora_fused(model, params.fuse_lora_max_mb * 2**20), fast_cpu_kernels(model):
        seqs, stats = generate(model, prompts_P, group_size, params, eos)
    eos_set = set(eos)
    rollouts = []
    for i, s in enumerate(seqs):
        p = i // group_size
        body = [t for t in s["tokens"] if t not in eos_set]
        rollouts.append(Rollout(
            task=tasks[p], prompt_tokens=tuple(prompts_P[p]), tokens=tuple(s["tokens"]),
            logprobs=tuple(s["logprobs"]), text=tokenizer.decode(body),
            finish_reason=s["finish_reason"], temperature=params.temperature))
    return rollouts, stats
