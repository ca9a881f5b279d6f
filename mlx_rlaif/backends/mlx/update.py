"""The MLX update: micro-batched gradients of the RL loss, clipping, AdamW, the reference pass.

`update(policy, optimizer, rollouts, adv, ref, cfg, kl_penalty)` takes `num_iterations` optimizer
steps on one rollout batch and returns its metrics and how many steps it skipped.
Gradients of micro-batches are summed; the aggregation weights (batch.py) make the sum equal the
whole-batch gradient. A non-finite loss or gradient norm skips the step and is counted. The
reference log-probs come from the same weights with the LoRA layers bypassed.

The forward + backward of a micro-batch and the optimizer step run under `mx.compile`, with the
model's arrays and MLX's random state as the traced function's implicit inputs and outputs (how
mlx-lm's trainer compiles its step): MLX fuses their element-wise chains. A trace is made per
batch shape and kept in `traced` (a dict the caller holds for the run: `backends.ops.mlx_ops`),
with the number of traces per function (`traced["counts"]`; `compile/traces` in the metrics:
those this update made); the KL penalty, which the adaptive controller changes, is an input,
not a traced constant. Shapes are few: the micro-batches are of equal size (within a row),
padded with zero-weight rows to a bucket, their lengths rounded to buckets (batch.py).
Micro-batches whose logits exceed the budget's compile limit (`memory.compile_max_logits_mb`)
run eagerly. The reference pass is not compiled; on the CPU (the `cpu` gate) it spreads over
two streams (`reference_logprobs`).

The loss runs the transformer once per micro-batch (loss.rl_loss: the head's log-probs a chunk
at a time inside the gradient, their gradient taken in the forward pass, or with an entropy
bonus each chunk's logits recomputed in the backward pass). Both the
update and the reference pass run under an MLX memory limit of what is held plus the phase's
predicted bytes (`memory.limited`): MLX evaluates ahead of the computation and would otherwise
allocate a micro-batch's chunks all at once. Gradient checkpointing per block
(`training.grad_checkpoint: on`, checkpointing.py) wraps the update.

Not covered: mixed precision beyond what the model's dtype gives.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map, tree_unflatten

from ... import cpu
from ...algo import correction
from ...algo.aggregation import aggregation_weights, loss_aggregation
from ...artifacts import checkpoint
from ...artifacts.lora import adapter_weights
from ...config import Config, batch_sequences, micro_batch_size
from ...cpu.blas import blas_threads, openblas_thread_fns
from ...records import Rollout
from .. import batch as batching
from ..parallel import Shard
from . import memory, shared_prompt
from .checkpointing import checkpointed_blocks
from .loss import Split, micro_batch_stats, rl_loss
from .policy import Policy, adapters_loaded, lora_disabled


def update(policy: Policy, optimizer: optim.Optimizer, rollouts: list[Rollout], adv: Any,
           ref: list[np.ndarray] | None, cfg: Config, kl_penalty: float,
           traced: dict[str, Any] | None = None,
           critic: dict[str, list[np.ndarray]] | None = None,
           shard: Shard | None = None) -> tuple[dict[str, float], int]:
    """`num_iterations` optimizer updates on the kept rollouts, micro-batched: (metrics, the
    number of updates skipped for a non-finite loss or gradient). `adv`: one advantage per
    rollout, or (with a critic) one array per rollout, per token. `critic`: per-token `returns`
    and `old_values` for the value loss. `traced` keeps the compiled gradient function between
    calls (a fresh one is traced when it is None). `shard`: this rank's part of a data-parallel
    step (backends/parallel.py): global loss divisor, gradients and aux sums summed over the
    ranks after the micro-batch accumulation, before clipping and the optimizer step."""
    if (shard.sequences if shard is not None else len(rollouts)) == 0:
        return {"train/tokens": 0.0}, 0
    lengths = [r.trained_tokens for r in rollouts]
    w = aggregation_weights(lengths, loss_aggregation(cfg.rl), cfg.generation.max_new_tokens,
                            batch_sequences(cfg), *((shard.tokens, shard.sequences) if shard
                                                    else ()))
    batches = micro_batches(policy.model, rollouts, cfg)
    rows_to = padded_rows(batches, cfg)
    mbs = [build(rollouts, rows, adv, w, ref, shared, critic, rows_to) for rows, shared in batches]
    traced = {} if traced is None else traced
    model = policy.model
    grad = kept(traced, "grad", model, lambda: grad_fn(model, cfg, policy.split,
                                                       traced.setdefault("counts", {})))
    penalty = mx.array(kl_penalty, dtype=mx.float32)
    tic, first, aux, skipped = time.perf_counter(), None, {}, 0
    before = sum(traced.get("counts", {}).values())
    ck = cfg.training.grad_checkpoint == "on"
    limit = phase_limit(model, rollouts, cfg, rows_to, "update", traced)
    model.train(cfg.lora.dropout > 0)  # dropout (if any) only inside the update
    with checkpointed_blocks(model, ck), memory.limited(limit):
        for _ in range(cfg.rl.num_iterations):
            grads, aux = None, {}
            for mb in mbs:
                (_, a), g = grad(mb, penalty)
                keep_recomputed(mb, a)
                grads = g if grads is None else tree_map(mx.add, grads, g)
                aux = a if not aux else correction.accumulate(aux, a, mx)
                mx.eval(grads, aux, mb.get(correction.TRAINER_LOGP, []))  # nothing kept lazy
            if shard is not None:
                grads, aux = reduce_over_ranks(model, grads, aux, shard)
            first = first or aux
            norm, stepped = apply_update(model, optimizer, grads, aux["loss"],
                                         cfg.training.max_grad_norm, traced)
            skipped += not stepped
    model.train(False)
    seconds = time.perf_counter() - tic
    tokens = sum(lengths) * cfg.rl.num_iterations
    traces = sum(traced.get("counts", {}).values()) - before
    return {**update_metrics(aux, first, norm, optimizer, tokens, seconds),
            "compile/traces": float(traces)}, skipped


def keep_recomputed(mb: dict[str, mx.array], aux: dict[str, mx.array]) -> None:
    """rl.is_correction: the first iteration's log-probs (at the weights that sampled, detached)
    move from the loss's aux into the micro-batch, the old policy of the later iterations."""
    if correction.TRAINER_LOGP in aux:
        mb[correction.TRAINER_LOGP] = aux.pop(correction.TRAINER_LOGP)


