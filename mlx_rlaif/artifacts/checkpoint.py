"""Checkpoints: atomic, resumable, loadable by mlx-lm.

Layout of a run directory (names follow the seed trainer):

    RUN/config.yaml                       resolved config, no secrets
    RUN/checkpoints/checkpoint-e2-b10-gs12/
        adapters.safetensors              LoRA weights, mlx-lm format
        adapter_config.json               mlx-lm adapter config (+ "base_model")
        optimizer.safetensors             AdamW state
        state.json                        step, epoch, data cursor, seeds, controller state
        config.yaml                       the run's config
        training_stats.json               rolling trainer stats
        checkpoint_summary.json           epoch / batch / step, baseline reward, gain
        manifest.json                     every file above with its size (written last)
    RUN/checkpoints/best.json             with training.keep_best: the checkpoint with the best
                                          periodic held-out score, its step and scores

A checkpoint is written to `checkpoint-...tmp-<pid>` and renamed into place, so a directory named
`checkpoint-*` without the `.tmp` suffix is always complete; a write that fails (a full disk)
removes its temporary directory. Its last file, `manifest.json`, lists the others with their
sizes: `newest_valid` checks it (integrity.py) and moves a damaged checkpoint aside to
`checkpoints/damaged-*`, so `--resume` falls back to the previous good one. Old checkpoints are
pruned by renaming them to a `.tmp` name first, so a crash mid-delete never leaves a half
checkpoint under a complete name; retention (`prune`) never deletes the best checkpoint.
`mlx_lm.generate --adapter-path DIR` loads one directly.
Not covered: sharded adapters, full fine-tuning, durability across a power cut (no fsync).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import CheckpointError
from ..faults import fault
from .atomic import write_json, write_json_atomic
from .integrity import problem, write_manifest

ADAPTERS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
STATE = "state.json"
OPTIMIZER = "optimizer.safetensors"
BEST = "best.json"  # in RUN/checkpoints/: the checkpoint with the best held-out score
_STEP = re.compile(r"gs(\d+)")


@dataclass(frozen=True)
class LoopState:
    """Everything besides weights that a resumed run needs to continue identically."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0  # tasks consumed in the current epoch
    kl_penalty: float = 0.0  # rl.kl_penalty as the adaptive controller left it
    reinforce_baseline: float | None = None
    baseline_reward: float | None = None
    best_reward: float | None = None
    skipped: int = 0  # optimizer updates skipped for a non-finite loss or gradient
    total_updates: int = 0  # the learning-rate schedule's horizon, fixed at the first launch


def checkpoint_name(epoch: int, batch: int | None, step: int, final: bool = False) -> str:
    """Seed-style tags: checkpoint-e2-b10-gs12, checkpoint-e2-end-gs12, checkpoint-final-gs12."""
    if final:
        return f"checkpoint-final-gs{step}"
    return f"checkpoint-e{epoch}-{'end' if batch is None else f'b{batch}'}-gs{step}"


def save_checkpoint(
    run_dir: Path,
    name: str,
    model: Any,
    adapter_cfg: Mapping[str, Any],
    state: LoopState,
    optimizer: Any = None,
    extra_json: Mapping[str, Any] | None = None,
    config_text: str | None = None,
    extra_arrays: Mapping[str, Mapping[str, mx.array]] | None = None,
) -> Path:
    """Write a complete MLX checkpoint atomically and return its path. `extra_arrays`: more
    safetensors files by name (a critic's value head, a moving reference's adapters)."""

    from .lora import adapter_weights  # mlx-lm: imported where a checkpoint is written

    def weights(tmp: Path) -> None:
        save_safetensors(tmp / ADAPTERS, adapter_weights(model))
        if optimizer is not None:
            save_safetensors(tmp / OPTIMIZER, dict(tree_flatten(optimizer.state)))
        for fname, arrays in (extra_arrays or {}).items():
            if arrays:
                save_safetensors(tmp / fname, dict(arrays))

    return write_checkpoint(run_dir, name, weights, adapter_cfg, state, extra_json, config_text)


