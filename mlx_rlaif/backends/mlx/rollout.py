"""Rollouts: G completions for each of P prompts, all P x G decoding together.

The live LoRA weights decode (no sync step; small unquantized models with the adapters fused into
a temporary copy, `policy.lora_fused`) in `decode.decode`'s batched loop. Each prompt is
prefilled once (`prefill_once`): its KV cache, holding all but the last prompt token, is given to
the G members of its group, so no group member recomputes it. The P prompts are prefilled in one
forward, left-padded, into mlx-lm's `BatchKVCache`, whose rows are then repeated for the groups
(models with other caches, sliding windows for instance, prefill each prompt and `merge`). On
MLX's CPU build the prefill multiplies on every core (many rows per product: 1.3-1.4x faster at
the tiny shape; `cpu.blas`), unless scoring shares the cores. The sampler's log-probability of
each sampled token is kept, at the sampling temperature over the full distribution (before
top-p/top-k truncation), so the PPO ratio against it is real and extra PPO iterations need no
extra forward. `completion_batch_size` splits
the rows into batches decoded one after the other.

With `generation.speculative: ngram` (`params.draft_tokens` > 0) the rows decode in
speculative.py's loop where their caches allow: several tokens per forward pass drafted from
each row's own prompt and completion, the sampled distribution unchanged.

Not covered: stop strings (only EOS token ids stop), draft models, prompts longer than the
model's context.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from ...cpu.blas import blas_threads, train_threads
from ...cpu.kernels import decode_rope, fast_cpu_kernels
from ...records import Rollout, Task, Turn
from ..batch import chunks
from ..sampling import Reply, SamplingParams, prompt_formatter
from . import shared_prompt, speculative
from .compiled_decode import decode as decode_one
from .decode import Clock, Decoded, merged_cache, picker
from .policy import lora_fused


def prefill(model: nn.Module, prompt: list[int]) -> list[Any]:
    """A KV cache holding all but the last token of `prompt`."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def prefill_batch(model: nn.Module, prompts: Sequence[list[int]]) -> list[BatchKVCache]:
    """One batch cache per layer holding all but the last token of each prompt, from one
    forward of the prompts left-padded to a common length (mlx-lm's `BatchKVCache`, which
    masks the padding and starts each row's positions at its first real token)."""
    heads = [list(p[:-1]) for p in prompts]
    width = max(len(h) for h in heads)
    pad = [width - len(h) for h in heads]
    cache = [BatchKVCache(pad) for _ in model.layers]
    if width:
        model(mx.array([[0] * k + h for k, h in zip(pad, heads, strict=True)]), cache=cache)
        mx.eval([c.state[:4] for c in cache])
    return cache


def _rows(cache: list[BatchKVCache], rows: list[int]) -> list[BatchKVCache]:
    """A copy of a batch cache with the given rows (repeats allowed): the decoding batch."""
    out = []
    for c in cache:
        new = BatchKVCache([0] * len(rows))
        new.state = c.state
        new.filter(mx.array(rows))
        out.append(new)
    return out


@contextlib.contextmanager
def decoding(model: nn.Module, params: SamplingParams) -> Iterator[None]:
    """The model as rollouts decode it: LoRA fused where `params` allows, and on MLX's CPU
    build the CPU kernels."""
    with lora_fused(model, params.fuse_lora_max_mb * 2**20), fast_cpu_kernels(model), \
            decode_rope(model):
        yield