def reduce_over_ranks(model: nn.Module, grads: Any, aux: dict[str, mx.array], shard: Shard
                      ) -> tuple[Any, dict[str, mx.array]]:
    """This rank's accumulated gradient and aux sums, summed over the ranks (a rank without
    rollouts brings zeros, so its collective calls match the others'); `*_max` entries stay
    this rank's (train/distributed_metrics.py takes their maximum)."""
    if grads is None:
        grads = tree_map(mx.zeros_like, model.trainable_parameters())
    total = shard.sum({k: v.item() for k, v in aux.items() if not k.endswith("_max")})
    total.update({k: v.item() for k, v in aux.items() if k.endswith("_max")})
    return shard.reduce_grads(grads), {k: mx.array(v, dtype=mx.float32) for k, v in total.items()}


def grad_fn(model: nn.Module, cfg: Config, split: Split | None = None,
            counts: dict[str, int] | None = None) -> Callable[..., Any]:
    """`(mb, kl_penalty) -> ((loss, aux), grads)` of `rl_loss` for the model's trainable arrays,
    in one pass of the transformer, the head's logits in chunks sized to the budget
    (`memory.logits_chunk_mb`); compiled where the micro-batch's logits are within the budget's
    compile limit (`compiles`), its traces counted in `counts["grad"]`."""
    budget = budget_of(cfg)
    loss = partial(rl_loss, rl=cfg.rl, temperature=cfg.generation.temperature, split=split,
                   limit_mb=memory.logits_chunk_mb(budget))
    value_and_grad = nn.value_and_grad(model, loss)
    return small_compiled(lambda mb, kl_penalty: value_and_grad(model, mb, kl_penalty=kl_penalty),
                          model, budget, counted(counts, "grad"))