def write_checkpoint(run_dir: Path, name: str, write_weights: Callable[[Path], None],
                     adapter_cfg: Mapping[str, Any], state: LoopState,
                     extra_json: Mapping[str, Any] | None = None,
                     config_text: str | None = None) -> Path:
    """The layout every backend shares: `write_weights(tmp)` writes the adapter (and optimizer)
    files, the JSON and config files are added, then the directory is renamed into place."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f"{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write_weights(tmp)
        fault("checkpoint-weights")
        write_json(tmp / ADAPTER_CONFIG, adapter_cfg)
        write_json(tmp / STATE, state.__dict__)
        for fname, obj in (extra_json or {}).items():
            write_json(tmp / fname, obj)
        if config_text is not None:
            (tmp / "config.yaml").write_text(config_text)
        write_manifest(tmp)
    except BaseException:  # a full disk, an error, Ctrl-C twice: leave nothing half-written
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fault("checkpoint-rename")
    if final.exists():
        _remove(final)
    os.replace(tmp, final)
    return final


def save_safetensors(path: Path, arrays: dict) -> None:
    """mx.save_safetensors, with its write error (a RuntimeError without errno) as an OSError:
    ENOSPC when the disk has less than 1 MiB left, else EIO."""
    try:
        mx.save_safetensors(str(path), arrays)
    except RuntimeError as e:
        full = shutil.disk_usage(path.parent).free < (1 << 20)
        code = errno.ENOSPC if full else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from e


def _remove(path: Path) -> None:
    """Delete a checkpoint directory: renamed to a `.tmp` name first (atomic), so a crash
    mid-delete leaves a directory `clean_partial` removes, never a half checkpoint."""
    trash = path.with_name(f"{path.name}.tmp-del-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def checkpoint_step(path: Path) -> int:
    m = _STEP.search(path.name)
    return int(m.group(1)) if m else -1


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (by global step, then modification time)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir()
            if p.is_dir() and p.name.startswith("checkpoint-") and ".tmp" not in p.name
            and (p / ADAPTERS).is_file() and (p / STATE).is_file()]
    return sorted(done, key=lambda p: (checkpoint_step(p), p.stat().st_mtime))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def newest_valid(run_dir: Path, say: Callable[[str], object] = print) -> Path | None:
    """The newest checkpoint that is whole (integrity.problem). Each damaged one newer than it is
    moved aside to `checkpoints/damaged-<name>` (kept for inspection, never picked again) with
    one line through `say`."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        why = problem(ckpt)
        if why is None:
            return ckpt
        aside = ckpt.with_name(f"damaged-{ckpt.name}")
        if aside.exists():
            aside = ckpt.with_name(f"damaged-{ckpt.name}-{os.getpid()}")
        os.replace(ckpt, aside)
        say(f"checkpoint {ckpt.name} is damaged ({why}): moved to {aside}, using the one before")
    return None


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (keep <= 0: delete nothing); the best one
    (`mark_best`) is never deleted and does not count toward `keep`."""
    best = best_checkpoint(run_dir)
    found = [p for p in list_checkpoints(run_dir) if p != best]
    gone = found[:-keep] if keep > 0 else []
    for p in gone:
        _remove(p)
    return gone


def mark_best(run_dir: Path, ckpt: Path, record: Mapping[str, Any]) -> None:
    """Name `ckpt` the run's best checkpoint in checkpoints/best.json (written atomically), with
    `record` (its step and held-out scores)."""
    write_json_atomic(Path(run_dir) / "checkpoints" / BEST, {**record, "checkpoint": ckpt.name})


def read_best(run_dir: Path) -> dict | None:
    """checkpoints/best.json, when it names a complete checkpoint."""
    path = Path(run_dir) / "checkpoints" / BEST
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ckpt = Path(run_dir) / "checkpoints" / str(record.get("checkpoint", ""))
    return record if ckpt in list_checkpoints(run_dir) else None


def best_checkpoint(run_dir: Path) -> Path | None:
    record = read_best(run_dir)
    return None if record is None else Path(run_dir) / "checkpoints" / record["checkpoint"]


def clean_partial(run_dir: Path) -> None:
    """Remove temporary checkpoint directories left by a crash."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.glob("checkpoint-*.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def resolve(path: str | Path) -> Path:
    """An adapter directory from a checkpoint directory, a run directory (its newest checkpoint)
    or a plain mlx-lm adapter directory."""
    p = Path(path)
    if (p / ADAPTERS).is_file() and (p / ADAPTER_CONFIG).is_file():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise CheckpointError(f"{p} holds no adapters: pass a checkpoint directory "
                              f"(with {ADAPTERS}) or a run directory with checkpoints/")
    return latest


def load_state(ckpt: Path) -> LoopState:
    data = json.loads((Path(ckpt) / STATE).read_text())
    if "kl_coef" in data:  # the name before 0.2
        data.setdefault("kl_penalty", data.pop("kl_coef"))
    known = set(LoopState.__dataclass_fields__)
    return LoopState(**{k: v for k, v in data.items() if k in known})


def load_adapter_config(ckpt: Path) -> dict:
    return json.loads((Path(ckpt) / ADAPTER_CONFIG).read_text())


def base_model_of(adapter_dir: Path, override: str | None = None) -> str:
    """The base model the adapters were trained on: `override`, else adapter_config's base_model."""
    if override:
        return override
    base = load_adapter_config(adapter_dir).get("base_model")
    if not base:
        raise CheckpointError(f"{adapter_dir}/{ADAPTER_CONFIG} names no base_model: "
                              "pass the base model with --model")
    return str(base)


def load_weights_into(model: Any, ckpt: Path) -> None:
    """Load adapter weights into a model that already has LoRA layers of the same shape."""
    from .lora import adapter_weights

    weights = mx.load(str(Path(ckpt) / ADAPTERS))
    have = adapter_weights(model)
    missing = sorted(set(have) - set(weights))
    wrong = sorted(k for k in weights if k not in have or weights[k].shape != have[k].shape)
    if missing or wrong:
        bad = (missing + wrong)[0]
        raise CheckpointError(f"{ckpt}: adapters do not match the model (first mismatch: {bad}); "
                              "use the same model and lora settings the checkpoint was made with")
    model.load_weights(list(weights.items()), strict=False)


VALUE_HEAD = "value_head.safetensors"  # a critic's value head (rl.advantage gae)
REFERENCE = "reference.safetensors"  # the reference's adapters (rl.reference ema/periodic/initial)


def load_arrays(ckpt: Path, fname: str) -> dict[str, mx.array] | None:
    """The arrays of one of a checkpoint's extra safetensors files, or None without it."""
    path = Path(ckpt) / fname
    return dict(mx.load(str(path))) if path.is_file() else None


def load_optimizer_into(optimizer: Any, ckpt: Path) -> bool:
    path = Path(ckpt) / OPTIMIZER
    if not path.is_file():
        return False
    optimizer.state = tree_unflatten(list(mx.load(str(path)).items()))
    return True
