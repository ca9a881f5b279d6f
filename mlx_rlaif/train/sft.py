"""Supervised LoRA fine-tuning on prompt/completion pairs: the warm start before RL.

Records are JSONL objects with a prompt and a completion: `{"prompt", "completion"}`, or the
records an RL run collects in `datasets/train.jsonl` (`prompt` + `teacher_code`), or task
records with a reference `solution` (a task file or `suite:NAME`, `sft.completion_key: solution`:
the answer written as RL asks for it, guidance.reference_answer). The prompt is
formatted exactly as RL formats it (`backends.sampling.format_prompt`: chat template, system
prompt), the
completion follows it and ends with the EOS token the sampler stops at, and the loss is the
token-mean cross-entropy over completion tokens only. Batches come from mlx-lm's
`iterate_batches` (padded to a multiple of 32, grouped by length, shuffled per epoch from the
seed); the loss is mlx-lm's `default_loss` with its upper mask bound fixed: mlx-lm 0.32 counts one
padding target per row (`steps <= length`, mlx-lm PR #1697), training every row to predict token
0 after its EOS. The policy is `backends.mlx.policy.load_policy`, so the
checkpoints are the RL trainer's (`adapters.safetensors`, `adapter_config.json` with
`base_model`, `state.json`, `optimizer.safetensors`) and `mlx-rlaif train --set
lora.init_adapter=RUN_DIR` starts RL from them.

Not covered: multi-turn conversations, packing several examples into one sequence, resuming an
interrupted SFT run, full fine-tuning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import yaml
from mlx.utils import tree_map

from ..artifacts import checkpoint
from ..backends.batch import chunks
from ..backends.mlx.policy import adapter_config_for, load_policy
from ..backends.mlx.update import apply_update, make_optimizer
from ..backends.sampling import format_prompt
from ..config import (
    LoraConfig,
    ModelConfig,
    TrainingConfig,
    build_section,
    opt,
    read_raw,
    smoke_caps,
    to_dict,
)
from ..config.loading import check_length
from ..cpu.kernels import training_fast_paths
from ..data import read_jsonl
from ..data.suites import load_suite
from ..errors import ConfigError, DataError
from ..metrics.jsonl import JsonlWriter
from ..records import Task
from .guidance import reference_answer
from .laptop import keep_awake, release
from .length import RunLength, run_length
from .run import due_checkpoint

# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SFTConfig:
    train_file: str = opt("", "Prompt/completion JSONL to train on (required), e.g. an RL run's "
                          "datasets/train.jsonl, or a shipped suite (suite:synthetic-train) "
                          "with completion_key solution.")
    valid_file: str = opt("", "Held-out JSONL of the same form: its loss is logged after each "
                          "epoch (optional).")
    prompt_key: str = opt("prompt", "Field holding the prompt (the user message).")
    completion_key: str = opt("", "Field holding the target text; empty: `completion`, else "
                              "`teacher_code` (the teacher's reference code collected during RL). "
                              "`solution`: a task record's reference solution written as RL asks "
                              "for answers (the body under a Python stub, else fenced; as "
                              "rl.guidance writes it), so the RL task file is the SFT data. "
                              "Records without one are skipped and counted.")
    fence_code: bool = opt(False, "Wrap each completion in a ```language fence (for bare code such "
                           "as teacher_code, when the RL prompts ask for fenced answers).")
    max_seq_length: int = opt(2048, "Longest prompt + completion in tokens; longer ones are cut "
                              "(examples whose prompt alone is this long are skipped).",
                              lambda v: v > 1)


@dataclass(frozen=True)
class SFTRunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    training: TrainingConfig = field(default_factory=lambda: TrainingConfig(output_dir="runs/sft"))
    sft: SFTConfig = field(default_factory=SFTConfig)


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
                ) -> SFTRunConfig:
    """Strictly load an SFT config (sections model, lora, training, sft) and `a.b=c` overrides."""
    raw = read_raw(path, overrides)
    smoke_caps(raw, rl=False)
    training = raw.setdefault("training", {})
    if isinstance(training, dict):
        training.setdefault("output_dir", "runs/sft")
    cfg = build_section(SFTRunConfig, raw, "")
    check_length(cfg.training)
    if not cfg.sft.train_file:
        raise ConfigError("sft.train_file is empty: set it to a prompt/completion JSONL file")
    return cfg


def dump(cfg: SFTRunConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# --- data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str
    language: str = "python"


def read_examples(path: str | Path, sft: SFTConfig) -> tuple[list[Example], int]:
    """(examples, number of records skipped for lacking a completion)."""
    examples, skipped = [], 0
    for where, rec in records(path):
        prompt = rec.get(sft.prompt_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: missing or empty {sft.prompt_key!r} (a string): set "
                            "sft.prompt_key to the field holding the prompt")
        completion = _completion(rec, sft.completion_key, where)
        if completion is None:
            skipped += 1
            continue
        lang = str(rec.get("language") or "python")
        if sft.fence_code:
            completion = f"```{lang}\n{completion.strip(chr(10))}\n```"
        examples.append(Example(prompt, completion, lang))
    return examples, skipped


def records(path: str | Path) -> list[tuple[str, dict]]:
    """(where, record) of a JSONL file, or of a shipped suite (`suite:NAME`)."""
    name = str(path)
    if name.startswith("suite:"):
        return [(f"{name}:{i + 1}", r) for i, r in enumerate(load_suite(name[len("suite:"):]))]
    return read_jsonl(path)


def _completion(rec: dict, key: str, where: str) -> str | None:
    if key == "solution":  # a task record: its reference answer as RL asks for it
        task = Task(str(rec.get("id", where)), rec["prompt"], str(rec.get("language") or
                    "python"), meta={"solution": rec.get("solution")})
        return reference_answer(task)
    keys = [key] if key else ["completion", "teacher_code"]
    for k in keys:
        value = rec.get(k)
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: {k!r} must be a string, got {type(value).__name__}")
        if value and value.strip():
            return value
    return None


def tokenize(examples: list[Example], tokenizer: Any, model_cfg: ModelConfig,
             max_seq_length: int) -> tuple[list[tuple[list[int], int]], int]:
    """(tokens, prompt length) per example, as mlx-lm's iterate_batches expects; and the number
    dropped because the prompt alone fills max_seq_length."""
    eos = tokenizer.eos_token_id
    out, dropped = [], 0
    for i, ex in enumerate(examples):
        task = Task(id=str(i), prompt=ex.prompt, language=ex.language)
        prompt = format_prompt(tokenizer, task, model_cfg.chat_template, model_cfg.system_prompt)
        if len(prompt) >= max_seq_length:
            dropped += 1
            continue
        completion = list(tokenizer.encode(ex.completion, add_special_tokens=False))
        out.append((prompt + completion + [eos], len(prompt)))
    return out, dropped


def batches(data: list[tuple[list[int], int]], batch_size: int, max_seq_length: int,
            seed: int) -> Iterator[tuple[mx.array, mx.array]]:
    """One epoch of (tokens [B, T], lengths [B, 2] = (prompt length, length)) from mlx-lm."""
    from mlx_lm.tuner.trainer import iterate_batches

    yield from iterate_batches(data, batch_size, max_seq_length, loop=False, seed=seed)


# --- training ---------------------------------------------------------------------------------


def completion_loss(model: nn.Module, tokens: mx.array, lengths: mx.array
                    ) -> tuple[mx.array, mx.array]:
    """(token-mean cross-entropy over completion tokens, their number).

    tokens: [B, T] right-padded rows; lengths: [B, 2] = (prompt length, real length).
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # targets[:, j] is row token j + 1
    logits = model(inputs)  # [B, T-1, V]
    pos = mx.arange(1, targets.shape[1] + 1)  # [T-1] position of each target in its row
    mask = mx.logical_and(pos >= lengths[:, 0:1], pos < lengths[:, 1:])  # [B, T-1]
    ce = nn.losses.cross_entropy(logits, targets) * mask
    ntoks = mask.sum()
    return ce.astype(mx.float32).sum() / ntoks, ntoks


