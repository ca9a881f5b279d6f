"""What differs between the MLX backend and the torch fallback, picked once per run.

`OPS[cfg.model.backend]()` returns an `Ops`: load, optimizer, sample, reference, update, save,
restore. The loop in train.py calls only these, so no backend branch appears anywhere else.
The torch module is imported only when its backend is chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from . import checkpoint
from .backends.mlx import adapter_config_for, load_policy
from .config import Config, dump
from .cpu_kernels import training_fast_paths
from .records import Rollout, Task
from .rollout import SamplingParams, sample
from .update import make_optimizer, reference_logprobs, restore, update

if TYPE_CHECKING:
    from .train import Run


@dataclass(frozen=True)
class Ops:
    """The backend-specific operations of a run, picked once from `model.backend`."""

    load: Callable[[Config], Any]
    optimizer: Callable[[Any, Config, int], Any]
    sample: Callable[[Run, list[Task], int], tuple[list[Rollout], dict]]
    reference: Callable[[Run, list[Rollout]], list[np.ndarray]]
    update: Callable[[Run, list[Rollout], np.ndarray, Any], dict[str, float]]
    save: Callable[[Run, str, dict], Path]
    restore: Callable[[Any, Any, Path], checkpoint.LoopState]
    mlx_model: Callable[[Run, Path], tuple[Any, Any]]  # an MLX model + tokenizer to export


def mlx_ops() -> Ops:
    traced: dict[str, Any] = {}  # the run's compiled gradient and optimizer step (update.py)

    def sample_(run: Run, tasks: list[Task], seed: int) -> tuple[list[Rollout], dict]:
        mx.random.seed(seed)
        return sample(run.policy.model, run.policy.tokenizer, tasks,
                      SamplingParams.from_config(run.cfg.generation),
                      run.cfg.generation.num_samples_per_prompt, run.format)

    def reference_(run: Run, rollouts: list[Rollout]) -> list[np.ndarray]:
        with training_fast_paths(run.policy.model):
            return reference_logprobs(run.policy.model, rollouts, run.cfg)

    def update_(run: Run, rollouts: list[Rollout], adv: np.ndarray, ref: Any) -> dict:
        with training_fast_paths(run.policy.model):
            return update(run, rollouts, adv, ref, traced)

    def save_(run: Run, name: str, extra: dict) -> Path:
        return checkpoint.save_checkpoint(run.run_dir, name, run.policy.model,
                                          adapter_config_for(run.policy), run.state,
                                          run.optimizer, extra, dump(run.cfg))

    return Ops(
        load=lambda cfg: load_policy(cfg.model.path, cfg.lora, cfg.lora.init_adapter or None,
                                     cfg.training.seed, cfg.model.trust_remote_code),
        optimizer=lambda policy, cfg, n: make_optimizer(cfg, n), sample=sample_,
        reference=reference_, update=update_, save=save_, restore=restore,
        mlx_model=lambda run, path: (run.policy.model, run.policy.tokenizer))


def torch_ops() -> Ops:
    """The CUDA fallback (backends/torch*.py): the same loop on transformers + PEFT."""
    from .backends import torch as tb  # first: its import guard names a missing package
    from .backends import torch_rollout, torch_update
    from .export import load_with_adapters

    def update_(run: Run, rollouts: list[Rollout], adv: np.ndarray, ref: Any) -> dict:
        m, run.skipped = torch_update.update(run.policy, run.optimizer, rollouts, adv, ref,
                                             run.cfg, run.state.kl_coef, run.skipped)
        return m

    return Ops(
        load=lambda cfg: tb.load_policy(cfg.model.path, cfg.lora, cfg.lora.init_adapter or None,
                                        cfg.training.seed, cfg.model.trust_remote_code,
                                        cfg.model.device or None),
        optimizer=torch_update.make_optimizer,
        sample=lambda run, tasks, seed: torch_rollout.sample(
            run.policy, tasks, SamplingParams.from_config(run.cfg.generation), run.cfg.generation.num_samples_per_prompt,
            run.format, seed=seed),
        reference=lambda run, rs: torch_update.reference_logprobs(run.policy, rs, run.cfg),
        update=update_,
        save=lambda run, name, extra: tb.save_checkpoint(
            run.policy, run.optimizer, run.run_dir, name, run.state, extra, dump(run.cfg)),
        restore=tb.restore,
        mlx_model=lambda run, path: load_with_adapters(run.cfg.model.path, path)[:2])


OPS: dict[str, Callable[[], Ops]] = {"mlx": mlx_ops, "torch": torch_ops}
