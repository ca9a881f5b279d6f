"""Pick the reward function a config asks for.

Imports are lazy so that a run with the exec reward never imports the teacher SDKs and vice
versa. `build_reward(cfg, output_dir)` returns the RewardFn; constructing it runs the start-up
checks (toolchains, API keys, SDKs), so the trainer calls it before any model loads.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from .base import RewardFn, SyntaxReward


def build_reward(cfg: Config, output_dir: str | Path | None = None,
                 languages: set[str] | None = None) -> RewardFn:
    kind = cfg.reward.type
    if kind == "syntax":
        return SyntaxReward()
    if kind == "exec":
        return _exec(cfg, languages)
    if kind == "teacher":
        return _teacher(cfg, output_dir)
    from .mix import MixReward

    return MixReward(
        [(_exec(cfg, languages), cfg.reward.exec_weight),
         (_teacher(cfg, output_dir), cfg.reward.teacher_weight)],
        window=cfg.reward.agreement_window,
    )


def _exec(cfg: Config, languages: set[str] | None) -> RewardFn:
    from .exec import ExecReward

    return ExecReward(cfg.reward.exec, languages=languages)


def _teacher(cfg: Config, output_dir: str | Path | None) -> RewardFn:
    from .teacher import TeacherReward

    return TeacherReward(cfg.reward.teacher, output_dir=output_dir)
