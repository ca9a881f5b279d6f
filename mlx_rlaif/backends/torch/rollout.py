"""Rollouts on the torch backend: the MLX rollouts' records and stats (`backends/mlx/rollout.py`)
from transformers' `generate`.

All P x G rows generate together (or `completion_batch_size` at a time), the model's own
generation defaults ignored; top-p/top-k truncate the untempered distribution before the
temperature, as mlx-lm's sampler does. The sampler's log-prob of each token is
log_softmax(raw logits / T), before any truncation.

The sampler's log-probs are kept one step at a time (`LogprobRecorder`): nothing of vocabulary
size is held beyond the current step.

Not covered: sharing a prompt's prefill across its group (each row prefills its prompt).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import transformers

from ...records import Rollout, Task
from .. import batch as batching
from ..sampling import SamplingParams, prompt_formatter
from .policy import TorchPolicy


def _processors(params: SamplingParams) -> list[Any]:
    """mlx-lm's sampler order: top-p, then top-k, on the untempered distribution; then T."""
    from transformers.generation import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list[Any] = []
    if 0 < params.top_p < 1.0:
        out.append(TopPLogitsWarper(params.top_p))
    if params.top_k > 0:
        out.append(TopKLogitsWarper(params.top_k))
    if params.temperature != 1.0:
        out.append(TemperatureLogitsWarper(params.temperature))
    return out


def _generate_rows(policy: TorchPolicy, rows: Sequence[list[int]], params: SamplingParams,
                   eos: Sequence[int]) -> list[tuple[list[int], list[float], str]]:
    """One generate call over left-padded prompt rows: (tokens, logprobs, finish) per row."""
    pad = policy.tokenizer.pad_token_id
    pad = eos[0] if pad is None else pad
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    gen = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0,
        max_new_tokens=params.max_new_tokens, min_new_tokens=0, num_return_sequences=1,
        eos_token_id=list(eos), pad_token_id=pad, return_dict_in_generate=True)
    recorder = LogprobRecorder(width, params.temperature)
    with torch.no_grad():
        out = policy.model.generate(
            input_ids=ids.to(policy.device), attention_mask=mask.to(policy.device),
            generation_config=gen,
            logits_processor=transformers.LogitsProcessorList([recorder, *_processors(params)]))
        new = out.sequences[:, width:]  # [n, S]
        lp = recorder.finish(new)
    return [_cut(toks, lps, set(eos)) for toks, lps in zip(new.tolist(), lp.tolist(),
                                                            strict=True)]


class LogprobRecorder:
    """A logits processor that keeps, for each sampled token, log_softmax(raw logits / T) at
    that token, and nothing vocabulary-sized beyond the current step: it runs first (on the
    raw logits), holds the step's log-softmax until the next call shows which token was
    sampled (the last column of `input_ids`), then keeps only that value. (transformers'
    `output_logits` would keep [rows, new tokens, vocabulary] float logits until the end.)"""

    def __init__(self, prompt_width: int, temperature: float) -> None:
        self.prompt_width, self.temperature = prompt_width, temperature
        self.pending: torch.Tensor | None = None  # [rows, V]: the last step's log-softmax
        self.kept: list[torch.Tensor] = []  # [rows] per sampled token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor
                 ) -> torch.FloatTensor:
        if input_ids.shape[1] > self.prompt_width:
            self._keep(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _keep(self, token: torch.Tensor) -> None:
        self.kept.append(self.pending.gather(1, token[:, None])[:, 0])
        self.pending = None

    def finish(self, new: torch.Tensor) -> torch.Tensor:
        """The log-probs [rows, S] of the new tokens [rows, S]."""
        if new.shape[1] > len(self.kept):
            self._keep(new[:, -1])
        return torch.stack(self.kept, dim=1) if self.kept else new.float()[:, :0]


def _cut(tokens: list[int], logprobs: list[float], eos: set[int]
         ) -> tuple[list[int], list[float], str]:
    """Up to and including the first EOS ("stop"); all of it otherwise ("length")."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], "stop"
    return tokens, logprobs, "length"


def sample(policy: TorchPolicy, tasks: Sequence[Task], params: SamplingParams, group_size: int,
           format: Callable[[Task], list[int]] | None = None, seed: int | None = None,
           on_group: Callable[[list[Rollout]], None] | None = None
           ) -> tuple[list[Rollout], dict]:
    """Rollouts for `tasks` (P) with `group_size` (G) completions each, prompt-major (P x G);
    the same records and stats keys as rollout.sample. `seed` seeds torch's generator first.
    `on_group` sees each prompt's G rollouts after the whole batch has decoded (HF's generate
    does not report rows as they end)."""
    tok = policy.tokenizer
    fmt = format or prompt_formatter(tok)
    prompts_P = [fmt(t) for t in tasks]
    eos = sorted(getattr(tok, "eos_token_ids", None) or {tok.eos_token_id})
    if seed is not None:
        torch.manual_seed(seed)
    rows = [p for p in prompts_P for _ in range(group_size)]
    policy.model.eval()
    tic, seqs, widths = time.perf_counter(), [], []
    for s in batching.chunks(len(rows), params.completion_batch_size):
        seqs += _generate_rows(policy, rows[s], params, eos)
        widths.append(s.stop - s.start)
    seconds = time.perf_counter() - tic
    ntok = sum(len(t) for t, _, _ in seqs)
    stats = {"gen/tokens": float(ntok), "gen/seconds": seconds,
             "gen/tokens_per_sec": ntok / seconds if seconds > 0 else 0.0,
             "gen/decode_width": float(max(widths, default=0)),
             "gen/decode_width_mean": float(np.mean(widths)) if widths else 0.0}
    eos_set = set(eos)
    rollouts = []
    for i, (toks, lps, finish) in enumerate(seqs):
        p = i // group_size
        rollouts.append(Rollout(
            task=tasks[p], prompt_tokens=tuple(prompts_P[p]), tokens=tuple(toks),
            logprobs=tuple(lps), text=tok.decode([t for t in toks if t not in eos_set]),
            finish_reason=finish, temperature=params.temperature))
    if on_group is not None:
        for p in range(len(tasks)):
            on_group(rollouts[p * group_size:(p + 1) * group_size])
    return rollouts, stats
