"""What differs between the MLX backend and the torch fallback, picked once per run.

`OPS[cfg.model.backend]()` returns an `Ops`: load, optimizer, sample, reference, logprobs (the
live policy's), values (a critic's), update, advance_reference (a moving reference), save,
restore, mlx_model. The training loop calls only these, so no backend branch appears anywhere
else. Each takes explicit inputs (the policy, the optimizer, rollouts, advantages, reference
log-probs, the KL penalty, the config) and returns data; none sees the loop's run object. The
torch modules are imported only when their backend is chosen.

Not covered: mixing backends within one run (a torch checkpoint resumes on MLX and back, but the
AdamW moments restart: see backends/torch/policy.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..artifacts import checkpoint
from ..config import Config
from ..cpu.kernels import training_fast_paths
from ..records import Rollout, Task
from .parallel import Shard
from .sampling import SamplingParams

# (policy, tasks, sampling, G, prompt formatter, seed or None: continue the random stream)
# (policy, tasks, sampling, G, prompt formatter, seed, on_group) -> (rollouts, stats);
#  on_group(rollouts) sees each prompt's G rollouts once they are all finished
Sample = Callable[..., tuple[list[Rollout], dict]]
# (policy, optimizer, kept rollouts, their advantages (per rollout, or per token with a critic),
#  reference log-probs or None, config, KL penalty, critic's returns and old values or None,
#  shard=this rank's part of a data-parallel step or None: parallel.py)
#  -> (metrics, updates skipped for a non-finite loss or gradient)
Update = Callable[..., tuple[dict[str, float], int]]
# (policy, optimizer, run directory, checkpoint name, loop state, extra JSON files, config text)
Save = Callable[[Any, Any, Path, str, checkpoint.LoopState, dict, str], Path]


@dataclass(frozen=True)
class Ops:
    """The backend-specific operations of a run, picked once from `model.backend`."""

    load: Callable[[Config], Any]
    optimizer: Callable[[Any, Config, int], Any]  # (policy, config, total updates)
    sample: Sample
    reference: Callable[[Any, list[Rollout], Config], list[np.ndarray]]
    # the live policy's log-probs of completions it did not sample (train/guidance.py)
    logprobs: Callable[[Any, list[Rollout], Config], list[np.ndarray]]
    # (policy, rollouts, config, the first batch's mean reward for a fresh head) -> values
    values: Callable[[Any, list[Rollout], Config, float | None], list[np.ndarray]]
    # (policy, tasks, sampling, G, prompt formatter, seed, max turns, respond) -> conversations
    converse: Callable[..., tuple[list[Rollout], dict]]
    update: Update
    advance_reference: Callable[[Any, Config, int], None]  # (policy, config, steps done)
    save: Save
    restore: Callable[[Any, Any, Path], checkpoint.LoopState]
    mlx_model: Callable[[Any, Config, Path], tuple[Any, Any]]  # an MLX model + tokenizer


def mlx_ops() -> Ops:
    from ..artifacts.lora import critic_weights
    from .mlx import memory, rollout, update
    from .mlx.policy import adapter_config_for, load_policy, start_value

    traced: dict[str, Any] = {}  # the run's compiled gradient and optimizer step (update.py)

    def sample(policy: Any, tasks: list[Task], params: SamplingParams, group_size: int,
               fmt: Callable[[Task], list[int]], seed: int | None,
               on_group: Callable[[list[Rollout]], None] | None = None
               ) -> tuple[list[Rollout], dict]:
        if seed is not None:
            mx.random.seed(seed)
        return rollout.sample(policy.model, policy.tokenizer, tasks, params, group_size, fmt,
                              on_group)

    def reference(policy: Any, rollouts: list[Rollout], cfg: Config) -> list[np.ndarray]:
        with training_fast_paths(policy.model):
            return update.reference_logprobs(policy.model, rollouts, cfg, policy.split,
                                             policy.reference)

    def logprobs(policy: Any, rollouts: list[Rollout], cfg: Config) -> list[np.ndarray]:
        with training_fast_paths(policy.model):
            return update.policy_logprobs(policy.model, rollouts, cfg, policy.split)

    def converse(policy: Any, tasks: list[Task], params: SamplingParams, group_size: int,
                 fmt: Callable[[Task], list[int]], seed: int | None, max_turns: int,
                 respond: Callable[..., Any]) -> tuple[list[Rollout], dict]:
        if seed is not None:
            mx.random.seed(seed)
        return rollout.sample_conversations(policy.model, policy.tokenizer, tasks, params,
                                            group_size, fmt, max_turns, respond)

    def values(policy: Any, rollouts: list[Rollout], cfg: Config, mean_reward: float | None
               ) -> list[np.ndarray]:
        if mean_reward is not None:
            start_value(policy.model, mean_reward)
        with training_fast_paths(policy.model):
            return update.values_of(policy.model, rollouts, cfg, policy.split)

    def update_(policy: Any, optimizer: Any, rollouts: list[Rollout], adv: Any,
                ref: list[np.ndarray] | None, cfg: Config, kl_penalty: float,
                critic: dict | None = None, shard: Shard | None = None
                ) -> tuple[dict[str, float], int]:
        with training_fast_paths(policy.model):
            out = update.update(policy, optimizer, rollouts, adv, ref, cfg, kl_penalty, traced,
                                critic, shard)
        memory.clear_cache_if_large(int(cfg.training.max_memory_gb * memory.GiB))  # Metal only
        return out

    def save(policy: Any, optimizer: Any, run_dir: Path, name: str,
             state: checkpoint.LoopState, extra: dict, config_text: str) -> Path:
        arrays = {checkpoint.VALUE_HEAD: critic_weights(policy.model),
                  checkpoint.REFERENCE: policy.reference}
        return checkpoint.save_checkpoint(run_dir, name, policy.model, adapter_config_for(policy),
                                          state, optimizer, extra, config_text, arrays)

    return Ops(
        load=lambda cfg: load_policy(cfg.model.path, cfg.lora, cfg.lora.init_adapter or None,
                                     cfg.training.seed, cfg.model.trust_remote_code,
                                     cfg.model.quantize, cfg.rl.advantage == "gae",
                                     cfg.rl.reference != "base"),
        optimizer=lambda policy, cfg, n: update.make_optimizer(cfg.training, n), sample=sample,
        reference=reference, logprobs=logprobs, values=values, converse=converse, update=update_,
        advance_reference=update.advance_reference, save=save, restore=update.restore,
        mlx_model=lambda policy, cfg, path: (policy.model, policy.tokenizer))


def torch_ops() -> Ops:
    """The CUDA fallback (backends/torch/): the same loop on transformers + PEFT."""
    from ..artifacts.fuse import load_with_adapters
    from .torch import policy as tp  # first: its import guard names a missing package
    from .torch import rollout, update

    return Ops(
        load=lambda cfg: tp.load_policy(cfg.model.path, cfg.lora, cfg.lora.init_adapter or None,
                                        cfg.training.seed, cfg.model.trust_remote_code,
                                        cfg.model.device or None),
        optimizer=update.make_optimizer, sample=rollout.sample,
        reference=update.reference_logprobs, logprobs=update.policy_logprobs,
        values=_no_critic, converse=_no_critic,
        update=update.update,
        advance_reference=lambda policy, cfg, step: None, save=tp.save_checkpoint,
        restore=tp.restore,
        mlx_model=lambda policy, cfg, path: load_with_adapters(cfg.model.path, path)[:2])


def _no_critic(*args: Any) -> Any:
    raise NotImplementedError("the torch backend has no critic and no multi-turn rollouts "
                              "(refused by config.check)")


OPS: dict[str, Callable[[], Ops]] = {"mlx": mlx_ops, "torch": torch_ops}


def connect_group(engine: str, backend: str, timeout_s: float) -> Any:
    """This process's data-parallel group: engine "mlx" (mx.distributed as `mlx.launch` set it
    up; `backend` ring, mpi, jaccl or nccl) or "torch" (torch.distributed as `torchrun` set it
    up; gloo or nccl). See backends/mlx/parallel.py and backends/torch/parallel.py."""
    if engine == "mlx":
        from .mlx.parallel import connect
    else:
        from .torch.parallel import connect
    return connect(backend, timeout_s)
