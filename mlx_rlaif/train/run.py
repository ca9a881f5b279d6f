"""The run object: everything a step needs, held by the loop (never passed to a backend), and the
checkpoints it writes.

`Run` bundles the config, the backend's operations (`backends.ops.Ops`), the policy and its
optimizer, the reward, the run directory and the loop state (`LoopState`, replaced after each
step). `save` writes a checkpoint through the backend; `maybe_save` applies the retention
settings (`training.save_every_batches`, `save_every_epochs`, `save_total_limit`).

Not covered: the loop itself (loop.py), the step (step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifacts import checkpoint
from ..backends.ops import Ops
from ..backends.sampling import SamplingParams
from ..config import Config, dump
from ..records import Task
from ..rewards.base import RewardFn
from .carry import carry_state
from .distributed import World
from .multiturn import responder


@dataclass
class Run:
    """Everything a step needs. `state` is replaced (frozen LoopState) after each step."""

    cfg: Config
    ops: Ops
    policy: Any  # backends.mlx.policy.Policy, or backends.torch.policy.TorchPolicy
    optimizer: Any
    reward_fn: RewardFn
    run_dir: Path
    state: checkpoint.LoopState
    format: Callable[[Task], list[int]]
    stop: str | None = None
    carry: list = field(default_factory=list)  # dynamic sampling's groups for the next step
    curriculum: Any = None  # data.curriculum.Curriculum, with data.curriculum
    world: World = field(default_factory=World)  # the data-parallel ranks (distributed.py)
    cores: Any = None  # rewards/exec/cores.Cores: the exec reward's limit beside decoding
    teacher: Any = None  # backends/mlx/teacher.Teacher, with distill.kind teacher

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams.from_config(self.cfg.generation)

    def sample(self, tasks: list[Task], seed: int | None,
               on_group: Callable[[list], None] | None = None) -> tuple[list, dict]:
        """G completions of each task from the live policy (`seed` None: continue the stream);
        conversations of up to generation.max_turns answers when it is above 1. `on_group`
        (single answers only) sees each task's G rollouts as soon as they have all ended."""
        gen = self.cfg.generation
        if gen.max_turns == 1:
            return self.ops.sample(self.policy, tasks, self.sampling,
                                   gen.num_samples_per_prompt, self.format, seed, on_group)
        respond = responder(self.reward_fn, self.policy.tokenizer, gen,
                            self.cfg.model.chat_template)
        return self.ops.converse(self.policy, tasks, self.sampling, gen.num_samples_per_prompt,
                                 self.format, seed, gen.max_turns, respond)


CARRY = "carry.json"  # dynamic sampling's carried groups
CURRICULUM = "curriculum.json"  # the curriculum's bucket statistics


def due_checkpoint(t: Any, step: int, epoch: int, batch: int, epoch_end: bool) -> str | None:
    """The name of the checkpoint the training section `t` asks for after this step, if any:
    every `save_every_batches` steps, else at the end of every `save_every_epochs` epochs."""
    if t.save_every_batches and step % t.save_every_batches == 0:
        return checkpoint.checkpoint_name(epoch, batch, step)
    if epoch_end and t.save_every_epochs and epoch % t.save_every_epochs == 0:
        return checkpoint.checkpoint_name(epoch, None, step)
    return None


def maybe_save(run: Run, hub: Any, epoch: int, batch: int, epoch_end: bool) -> None:
    name = due_checkpoint(run.cfg.training, run.state.step, epoch, batch, epoch_end)
    if name is not None:
        save(run, hub, name)


def saved_at(run: Run, step: int) -> bool:
    latest = checkpoint.latest_checkpoint(run.run_dir)
    return latest is not None and checkpoint.checkpoint_step(latest) == step


def save(run: Run, hub: Any, name: str) -> Path | None:
    """A checkpoint through the backend. Its summary's reward gain is the metrics hub's (one
    EMA of the reward for the whole run, rebuilt on resume from batches.jsonl). Rank 0 alone
    writes (None elsewhere; no collective here, so the ranks need not agree on the call)."""
    if run.world.rank:
        return None
    s, stats = run.state, hub.stats()
    summary = {"epoch": s.epoch, "global_step": s.step, "cursor": s.cursor,
               "baseline_reward": s.baseline_reward, "best_reward": s.best_reward,
               "reward_gain_from_baseline": stats.get("reward_gain_from_baseline")}
    extra = {"checkpoint_summary.json": summary, "training_stats.json": stats}
    if run.carry:
        extra[CARRY] = carry_state(run.carry)
    if run.curriculum is not None:
        extra[CURRICULUM] = run.curriculum.state()
    path = run.ops.save(run.policy, run.optimizer, run.run_dir, name, s, extra, dump(run.cfg))
    bits = run.cfg.training.save_mlx_model_bits
    if bits:
        from ..artifacts.fuse import write_mlx_model

        model, tokenizer = run.ops.mlx_model(run.policy, run.cfg, path)
        write_mlx_model(model, tokenizer, path, None if bits == 16 else bits)
    checkpoint.prune(run.run_dir, run.cfg.training.save_total_limit)
    hub.message(f"saved {path}")
    return path
