"""Pick the reward function a config asks for.

Imports are lazy so that a run with the exec reward never imports the teacher SDKs and vice
versa. `build_reward(cfg, output_dir)` returns the RewardFn; constructing it runs the start-up
checks (toolchains, API keys, SDKs; a user's function imported and its signature checked
against the tasks' record fields, its worker processes started), so the trainer calls it
before any model loads. With `reward.components` or `reward.functions` the reward is the list
of components (custom/components.py); without them, `reward.type`'s own reward as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config, RewardComponent, RewardConfig, reward_components
from .base import RewardFn, SyntaxReward

if TYPE_CHECKING:
    from .exec.cores import Cores


def build_reward(cfg: Config, output_dir: str | Path | None = None,
                 languages: set[str] | None = None, fields: set[str] | None = None,
                 cores: Cores | None = None) -> RewardFn:
    """`fields`: the keys of the tasks' records (a function's parameters are checked against
    them; None: not checked). `cores`: the exec reward's limit beside decoding (exec/cores.py;
    None: every core, or reward.exec.workers)."""
    if cfg.reward.components or cfg.reward.functions:
        return build_components(cfg, output_dir, languages, fields, cores)
    kind = cfg.reward.type
    if kind == "syntax":
        return SyntaxReward()
    if kind == "exec":
        return _exec(cfg, languages, cores)
    if kind == "teacher":
        return _teacher(cfg, output_dir)
    from .mix import MixReward

    return MixReward(
        [(_exec(cfg, languages, cores), cfg.reward.exec_weight),
         (_teacher(cfg, output_dir), cfg.reward.teacher_weight)],
        window=cfg.reward.agreement_window,
    )


def _exec(cfg: Config, languages: set[str] | None, cores: Cores | None = None) -> RewardFn:
    from .exec import ExecReward

    return ExecReward(cfg.reward.exec, languages=languages, cores=cores)


def _teacher(cfg: Config, output_dir: str | Path | None) -> RewardFn:
    from .teacher import TeacherReward

    return TeacherReward(cfg.reward.teacher, output_dir=output_dir)


def build_components(cfg: Config, output_dir: str | Path | None, languages: set[str] | None,
                     fields: set[str] | None, cores: Cores | None = None) -> RewardFn:
    """The reward as its components (config.reward_components), each built and checked; what
    was started is closed again when a later one fails."""
    from .custom.components import ComponentsReward

    r = cfg.reward
    if not r.components and r.type == "mix":  # the form changed: said in one line
        logging.getLogger("mlx_rlaif").info(
            f"reward.type mix with reward.functions: loaded as the components exec (weight "
            f"{r.exec_weight:g}) and teacher (weight {r.teacher_weight:g}) plus your functions, "
            "summed (mix alone takes the weighted mean)")
    builtins: list = []
    customs: list = []
    try:
        for c in reward_components(r):
            if c.kind == "function":
                customs.append(_function(c, r, fields))
            elif c.kind == "server":
                customs.append(_server(c))
            else:
                fn = SyntaxReward() if c.kind == "syntax" else _exec(cfg, languages, cores) \
                    if c.kind == "exec" else _teacher(cfg, output_dir)
                builtins.append((c.name, c.weight, fn))
    except BaseException:
        for _, _, fn in builtins:
            fn.close()
        for custom in customs:
            custom.close()
        raise
    return ComponentsReward(builtins, customs, r.aggregation, r.on_error, r.max_error_frac)


def _function(c: RewardComponent, r: RewardConfig, fields: set[str] | None):
    from .custom.components import Custom
    from .custom.pool import WorkerPool
    from .custom.spec import absolute, load_function

    spec = absolute(c.fn)
    fn = load_function(spec, c.kwargs, fields, c.group)
    pool = WorkerPool(spec, c.kwargs, c.group, 1 if fn.is_async else r.workers, r.concurrency,
                      c.timeout_s, fn.is_async)
    return Custom(c.name, c.weight, pool.run, c.fn, fn.batched, c.group, c.timeout_s, pool.close)


def _server(c: RewardComponent):
    from .custom.client import ServerClient
    from .custom.components import Custom

    client = ServerClient(c.url, c.protocol, c.kwargs, c.timeout_s)
    return Custom(c.name, c.weight, client.score, c.url, timeout_s=c.timeout_s, server=True)
