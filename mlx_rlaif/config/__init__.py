"""Configuration: the schema (`schema.py`: frozen dataclasses, one per concern, every option
documented), strict loading from YAML with `--set` overrides (`loading.py`), and the seed
trainer's layout translated into ours (`seed.py`)."""

from .loading import (
    apply_override,
    build_section,
    check,
    documented_yaml,
    dump,
    from_dict,
    load,
    read_raw,
    smoke_caps,
    smoke_eval_tasks,
    smoke_steps,
    to_dict,
)
from .schema import (
    Config,
    DataConfig,
    DistillConfig,
    DistributedConfig,
    ExecConfig,
    GenerationConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    RewardComponent,
    RewardConfig,
    RLConfig,
    TeacherConfig,
    TrainingConfig,
    batch_sequences,
    micro_batch_size,
    opt,
    prompts_per_step,
    reward_components,
    with_functions,
)

__all__ = [
    "Config", "DataConfig", "DistillConfig", "DistributedConfig", "ExecConfig", "GenerationConfig", "LoggingConfig", "LoraConfig",
    "ModelConfig", "RLConfig", "RewardComponent", "RewardConfig", "TeacherConfig", "TrainingConfig", "apply_override",
    "batch_sequences", "build_section", "check", "documented_yaml", "dump", "from_dict", "load",
    "micro_batch_size", "opt", "prompts_per_step", "read_raw", "reward_components", "smoke_caps", "smoke_eval_tasks", "smoke_steps", "to_dict", "with_functions",
]