def generate(model: nn.Module, prompts_P: Sequence[list[int]], group_size: int,
             params: SamplingParams, eos_ids: Sequence[int], keep_caches: bool = False,
             on_seq: Callable[[int, dict], None] | None = None,
             compiled: bool | None = None, clock: Clock | None = None,
             shared_cores: bool = False) -> tuple[list[dict], dict]:
    """Sample `group_size` completions per prompt. Returns per-sequence dicts (prompt-major order,
    index p * G + g) with tokens, logprobs, finish_reason (and with `keep_caches` the row's
    per-layer KV cache, for a conversation to continue from), and stats. `on_seq(index, seq)`
    sees each sequence as soon as it ends, while the others still decode. `compiled`: the
    decode loop (None: compiled where it applies, `compiled_decode.supported`); `clock`: the
    loop's per-step phase hook (tools/profile_decode.py); `shared_cores`: other work (scoring)
    runs while it decodes."""
    n = len(prompts_P) * group_size
    prompt_of = [i // group_size for i in range(n)]
    pick = picker(params.temperature, params.top_p, params.top_k)
    tic = time.perf_counter()
    with decoding(model, params):
        batched = params.prefill_once and shared_prompt.supported(model)  # plain KV caches
        with blas_threads(0 if shared_cores else train_threads()):  # the prompts: many rows
            if batched:
                prefilled = prefill_batch(model, prompts_P)
            elif params.prefill_once:
                caches = [prefill(model, p) for p in prompts_P]
                row_caches = [caches[p] for p in prompt_of]
            else:
                row_caches = [prefill(model, prompts_P[p]) for p in prompt_of]
        parts = []
        for rows in chunks(n, params.completion_batch_size):
            cache = _rows(prefilled, prompt_of[rows]) if batched \
                else merged_cache(row_caches[rows])
            parts.append(decode(model, cache, [prompts_P[p] for p in prompt_of[rows]],
                                params, pick, set(eos_ids), keep_caches,
                                _reporter(on_seq, rows.start), clock, compiled, shared_cores))
    return _seqs(parts, time.perf_counter() - tic)


def decode(model: nn.Module, cache: list[Any], histories: Sequence[list[int]],
           params: SamplingParams, pick: Any, eos: set[int], keep_caches: bool = False,
           on_done: Any = None, clock: Clock | None = None, compiled: bool | None = None,
           shared_cores: bool = False) -> Decoded:
    """Decode the rows of `cache` from the last token of each of `histories` (row i's
    sequence so far): speculative.py's loop where drafting is on and the caches allow it, else
    one token per step (compiled_decode.py)."""
    first = [h[-1] for h in histories]
    if params.draft_tokens > 0 and speculative.supported(cache, pick):
        return speculative.decode(model, cache, first, histories, params.max_new_tokens, pick,
                                  eos, params.draft_tokens, keep_caches, on_done, clock)
    return decode_one(model, cache, first, params.max_new_tokens, pick, eos, keep_caches,
                      on_done, clock, compiled=compiled, shared_cores=shared_cores)


def _reporter(on_seq: Callable[[int, dict], None] | None, offset: int) -> Any:
    """decode's `on_done` calling `on_seq(global index, seq)` for each ended row."""
    if on_seq is None:
        return None

    def on_done(out: Any, rows: list[int]) -> None:
        for i in rows:
            on_seq(offset + i, {"tokens": out.tokens[i], "logprobs": out.logprobs[i],
                                "finish_reason": out.finish[i]})
    return on_done


def continue_rows(model: nn.Module, caches: list[list[Any]], sequences: list[list[int]],
                  params: SamplingParams, eos_ids: Sequence[int]) -> tuple[list[dict], dict]:
    """The next answer of each conversation: `sequences[i]` is the conversation so far (prompt,
    answers, and last the new user turn), `caches[i]` (per layer) holds a prefix of it. Only
    what the cache lacks is prefilled (the new turn, and an answer's last token that was never
    fed), row by row; then every row decodes together from its last token, keeping its cache
    for a further turn."""
    pick = picker(params.temperature, params.top_p, params.top_k)
    tic = time.perf_counter()
    with decoding(model, params):
        for cache, seq in zip(caches, sequences, strict=True):
            rest = list(seq[cache[0].offset:-1])
            if rest:
                model(mx.array(rest)[None], cache=cache)
                mx.eval([c.state for c in cache])
        parts = [decode(model, merged_cache(caches[rows]), sequences[rows], params, pick,
                        set(eos_ids), keep_caches=True)
                 for rows in chunks(len(sequences), params.completion_batch_size)]
    return _seqs(parts, time.perf_counter() - tic)


def _seqs(parts: list[Any], seconds: float) -> tuple[list[dict], dict]:
    """Per-row dicts of decoded parts, and the generation stats."""
    seqs = [{"tokens": t, "logprobs": lp, "finish_reason": f, "cache": c} for d in parts
            for t, lp, f, c in zip(d.tokens, d.logprobs, d.finish, d.caches, strict=True)]
    widths = [w for d in parts for w in d.widths]
    ntok = sum(len(s["tokens"]) for s in seqs)
    stats = {
        "gen/tokens": float(ntok),
        "gen/seconds": seconds,
        "gen/tokens_per_sec": ntok / seconds if seconds > 0 else 0.0,
        "gen/decode_width": float(max(widths, default=0)),
        "gen/decode_width_mean": sum(widths) / len(widths) if widths else 0.0,
    }
    forwards = sum(d.forwards for d in parts)
    if forwards:  # drafted (speculative.py): tokens per row per forward, drafts kept
        drafted = sum(d.drafted for d in parts)
        stats["gen/tokens_per_pass"] = ntok / forwards
        stats["gen/draft_accept"] = sum(d.accepted for d in parts) / drafted if drafted else 0.0
    return seqs, stats


def sample_conversations(model: nn.Module, tokenizer: Any, tasks: Sequence[Task],
                         params: SamplingParams, group_size: int,
                         format: Callable[[Task], list[int]], max_turns: int,
                         respond: Callable[[int, list[Rollout]], list[Reply]]
                         ) -> tuple[list[Rollout], dict]:
    """Rollouts of up to `max_turns` answers each: after each answer but the last,
    `respond(turn, rollouts)` (the trainer's: the exec reward's feedback) gives every open
    conversation its next user turn or ends it; all open conversations then answer together,
    each continuing its own KV cache (only the new turn is prefilled). Returns one Rollout per
    conversation: every answer and feedback in `tokens`, feedback masked out, `turns` filled."""
    prompts_P = [format(t) for t in tasks]
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or {tokenizer.eos_token_id})
    seqs, stats = generate(model, prompts_P, group_size, params, eos, keep_caches=True)
    convs = [_Conversation(tasks[i // group_size], prompts_P[i // group_size]) for i in
             range(len(seqs))]
    open_ = list(range(len(seqs)))
    for turn in range(1, max_turns + 1):
        for i, s in zip(open_, seqs, strict=True):
            convs[i].answer(s, tokenizer, eos)
        if turn == max_turns:
            break
        replies = respond(turn, [convs[i].rollout(params.temperature) for i in open_])
        for i, reply in zip(open_, replies, strict=True):
            convs[i].reply(reply)
        open_ = [i for i in open_ if convs[i].pending is not None]
        if not open_:
            break
        seqs, more = continue_rows(model, [convs[i].cache for i in open_],
                                   [convs[i].sofar for i in open_], params, eos)
        stats = _merge_stats(stats, more)
    return [c.rollout(params.temperature) for c in convs], stats


class _Conversation:
    """One conversation as it grows: tokens after the prompt, their log-probs and mask, the
    turns, the KV cache to continue from and the feedback tokens pending."""

    def __init__(self, task: Task, prompt: list[int]) -> None:
        self.task, self.prompt = task, prompt
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.turns: list[Turn] = []
        self.finish, self.cache = "length", None
        self.pending: list[int] | None = None

    @property
    def sofar(self) -> list[int]:
        return self.prompt + self.tokens

    def answer(self, seq: dict, tokenizer: Any, eos: Sequence[int]) -> None:
        self.tokens += seq["tokens"]
        self.logprobs += seq["logprobs"]
        self.mask += [1] * len(seq["tokens"])
        self.finish, self.cache, self.pending = seq["finish_reason"], seq["cache"], None
        body = [t for t in seq["tokens"] if t not in set(eos)]
        self.turns.append(Turn(tokenizer.decode(body)))

    def reply(self, reply: Reply) -> None:
        last = self.turns[-1]
        self.turns[-1] = Turn(last.text, reply.feedback, reply.passed)
        if reply.tokens:
            self.pending = list(reply.tokens)
            self.tokens += self.pending
            self.logprobs += [0.0] * len(self.pending)
            self.mask += [0] * len(self.pending)

    def rollout(self, temperature: float) -> Rollout:
        return Rollout(self.task, tuple(self.prompt), tuple(self.tokens), tuple(self.logprobs),
                       self.turns[-1].text, self.finish, temperature, tuple(self.mask),
                       tuple(self.turns))


def _merge_stats(a: dict, b: dict) -> dict:
    tokens, seconds = a["gen/tokens"] + b["gen/tokens"], a["gen/seconds"] + b["gen/seconds"]
    return {**a, "gen/tokens": tokens, "gen/seconds": seconds,
            "gen/tokens_per_sec": tokens / seconds if seconds > 0 else 0.0}


def sample(model: nn.Module, tokenizer: Any, tasks: Sequence[Task], params: SamplingParams,
           group_size: int, format: Callable[[Task], list[int]] | None = None,
           on_group: Callable[[list[Rollout]], None] | None = None
           ) -> tuple[list[Rollout], dict]:
    """Rollouts for `tasks` (P) with `group_size` (G) completions each, prompt-major (P x G).
    `on_group(rollouts)` sees each prompt's G rollouts as soon as the last of them ends (the
    trainer scores them while the rest decode)."""
    fmt = format or prompt_formatter(tokenizer)
    prompts_P = [fmt(t) for t in tasks]
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or {tokenizer.eos_token_id})
    built: list[Rollout | None] = [None] * (len(tasks) * group_size)

    def on_seq(i: int, s: dict) -> None:
        p = i // group_size
        body = [t for t in s["tokens"] if t not in set(eos)]
        built[i] = Rollout(task=tasks[p], prompt_tokens=tuple(prompts_P[p]),
                           tokens=tuple(s["tokens"]), logprobs=tuple(s["logprobs"]),
                           text=tokenizer.decode(body), finish_reason=s["finish_reason"],
                           temperature=params.temperature)
        group = built[p * group_size:(p + 1) * group_size]
        if on_group is not None and all(r is not None for r in group):
            on_group(group)

    _, stats = generate(model, prompts_P, group_size, params, eos, on_seq=on_seq,
                        shared_cores=on_group is not None)
    return built, stats