def budget_of(cfg: Config) -> int:
    """The run's memory budget in bytes (the plan writes it into training.max_memory_gb; 0 where
    no plan was made: the defaults of memory.py's sizes)."""
    return int(cfg.training.max_memory_gb * memory.GiB)


def compiles(model: nn.Module, mb: dict[str, mx.array], budget: int = 0) -> bool:
    """Whether the update of `mb` runs compiled: its logits (rows x positions x vocabulary,
    float32) within `memory.compile_max_logits_mb(budget)`, the vocabulary known."""
    vocab = getattr(getattr(model, "args", None), "vocab_size", None)
    n, width = mb["tokens"].shape
    return vocab is not None and \
        n * (width - 1) * vocab * 4 <= memory.compile_max_logits_mb(budget) * 2**20


def small_compiled(fn: Callable[..., Any], model: nn.Module, budget: int = 0,
                   count: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda f: f
                   ) -> Callable[..., Any]:
    """`fn(mb, ...)`, compiled (`count(fn)` traced) where `compiles(model, mb, budget)`, else run
    as it is."""
    traced = compiled(count(fn), model)
    return lambda mb, *args: (traced if compiles(model, mb, budget) else fn)(mb, *args)


def counted(counts: dict[str, int] | None, name: str
            ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A wrapper adding 1 to `counts[name]` each time the function runs in Python: under
    `mx.compile`, once per trace (None: no count)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if counts is None:
            return fn

        def traced(*args: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return fn(*args)
        return traced
    return wrap


def optimizer_step(model: nn.Module, optimizer: optim.Optimizer,
                   counts: dict[str, int] | None = None) -> Callable[[Any], None]:
    """`grads -> None`: the optimizer's update of the model, compiled (its state an implicit
    input and output too)."""
    return compiled(counted(counts, "optimizer")(lambda grads: optimizer.update(model, grads)),
                    model, optimizer.state)


def compiled(fn: Callable[..., Any], model: nn.Module, *more: Any) -> Callable[..., Any]:
    """`fn` under `mx.compile`, reading and writing back the model's arrays, MLX's random
    state (dropout) and `more` state trees as implicit inputs and outputs."""
    state = [model.state, mx.random.state, *more]
    return mx.compile(fn, inputs=state, outputs=state)


def kept(traced: dict[str, Any], name: str, owner: Any, make: Callable[[], Any]) -> Any:
    """`traced[name]`, made by `make()` the first time and again when `owner` (the object it
    traces, by identity) has changed."""
    if traced.get(name, (None,))[0] is not owner:
        traced[name] = (owner, make())
    return traced[name][1]


def apply_update(model: nn.Module, optimizer: optim.Optimizer, grads: Any, loss: mx.array,
                 max_norm: float, traced: dict[str, Any] | None = None) -> tuple[float, bool]:
    """Clip the gradient norm to `max_norm` (0: no clipping), check finiteness, step the
    optimizer (compiled, kept in `traced`). Returns (the norm before clipping, stepped?): a
    non-finite loss or gradient is not applied."""
    grads, norm = optim.clip_grad_norm(grads, max_norm if max_norm > 0 else math.inf)
    norm_v, loss_v = norm.item(), loss.item()
    if not (math.isfinite(norm_v) and math.isfinite(loss_v)):
        return norm_v, False
    traced = {} if traced is None else traced
    step = kept(traced, "optimizer", optimizer.state,  # a restore replaces the state's dict
                lambda: optimizer_step(model, optimizer, traced.setdefault("counts", {})))
    step(grads)
    mx.eval(model.trainable_parameters(), optimizer.state)
    return norm_v, True


def reference_logprobs(model: nn.Module, rollouts: list[Rollout], cfg: Config,
                       split: Split | None = None,
                       adapters: dict[str, mx.array] | None = None) -> list[np.ndarray]:
    """Log-probs of each completion under the reference: the frozen base (same weights, LoRA
    layers bypassed), or with `adapters` the base plus those adapters (a moving reference)."""
    held = adapters_loaded(model, adapters) if adapters is not None else lora_disabled(model)
    with held:
        return policy_logprobs(model, rollouts, cfg, split)


def policy_logprobs(model: nn.Module, rollouts: list[Rollout], cfg: Config,
                    split: Split | None = None) -> list[np.ndarray]:
    """Log-probs of each completion under `model` as it is (the live policy: adapters on), at
    the sampling temperature."""
    T = cfg.generation.temperature
    limit = memory.logits_chunk_mb(budget_of(cfg))
    return token_pass(model, rollouts, cfg,
                      lambda b: micro_batch_stats(model, split, b, T, limit)[0])


def values_of(model: nn.Module, rollouts: list[Rollout], cfg: Config, split: Split
              ) -> list[np.ndarray]:
    """The critic's value of the state before each completion token, adapters on."""
    return token_pass(model, rollouts, cfg,
                      lambda b: model.value_head(shared_prompt.batch_logits(split.body, b)))


def token_pass(model: nn.Module, rollouts: list[Rollout], cfg: Config,
               compute: Callable[[dict[str, mx.array]], mx.array]) -> list[np.ndarray]:
    """`compute(micro-batch) -> [N, W]` over the rollouts without gradients, each rollout's
    completion positions cut out.

    On MLX's CPU backend with OpenBLAS and 2+ cores, a whole-batch pass (micro_batch_size 0) is
    split into two halves along prompt groups, each on its own CPU stream with one OpenBLAS
    thread: the element-wise work, single-threaded on a stream, then runs on both cores (9-16%
    faster on the tiny model: BENCHMARKS.md). Not compiled: a trace keeps the stream it was made
    on (and compiling it gained nothing measurable)."""
    out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rollouts)
    zeros = [0.0] * len(rollouts)
    batches = micro_batches(model, rollouts, cfg)
    streams = reference_streams(cfg, len(rollouts))
    if len(streams) > 1 and len(batches) == 1:
        batches = halves(rollouts, batches[0])
    rows_to = padded_rows(batches, cfg)
    limit = phase_limit(model, rollouts, cfg, rows_to, "reference", streams=len(streams))
    waves = [batches[i: i + len(streams)] for i in range(0, len(batches), len(streams))]
    with blas_threads(1) if len(streams) > 1 else nullcontext(), memory.limited(limit):
        for wave in waves:  # one micro-batch per stream at a time
            built = [build(rollouts, rows, zeros, zeros, None, shared, None, rows_to)
                     for rows, shared in wave]
            results = []
            for b, stream in zip(built, streams, strict=False):
                with mx.stream(stream):
                    results.append(compute(b))
            mx.eval(results)
            for (rows, _), b, arr in zip(wave, built, map(np.array, results), strict=True):
                for i, j in enumerate(rows):
                    r = rollouts[j]
                    start = 0 if "prefix" in b else len(r.prompt_tokens) - 1
                    out[j] = arr[i, start: start + len(r.tokens)]
    return out


def reference_streams(cfg: Config, rows: int) -> list[Any]:
    """The streams the reference pass spreads over: two CPU streams where the CPU gate is on
    (`cpu.active()`) with OpenBLAS's thread control, 2+ cores, 2+ rows and micro_batch_size 0
    (else the memory of two micro-batches at once could exceed the one the user set), else the
    default stream."""
    if (micro_batch_size(cfg) or rows < 2 or (os.cpu_count() or 1) < 2
            or not cpu.active() or openblas_thread_fns() is None):
        return [mx.default_stream(mx.default_device())]
    return _cpu_streams()


@functools.cache
def _cpu_streams() -> list[Any]:
    return [mx.default_stream(mx.cpu), mx.new_stream(mx.cpu)]


def halves(rollouts: list[Rollout], batch: tuple[list[int], bool]) -> list[tuple[list[int], bool]]:
    """A micro-batch split in two, at the prompt-group boundary nearest its middle (rows)."""
    rows, shared = batch
    groups = batching.prompt_groups([rollouts[i] for i in rows])
    cut, best = 0, len(rows)
    for k in range(1, len(groups)):
        left = sum(len(g) for g in groups[:k])
        if abs(2 * left - len(rows)) < best:
            cut, best = left, abs(2 * left - len(rows))
    cut = cut or len(rows) // 2  # one group: its rows in two (its prompt computed twice)
    return [(rows[:cut], shared), (rows[cut:], shared)]


def micro_batches(model: nn.Module, rollouts: list[Rollout], cfg: Config
                  ) -> list[tuple[list[int], bool]]:
    """(row indices, prompts shared?) of each micro-batch: as few as the size allows, of equal
    sizes (within one row). Shared (training.share_prompt and a model that supports it): rows
    ordered by prompt, so a group splits over as few micro-batches as the size allows; else
    consecutive rows."""
    size = micro_batch_size(cfg)
    share = cfg.training.share_prompt and shared_prompt.supported(model)
    order = [i for g in batching.prompt_groups(rollouts) for i in g] if share \
        else list(range(len(rollouts)))
    return [(order[s], share) for s in batching.even_chunks(len(order), size)]


def phase_limit(model: nn.Module, rollouts: list[Rollout], cfg: Config, rows: int, phase: str,
                traced: dict[str, Any] | None = None, streams: int = 1) -> int | None:
    """MLX's memory limit for the update or the reference pass over these rollouts
    (memory.phase_limit: what is held now plus the phase's predicted bytes, within the budget);
    the model's shapes kept in `traced`. None (no limit) for a rank with nothing to train on
    (an uneven data-parallel split), which still joins the ranks' sums."""
    if not rollouts:
        return None
    cache = {} if traced is None else traced
    shape = kept(cache, "shape", model, lambda: memory.shape_of(model))
    prompts = batching.prompt_groups(rollouts)
    work = memory.Work(len(prompts), max(len(g) for g in prompts),
                       max(len(r.prompt_tokens) for r in rollouts),
                       max(len(r.tokens) for r in rollouts), rows,
                       entropy_grad=cfg.rl.entropy_coef != 0,
                       shared=cfg.training.share_prompt and shared_prompt.supported(model))
    return memory.phase_limit(shape, work, rows, cfg.training.grad_checkpoint == "on", phase,
                              mx.get_active_memory(), budget_of(cfg), streams)


def padded_rows(batches: list[tuple[list[int], bool]], cfg: Config) -> int:
    """The rows every micro-batch is padded to: its largest, rounded up to a bucket
    (`batch.bucket`), not over the planned micro-batch size (or the step's sequences)."""
    largest = max((len(rows) for rows, _ in batches), default=1)
    cap = max(micro_batch_size(cfg) or batch_sequences(cfg), largest)
    return min(batching.bucket(largest), cap)


def build(rollouts: list[Rollout], rows: list[int], adv: Any, w: list[float],
          ref: list[np.ndarray] | None, shared: bool,
          fields: dict[str, list[np.ndarray]] | None = None, rows_to: int | None = None
          ) -> dict[str, mx.array]:
    """The arrays of one micro-batch, in `build_shared`'s layout when its prompts are shared,
    its shapes rounded to buckets (`batch.bucket_length`) and its rows padded to `rows_to`
    with zero-weight rows: few shapes, few traces of the compiled update."""
    args = ([rollouts[i] for i in rows], [adv[i] for i in rows], [w[i] for i in rows],
            [ref[i] for i in rows] if ref is not None else None)
    extra = {k: [v[i] for i in rows] for k, v in (fields or {}).items()}
    layout = batching.build_shared if shared else batching.build
    arrays = layout(*args, fields=extra, bucketed=True, rows_to=rows_to)
    return {k: mx.array(v) for k, v in arrays.items()}


def update_metrics(aux: dict, first: dict, norm: float, optimizer: optim.Optimizer, tokens: int,
                   seconds: float) -> dict[str, float]:
    n = max(aux["tokens"].item(), 1.0)
    m = {
        "loss/total": aux["loss"].item(), "loss/policy": aux["pg"].item(),
        "policy/entropy": aux["entropy"].item() / n, "policy/clipfrac": aux["clipped"].item() / n,
        "policy/ratio_mean": aux["ratio"].item() / n, "policy/approx_kl": aux["approx_kl"].item() / n,
        "kl/sample_train": first["approx_kl"].item() / max(first["tokens"].item(), 1.0),
        "optim/grad_norm": norm, "optim/lr": float(optimizer.learning_rate.item()),
        "train/tokens": float(tokens), "train/tokens_per_sec": tokens / max(seconds, 1e-9),
    }
    m.update(correction.metrics({k: v.item() for k, v in first.items()}))
    if "kl" in aux:
        m["kl/mean"] = aux["kl"].item() / n
        m["loss/kl"] = aux["kl_loss"].item()
    if "value_loss" in aux:
        m["loss/value"] = aux["value_loss"].item()
        m["critic/value_mean"] = aux["value"].item() / n
    return m


def make_optimizer(t: Any, total_updates: int) -> optim.Optimizer:
    """AdamW on the training section `t`'s schedule: linear warmup from lr * 1e-3, then constant
    or cosine decay to lr * min_lr_ratio at `total_updates`."""
    lr: Any = t.learning_rate
    if t.lr_schedule == "cosine":
        decay = max(total_updates - t.warmup_steps, 1)
        lr = optim.cosine_decay(t.learning_rate, decay, t.learning_rate * t.min_lr_ratio)
    if t.warmup_steps:
        warm = optim.linear_schedule(t.learning_rate * 1e-3, t.learning_rate, t.warmup_steps)
        after = lr if callable(lr) else (lambda _: mx.array(t.learning_rate))
        lr = optim.join_schedules([warm, after], [t.warmup_steps])
    return optim.AdamW(learning_rate=lr, weight_decay=t.weight_decay)


def advance_reference(policy: Policy, cfg: Config, step: int) -> None:
    """After the optimizer step that made `step` steps: move a moving reference toward the
    adapters (ema: ref = d ref + (1 - d) adapters), or copy them every ref_update_every steps
    (periodic). No-op for the frozen base and the frozen initial adapters (initial)."""
    if policy.reference is None or cfg.rl.reference == "initial":
        return
    current = adapter_weights(policy.model)
    if cfg.rl.reference == "ema":
        d = cfg.rl.ref_ema_decay
        policy.reference = {k: d * policy.reference[k] + (1 - d) * v for k, v in current.items()}
    elif step % cfg.rl.ref_update_every == 0:
        policy.reference = dict(current)
    mx.eval(policy.reference)


def restore(policy: Policy, optimizer: optim.Optimizer, ckpt: Path) -> checkpoint.LoopState:
    """Adapters, a critic's value head and a reference copy of adapters (where the run has
    them: ema, periodic, initial), the optimizer's state and the loop state of a checkpoint."""
    checkpoint.load_weights_into(policy.model, ckpt)
    head = checkpoint.load_arrays(ckpt, checkpoint.VALUE_HEAD)
    if head is not None and "value_head" in policy.model:
        policy.model.update(tree_unflatten(list(head.items())))
        policy.model.value_head.fresh = False
    reference = checkpoint.load_arrays(ckpt, checkpoint.REFERENCE)
    if reference is not None and policy.reference is not None:
        policy.reference = reference
    optimizer.init(policy.model.trainable_parameters())
    checkpoint.load_optimizer_into(optimizer, ckpt)
    mx.eval(policy.model.parameters(), optimizer.state)
    return checkpoint.load_state(ckpt)