def loss_and_grads(model: nn.Module, tokens: mx.array, lengths: mx.array, micro: int
                   ) -> tuple[mx.array, mx.array, Any]:
    """Token-mean completion loss over the whole batch and its gradient, accumulated over
    micro-batches of `micro` rows (0: all at once) with each weighted by its token count."""
    value_and_grad = nn.value_and_grad(model, completion_loss)
    total, ntoks, grads = mx.array(0.0), mx.array(0), None
    for s in chunks(tokens.shape[0], micro):
        (loss, n), g = value_and_grad(model, tokens[s], lengths[s])
        g = tree_map(lambda x, n=n: x * n, g)
        grads = g if grads is None else tree_map(mx.add, grads, g)
        total, ntoks = total + loss * n, ntoks + n
        mx.eval(grads, total, ntoks)
    grads = tree_map(lambda x: x / ntoks, grads)
    return total / ntoks, ntoks, grads


def sft_step(model: nn.Module, optimizer: optim.Optimizer, tokens: mx.array, lengths: mx.array,
             training: TrainingConfig, traced: dict[str, Any] | None = None) -> dict[str, float]:
    """One optimizer update, through the RL update's clip-and-skip (`apply_update`): a
    non-finite loss or gradient is skipped (reported as skipped=1)."""
    loss, ntoks, grads = loss_and_grads(model, tokens, lengths, training.micro_batch_size)
    norm, ok = apply_update(model, optimizer, grads, loss, training.max_grad_norm, traced)
    return {"loss/sft": loss.item(), "optim/grad_norm": norm, "sft/tokens": float(ntoks.item()),
            "optim/skipped": float(not ok)}


