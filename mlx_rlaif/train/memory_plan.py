"""The run's memory plan, made once before the first step: the budget, the model's real shapes
and the config's sizes go through the memory model (`backends/mlx/memory.py`), and the choices
it makes where the config leaves them open (`generation.completion_batch_size` 0,
`training.micro_batch_size` 0, `training.grad_checkpoint: auto`) are written into the config
the run uses (`resolve`: a new frozen Config, the user's file unchanged), and MLX's wired and
buffer-cache limits are set (`device_limits`: model.wired_limit_gb, model.cache_limit_gb, or on
Metal the budget and what the plan leaves of it). A run that cannot fit
stops here with a ConfigError naming the setting to change. `startup_line` says the budget and
what was chosen; `memory/budget_gb` goes to the metrics.

The prompt length is the longest, in tokens, of the 8 longest tasks by characters (formatted as
the run formats them): the plan is made before any prompt is sampled.

Not covered: the torch backend (no plan: its settings are taken as they are; CUDA has its own
allocator), models whose shapes the memory model does not know (`memory.shape_of` is None: the
settings are taken as they are, auto checkpointing off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..backends.mlx import memory, shared_prompt
from ..backends.sampling import SamplingParams
from ..config import Config, batch_sequences, micro_batch_size
from ..errors import ConfigError
from ..records import Task

LONGEST = 8  # tasks tokenized to estimate the longest prompt


def longest_prompt(fmt: Callable[[Task], list[int]], tasks: Sequence[Task]) -> int:
    """Tokens of the longest prompt among the LONGEST longest tasks (by characters)."""
    longest = sorted(tasks, key=lambda t: len(t.prompt), reverse=True)[:LONGEST]
    return max((len(fmt(t)) for t in longest), default=1)


def work_of(cfg: Config, prompt_len: int, model: Any = None) -> memory.Work:
    """The step's sizes; with `model`, whether its update shares prompts (training.share_prompt
    and a model whose caches allow it: shared_prompt.supported) or runs the rows in full."""
    shared = model is None or (cfg.training.share_prompt and shared_prompt.supported(model))
    return memory.Work(prompts=cfg.training.batch_size,
                       group=cfg.generation.num_samples_per_prompt, prompt_len=prompt_len,
                       new_tokens=cfg.generation.max_new_tokens,
                       train_rows=micro_batch_size(cfg) or batch_sequences(cfg),
                       entropy_grad=cfg.rl.entropy_coef != 0, shared=shared,
                       draft_tokens=SamplingParams.from_config(cfg.generation).draft_tokens)


def fused_bytes(model: Any, cfg: Config) -> int:
    """The copies decoding makes: the fused adapters' (policy.lora_fused) and, on MLX's CPU
    build, the blocks' weights transposed (cpu.decode_kernels; counted at every width, though
    only narrow batches decode that way); 0 for none."""
    from ..backends.mlx.policy import fused_lora_bytes
    from ..cpu.decode_kernels import transposed_bytes

    size = fused_lora_bytes(model)
    fused = size if size is not None and size <= cfg.generation.fuse_lora_max_mb * 2**20 else 0
    return fused + transposed_bytes(model)


def make_plan(cfg: Config, model: Any, prompt_len: int, budget: int, teacher: Any = None
              ) -> tuple[memory.Plan | None, memory.Shape | None]:
    """The plan for `model` within `budget` bytes (None where its shapes are unknown), with a
    distillation `teacher` model's weights and forward counted (distill.kind teacher; a
    teacher whose shapes are unknown counts its weights as a student's fixed bytes would not:
    the plan is then made without it)."""
    shape = memory.shape_of(model, fused_bytes(model, cfg))
    if shape is None:
        return None, None
    t = cfg.training
    taught = memory.shape_of(teacher) if teacher is not None else None
    return memory.plan(shape, work_of(cfg, prompt_len, model), budget,
                       cfg.generation.completion_batch_size, t.micro_batch_size,
                       t.grad_checkpoint, taught), shape


def resolved(cfg: Config, plan: memory.Plan | None, budget: int) -> Config:
    """The config the run uses: the plan's choices where the config left them open (0 / auto;
    a choice that covers the whole batch stays 0), the budget in max_memory_gb."""
    t, g = cfg.training, cfg.generation
    ck = t.grad_checkpoint
    if ck == "auto":
        ck = "on" if plan is not None and plan.checkpoint else "off"
    micro, width = t.micro_batch_size, g.completion_batch_size
    if plan is not None and not micro and plan.micro_batch < (micro_batch_size(cfg)
                                                               or batch_sequences(cfg)):
        micro = plan.micro_batch
    rows = t.batch_size * g.num_samples_per_prompt
    if plan is not None and not width and plan.decode_width < rows:
        width = plan.decode_width
    return replace(cfg, training=replace(t, grad_checkpoint=ck, micro_batch_size=micro,
                                         max_memory_gb=budget / memory.GiB),
                   generation=replace(g, completion_batch_size=width))


def startup_line(plan: memory.Plan | None, budget: int, source: str, cfg: Config) -> str:
    """`memory: budget 13.60 GB (85% of the available RAM); plan: ...`"""
    head = f"memory: budget {memory.gb(budget)} GB ({source})"
    if cfg.model.backend != "mlx":
        return f"{head}; no plan (MLX only): the torch backend takes its settings as they are"
    if plan is None:
        return f"{head}; no plan (the model's shapes are unknown): settings taken as they are"
    t, g = cfg.training, cfg.generation
    width = g.completion_batch_size or t.batch_size * g.num_samples_per_prompt
    micro = micro_batch_size(cfg) or batch_sequences(cfg)
    teacher = (f" + teacher {memory.gb(plan.teacher)} GB (its forward "
               f"{memory.gb(plan.teacher_pass)} GB)" if plan.teacher else "")
    return (f"{head}; plan: weights {memory.gb(plan.weights)} GB{teacher}, decoding {width} "
            f"sequences at once, micro-batches of {micro} sequences, checkpointing "
            f"{t.grad_checkpoint}: peak about {memory.gb(plan.peak)} GB")


def resolve(cfg: Config, model: Any, tasks: Sequence[Task], fmt: Callable[[Task], list[int]],
            teacher: Any = None) -> tuple[Config, str]:
    """(the config the run uses, the startup line), before the first step; ConfigError where
    the run cannot fit its budget (a distillation `teacher` model counted). MLX's wired and
    cache limits are set here (`apply_limits`)."""
    budget, source = memory.device_budget(cfg.training.max_memory_gb)
    plan, limits = None, ""
    if cfg.model.backend == "mlx":
        plan, _ = make_plan(cfg, model, longest_prompt(fmt, tasks), budget, teacher)
        limits = apply_limits(cfg.model, plan, budget)
    run_cfg = resolved(cfg, plan, budget)
    return run_cfg, startup_line(plan, budget, source, run_cfg) + (f"; {limits}" if limits
                                                                   else "")


@dataclass(frozen=True)
class Limits:
    """MLX's wired and buffer-cache limits in bytes (None: left as they are) and what they
    are, said in the memory line and by `doctor`."""

    wired: int | None
    cache: int | None
    line: str


def device_limits(m: Any, plan: memory.Plan | None, budget: int, working_set: int | None
                  ) -> Limits:
    """The limits the run sets from the model section `m` (model.wired_limit_gb,
    model.cache_limit_gb): where 0, on Metal (`working_set`: the recommended working set; None
    elsewhere) the wired limit is the budget and the cache what the plan leaves of it, at least
    CACHE_CLEAR_SHARE of it. A wired limit over the working set is a ConfigError."""
    GiB, wired, cache, said = memory.GiB, None, None, []
    if m.wired_limit_gb and working_set is None:
        said.append("model.wired_limit_gb has no effect off Metal")
    elif m.wired_limit_gb:
        wired = int(m.wired_limit_gb * GiB)
        if wired > working_set:
            raise ConfigError(f"model.wired_limit_gb = {m.wired_limit_gb:g} is over this Mac's "
                              f"working set of {memory.gb(working_set)} GB: lower it, or raise "
                              "the Mac's limit (sudo sysctl iogpu.wired_limit_mb=...)")
        said.append(f"wired {memory.gb(wired)} GB (model.wired_limit_gb)")
    elif working_set:
        wired = min(budget, working_set)
        said.append(f"wired {memory.gb(wired)} GB (the budget)")
    if m.cache_limit_gb:
        cache = int(m.cache_limit_gb * GiB)
        said.append(f"cache {memory.gb(cache)} GB (model.cache_limit_gb)")
    elif working_set and plan is not None:
        cache = max(budget - plan.peak, int(memory.CACHE_CLEAR_SHARE * budget))
        said.append(f"cache {memory.gb(cache)} GB (what the plan leaves of the budget)")
    return Limits(wired, cache, "MLX limits: " + ", ".join(said) if said else "")


def apply_limits(m: Any, plan: memory.Plan | None, budget: int) -> str:
    """Set MLX's limits (`device_limits`); returns their line ("" where none is set)."""
    limits = device_limits(m, plan, budget, memory.recommended_working_set())
    memory.set_device_limits(limits.wired, limits.cache)
    return limits.line
