"""The seed trainer's config layout (the Python RLAIF trainer mlx-rlaif replaces), read as ours.

Its `config.yaml` had sections `model`, `teacher`, `training`, `rlaif`, `hardware`, `logging`,
`huggingface` (../shared/reference 002). `translate(raw)` maps every key of that layout onto our
schema before strict loading, so a seed config file loads unchanged:
- keys with an equivalent are moved there (`rlaif.kl_penalty` -> `rl.kl_penalty`,
  `model.use_4bit` -> `model.quantize: 4`, `training.save_steps` -> `save_every_batches`, ...);
- keys the one-process design makes pointless (the MLX generation copy and its weight reload,
  the generation worker, DataLoader workers, PyTorch memory tricks) are dropped with one note
  each saying why;
- keys with no equivalent, or values we cannot honour (an upload turned on), raise a
  `ConfigError` naming the key and the reason.
Keys of our own layout pass through untouched, so a file may mix both.

Not covered: the seed's command-line flags (ours: `mlx-rlaif train --help`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

# sections only the seed layout has; their presence marks a seed file
SEED_SECTIONS = ("rlaif", "teacher", "hardware", "huggingface")
_CRITERIA = ("correctness", "code_quality", "efficiency", "documentation")

Move = tuple[str, Callable[[Any], Any]]  # (our dotted key, value transform)


def _same(v: Any) -> Any:
    return v


def _quantize(bits: int) -> Callable[[Any], Any]:
    return lambda on: bits if on else 0


def _never(why: str) -> Callable[[Any], Any]:
    """A value that may only be false (an upload turned off)."""
    def check(v: Any) -> Any:
        if v:
            raise ValueError(why)
        return None
    return check


# seed key -> (our key, transform); our key None: accepted, nothing to set (see NOTES)
MOVES: dict[str, Move] = {
    "model.name": ("model.path", _same),
    "model.model_name": ("model.path", _same),
    "model.base_model": ("model.path", _same),
    "model.use_4bit": ("model.quantize", _quantize(4)),
    "model.use_8bit": ("model.quantize", _quantize(8)),
    "model.trust_remote_code": ("model.trust_remote_code", _same),
    "teacher.provider": ("reward.teacher.provider", _same),
    "teacher.model": ("reward.teacher.model", _same),
    "teacher.model_name": ("reward.teacher.model", _same),
    "teacher.api_key_env": ("reward.teacher.api_key_env", _same),
    "teacher.base_url": ("reward.teacher.base_url", _same),
    "teacher.temperature": ("reward.teacher.temperature", _same),
    "teacher.max_tokens": ("reward.teacher.max_tokens", _same),
    "teacher.timeout": ("reward.teacher.timeout_s", float),
    "teacher.max_retries": ("reward.teacher.max_retries", _same),
    "teacher.max_workers": ("reward.teacher.concurrency", _same),
    "rlaif.num_samples_per_prompt": ("generation.num_samples_per_prompt", _same),
    "rlaif.kl_penalty": ("rl.kl_penalty", _same),
    "rlaif.temperature": ("generation.temperature", _same),
    "rlaif.max_new_tokens": ("generation.max_new_tokens", _same),
    "rlaif.top_p": ("generation.top_p", _same),
    "rlaif.top_k": ("generation.top_k", _same),
    "rlaif.reward_weights": ("reward.teacher.criteria", dict),
    "training.logging_steps": ("logging.log_every", _same),
    "training.save_steps": ("", _same),  # see _save_steps
    "training.lr_scheduler_type": ("training.lr_schedule", _same),
    "huggingface.save_datasets_locally": ("logging.collect_dataset", _same),
    "huggingface.upload_datasets": ("", _never(
        "uploads are a separate step here: after training run `mlx-rlaif export-dataset RUN "
        "--out DIR --push REPO`, and set huggingface.upload_datasets to false")),
    "huggingface.upload_to_hub": ("", _never(
        "uploads are a separate step here: `mlx-rlaif fuse RUN --out DIR`, then "
        "`huggingface-cli upload REPO DIR`; set huggingface.upload_to_hub to false")),
}
for _name in _CRITERIA:  # rlaif.<criterion>_weight -> one rubric weight
    MOVES[f"rlaif.{_name}_weight"] = (f"reward.teacher.criteria.{_name}", float)

# seed key -> why it no longer applies (accepted, with this note)
NOTES: dict[str, str] = {
    "model.max_length": "prompts are never truncated (that changes the task); completions are "
                        "bounded by generation.max_new_tokens and training memory by "
                        "training.micro_batch_size",
    "model.torch_dtype": "MLX computes in the model's stored dtype",
    "training.fp16": "MLX computes in the model's stored dtype",
    "training.bf16": "MLX computes in the model's stored dtype",
    "hardware.use_mps": "MLX picks the device itself (Metal on Apple silicon)",
    "hardware.device": "MLX picks the device itself (Metal on Apple silicon); the torch "
                       "backend's is model.device",
    "hardware.dataloader_num_workers": "there is no DataLoader: tasks are read once",
    "hardware.pin_memory": "there is no DataLoader: tasks are read once",
    "hardware.use_mlx_for_generation": "generation always runs in MLX, on the weights being "
                                       "trained",
    "hardware.mlx_model_path": "the model in model.path is trained and sampled in MLX directly "
                               "(pass an MLX conversion as model.path to train that one)",
    "hardware.mlx_quantization": "there is no separate generation copy to quantize (quantize "
                                 "the trained base with model.quantize)",
    "hardware.reload_mlx_from_latest_checkpoint": "the update changes the arrays the next "
                                                  "rollout samples from: there is nothing to "
                                                  "reload",
    "hardware.use_mlx_generation_worker": "one process, one set of weights: no worker",
    "hardware.mlx_generation_worker_timeout_s": "one process, one set of weights: no worker",
    "logging.save_json_summaries": "batches.jsonl and epochs.jsonl are always written to the "
                                   "run directory",
    "logging.json_summaries_dir": "the JSONL summaries are written to the run directory "
                                  "(training.output_dir)",
    "logging.tensorboard_dir": "TensorBoard writes to <output_dir>/tensorboard",
    "logging.gpu_utilization_mode": "no GPU-utilization estimate is logged (MLX's memory is)",
    "logging.health_check_fragmentation": "there is no PyTorch MPS heap to defragment",
    "huggingface.dataset_repo_id": "used by `mlx-rlaif export-dataset --push` only",
    "huggingface.dataset_output_dir": "datasets are written to <output_dir>/datasets "
                                      "(`mlx-rlaif export-dataset` copies them anywhere)",
    "huggingface.repo_id": "model uploads are left to huggingface-cli",
    "huggingface.hf_token_env": "model uploads are left to huggingface-cli",
    "huggingface.upload_quantized": "model uploads are left to huggingface-cli",
    "huggingface.private": "model uploads are left to huggingface-cli",
}

# seed keys that mean what ours mean, in the same place
SAME = ("training.batch_size", "training.learning_rate", "training.num_epochs",
        "training.max_steps", "training.warmup_steps", "training.weight_decay",
        "training.max_grad_norm", "training.seed", "training.output_dir",
        "training.gradient_accumulation_steps", "training.save_every_epochs",
        "training.save_every_batches", "training.save_total_limit",
        "logging.baseline_eval_batches", "logging.health_check_enabled",
        "logging.health_check_interval_batches")


def is_seed_layout(raw: dict) -> bool:
    return any(k in raw for k in SEED_SECTIONS) or bool(
        _flat(raw).keys() & (set(MOVES) | set(NOTES)))


def translate(raw: dict) -> tuple[dict, list[str]]:
    """(our layout, one note per dropped key) for a raw config that may be in the seed's."""
    if not is_seed_layout(raw):
        return raw, []
    out: dict = {}
    notes: list[str] = []
    flat = _flat(raw)
    for key, value in flat.items():
        if key in SEED_SECTIONS and value is None:  # an empty section
            continue
        if key.startswith("logging.health_check_fragmentation"):
            key = "logging.health_check_fragmentation"
        if key in MOVES:
            _move(out, key, value)
        elif key in NOTES:
            notes.append(f"{key}: no longer applies: {NOTES[key]}")
        elif key.split(".")[0] in SEED_SECTIONS:
            raise ConfigError(f"{key} (the seed trainer's layout) has no equivalent here: "
                              "remove it (`mlx-rlaif migrate-config FILE` lists what maps)")
        else:
            _set(out, key, value)
    if flat.get("training.save_steps"):
        notes.append(_save_steps(out, flat))
    if flat.get("teacher.provider") and "reward.type" not in flat:
        _set(out, "reward.type", "teacher")
        _set(out, "reward.teacher.mode", "ratio")  # the seed's reward: student / teacher
    return out, notes


def _save_steps(out: dict, flat: dict) -> str:
    """The seed's save_steps counted optimizer steps: ours counts steps, which are optimizer
    steps too, so it carries over; its save_every_batches (when set) was the finer one."""
    steps, batches = int(flat["training.save_steps"]), flat.get("training.save_every_batches")
    every = min(steps, int(batches)) if batches else steps
    _set(out, "training.save_every_batches", every)
    return (f"training.save_steps: {steps} -> training.save_every_batches: {every} (a step is "
            "one optimizer update here, gradient accumulation included)")


def _move(out: dict, key: str, value: Any) -> None:
    ours, transform = MOVES[key]
    try:
        value = transform(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key} (the seed trainer's layout): {e}") from None
    if ours:
        _set(out, ours, value)


def _flat(raw: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for every leaf; mappings under keys that hold mappings in our schema
    (criteria) stay whole."""
    out: dict[str, Any] = {}
    for k, v in (raw.items() if isinstance(raw, dict) else ()):
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in ("reward.teacher.criteria", "rlaif.reward_weights"):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _set(out: dict, dotted: str, value: Any) -> None:
    node = out
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