def validation_loss(model: nn.Module, data: list[tuple[list[int], int]], batch_size: int,
                    max_seq_length: int) -> float:
    """mlx-lm's evaluate: token-mean completion loss over every full batch of `data`."""
    from mlx_lm.tuner.trainer import evaluate

    loss = evaluate(model, data, min(batch_size, len(data)), -1, max_seq_length,
                    loss=completion_loss)
    model.train(False)
    return loss


@dataclass
class SFTRun:
    cfg: SFTRunConfig
    policy: Any
    optimizer: optim.Optimizer
    run_dir: Path
    state: checkpoint.LoopState = field(default_factory=checkpoint.LoopState)
    traced: dict[str, Any] = field(default_factory=dict)  # the compiled optimizer step


def prepare(cfg: SFTRunConfig) -> tuple[list[Example], list[Example], int]:
    """Checks that can fail on user input, before any model loads: (train, valid, skipped)."""
    run_dir = Path(cfg.training.output_dir)
    if checkpoint.list_checkpoints(run_dir):
        raise ConfigError(f"output dir {run_dir} already holds a run: choose another "
                          "training.output_dir")
    train, skipped = read_examples(cfg.sft.train_file, cfg.sft)
    valid = read_examples(cfg.sft.valid_file, cfg.sft)[0] if cfg.sft.valid_file else []
    if len(train) < cfg.training.batch_size:
        raise DataError(f"{cfg.sft.train_file}: {len(train)} usable examples, fewer than "
                        f"training.batch_size = {cfg.training.batch_size}: lower the batch size "
                        "or add data")
    return train, valid, skipped


def length_of(cfg: SFTRunConfig, n_examples: int) -> RunLength:
    """The run's length (train/length.py; None steps: training.max_minutes alone ends it)."""
    b = cfg.training.batch_size
    return run_length(cfg.training, n_examples // b, f"the {n_examples} examples at {b} a step")


def sft(cfg: SFTRunConfig, progress: Any = None, log: Any = print) -> Path:
    """Run supervised fine-tuning; returns the run directory (its checkpoints feed
    `lora.init_adapter`). `progress(step, total, metrics)` is called after each step."""
    train_ex, valid_ex, skipped = prepare(cfg)
    t = cfg.training
    policy = load_policy(cfg.model.path, cfg.lora, None, t.seed, cfg.model.trust_remote_code)
    data, dropped = tokenize(train_ex, policy.tokenizer, cfg.model, cfg.sft.max_seq_length)
    valid = tokenize(valid_ex, policy.tokenizer, cfg.model, cfg.sft.max_seq_length)[0]
    if skipped or dropped:
        log(f"sft: {skipped} records without a completion skipped, {dropped} with a prompt of "
            f">= {cfg.sft.max_seq_length} tokens dropped")
    if len(data) < t.batch_size:
        raise DataError(f"{cfg.sft.train_file}: {len(data)} examples fit sft.max_seq_length, "
                        f"fewer than training.batch_size = {t.batch_size}")
    length = length_of(cfg, len(data))
    log(f"sft: {length.line}")
    steps = length.steps
    run = SFTRun(cfg, policy, make_optimizer(t, steps or 0), Path(t.output_dir))
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.yaml").write_text(dump(cfg))
    metrics_out = JsonlWriter(run.run_dir / "batches.jsonl", append=False)
    awake = keep_awake(t.prevent_sleep, log)  # macOS: caffeinate (laptop.py)
    try:
        with training_fast_paths(policy.model):
            _loop(run, data, valid, steps, metrics_out, progress, log)
    finally:
        release(awake)
        metrics_out.close()
    return run.run_dir


def _loop(run: SFTRun, data: list, valid: list, steps: int | None, out: Any, progress: Any,
          log: Any) -> None:
    t = run.cfg.training
    model = run.policy.model
    model.train(run.cfg.lora.dropout > 0)
    per_epoch = len(data) // t.batch_size
    deadline = time.monotonic() + 60 * t.max_minutes if t.max_minutes else math.inf
    end = math.inf if steps is None else steps
    while run.state.step < end and time.monotonic() < deadline:
        epoch = run.state.epoch
        for b, (tokens, lengths) in enumerate(batches(data, t.batch_size,
                                                      run.cfg.sft.max_seq_length,
                                                      t.seed + epoch), 1):
            tic = time.perf_counter()
            metrics = sft_step(model, run.optimizer, tokens, lengths, t, run.traced)
            seconds = time.perf_counter() - tic
            run.state = replace(run.state, step=run.state.step + 1, cursor=b * t.batch_size)
            metrics.update({"step": run.state.step, "epoch": float(epoch + 1), "batch": float(b),
                            "optim/lr": float(run.optimizer.learning_rate.item()),
                            "time/step": seconds,
                            "sft/tokens_per_sec": metrics["sft/tokens"] / max(seconds, 1e-9)})
            out.write(metrics)
            if progress is not None:
                progress(run.state.step, steps, metrics)
            epoch_end = b == per_epoch
            if epoch_end:
                run.state = replace(run.state, epoch=epoch + 1, cursor=0)
                _end_epoch(run, valid, out, log)
            over = time.monotonic() >= deadline  # the time budget: this step is the last
            _maybe_save(run, epoch + 1, b, epoch_end, run.state.step if over else end)
            if run.state.step >= end or over:
                break
    model.train(False)


def _end_epoch(run: SFTRun, valid: list, out: Any, log: Any) -> None:
    if not valid:
        return
    t = run.cfg.training
    loss = validation_loss(run.policy.model, valid, t.batch_size, run.cfg.sft.max_seq_length)
    run.policy.model.train(run.cfg.lora.dropout > 0)
    out.write({"step": run.state.step, "epoch": float(run.state.epoch), "loss/val": loss})
    log(f"sft: epoch {run.state.epoch} validation loss {loss:.4f}")


def _maybe_save(run: SFTRun, epoch: int, batch: int, epoch_end: bool, steps: float) -> None:
    step = run.state.step
    name = checkpoint.checkpoint_name(epoch, None, step, final=True) if step >= steps \
        else due_checkpoint(run.cfg.training, step, epoch, batch, epoch_end)
    if name is not None:
        _save(run, name)


def _save(run: SFTRun, name: str) -> Path:
    s = run.state
    summary = {"epoch": s.epoch, "global_step": s.step, "cursor": s.cursor, "stage": "sft"}
    path = checkpoint.save_checkpoint(run.run_dir, name, run.policy.model,
                                      adapter_config_for(run.policy), s, run.optimizer,
                                      {"checkpoint_summary.json": summary}, dump(run.cfg))
    checkpoint.prune(run.run_dir, run.cfg.training.save_total_limit)
    return path
