"""Loading the configuration strictly from YAML.

`load(path, overrides)` reads a YAML file, applies `--set a.b=c` overrides and builds a `Config`.
Every problem (missing file, unknown key, wrong type, out-of-range value) raises one `ConfigError`
whose one-line message names the dotted key and the fix; nothing is loaded or written before that.
`configs/example.yaml` (`documented_yaml`) documents every option. A file in the seed trainer's
layout is translated first (seed.py), each key that no longer applies logged as one line.

`MLX_RLAIF_SMOKE=N` (`smoke_caps`) caps a run for smoke tests of the documented commands: at
most N training steps, one sample per held-out task, a periodic evaluation (where one is set) at
least every N steps, at most 8 held-out tasks (the periodic evaluation's, and the first 8 before
and after training: `smoke_eval_tasks`) and at most 64 new tokens; every cap it applies is logged as one line. Unset (or 0), nothing
changes.

Not covered: other environment variables than the teacher's API key name and MLX_RLAIF_SMOKE
(the key itself is never stored in a config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import math
import os
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..errors import ConfigError
from .schema import Config, reward_components
from .seed import translate


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or start from defaults), apply `a.b=c` overrides (and MLX_RLAIF_SMOKE's caps),
    and check everything."""
    raw = read_raw(path, overrides)
    smoke_caps(raw, rl=True)
    return from_dict(raw)


SMOKE_ENV = "MLX_RLAIF_SMOKE"
SMOKE_EVAL_TASKS = 8  # the periodic evaluation's tasks, and `mlx-rlaif eval --max-tasks`
SMOKE_NEW_TOKENS = 64


def smoke_steps() -> int:
    """N of MLX_RLAIF_SMOKE=N: the most training steps a smoke run takes (0: unset, no caps)."""
    value = os.environ.get(SMOKE_ENV, "").strip()
    if not value:
        return 0
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{SMOKE_ENV}={value!r}: set it to a number of steps (e.g. "
                          f"{SMOKE_ENV}=2), or unset it for a full run")
    return n


def smoke_eval_tasks() -> int:
    """The most held-out tasks a smoke run evaluates before and after training (0: no cap)."""
    return SMOKE_EVAL_TASKS if smoke_steps() else 0


def smoke_caps(raw: dict, rl: bool) -> list[str]:
    """Apply MLX_RLAIF_SMOKE's caps to a raw config in place (`rl`: the RL config, with data and
    generation sections; else only training.max_steps); returns the `key=value` caps applied,
    each logged as one line. Only lowers: a setting already under a cap stays."""
    n = smoke_steps()
    if not n:
        return []
    # (key, cap, whether an unset or 0 value is capped: 0 means "no bound" for these keys, or
    # their default is over the cap)
    caps: list[tuple[str, int, bool]] = [("training.max_steps", n, True)]
    if rl:
        caps += [("data.eval_samples", 1, False), ("data.eval_every", n, False),
                 ("data.eval_max_tasks", SMOKE_EVAL_TASKS, True),
                 ("generation.max_new_tokens", SMOKE_NEW_TOKENS, True),
                 ("rl.overlong_buffer", SMOKE_NEW_TOKENS, False)]
    applied = []
    for key, cap, unset_too in caps:
        section, name = key.split(".")
        node = raw.get(section, {})
        current = node.get(name) if isinstance(node, dict) else None
        if (isinstance(current, int) and 0 < current <= cap) or (not current and not unset_too):
            continue
        apply_override(raw, f"{key}={cap}")
        applied.append(f"{key}={cap}")
        logging.getLogger("mlx_rlaif").info(
            f"{SMOKE_ENV}={n}: {key} = {cap} (was {'unset' if current is None else current})")
    return applied


def read_raw(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """The YAML mapping at `path` (empty without one; the seed trainer's layout translated, a
    line logged per key that no longer applies) with `a.b=c` overrides applied."""
    raw: dict = {}
    if path is not None:
        raw, notes = translate(read_yaml(Path(path)))
        for note in notes:
            logging.getLogger("mlx_rlaif").info(f"{path}: {note}")
    for item in overrides:
        apply_override(raw, item)
    return raw


def read_yaml(p: Path) -> dict:
    """The top-level mapping of a YAML config file; ConfigError names file:line otherwise."""
    if not p.is_file():
        raise ConfigError(f"config file {p} not found: pass an existing YAML file to --config")
    try:
        raw = yaml.load(p.read_text(), Loader=_UniqueKeys) or {}  # a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', e)}): fix the "
                          "syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections (model:, rl:, ...)")
    return raw


class _UniqueKeys(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one
    silently, so the first setting would be lost without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"key {key!r} appears twice in one section",
                    problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def apply_override(raw: dict, item: str) -> None:
    """Set `a.b=c` in a nested dict; the value is parsed as YAML (so 3, 0.1, true, [a, b] work)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rl.kl_penalty=0.05")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        node[parts[-1]] = value


def from_dict(raw: dict) -> Config:
    return build_section(Config, raw, "")


def build_section(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got "
                          f"{type(raw).__name__}: write it as a section")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(_unknown(str(key), list(known), prefix))
    values = {}
    for name, f in known.items():
        if name not in raw:
            continue
        dotted = f"{prefix}{name}"
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            values[name] = build_section(tp, raw[name], dotted + ".")
        else:
            values[name] = _coerce(raw[name], tp, dotted)
            check = f.metadata.get("check")
            if check is not None and not check(values[name]):
                hint = f.metadata.get("hint") or "see the comment in configs/example.yaml"
                raise ConfigError(f"{dotted} = {values[name]!r} is out of range: {hint}")
    return cls(**values)


# names other tools use for our keys (TRL, mlx-lm-lora, the seed trainer)
_SYNONYMS = {"kl_coef": "kl_penalty", "kl_coeff": "kl_penalty", "beta": "kl_penalty",
             "lr": "learning_rate", "alpha": "scale", "lora_alpha": "scale", "r": "rank",
             "num_generations": "num_samples_per_prompt", "group_size": "num_samples_per_prompt",
             "max_tokens": "max_new_tokens", "max_completion_length": "max_new_tokens",
             "epsilon": "clip_low", "epsilon_high": "clip_high", "model_path": "path"}


def _unknown(key: str, known: list[str], prefix: str) -> str:
    close = [_SYNONYMS[key]] if _SYNONYMS.get(key) in known else []
    close = close or difflib.get_close_matches(key, known, n=1)
    fix = f"did you mean {prefix}{close[0]}?" if close else f"known keys: {', '.join(known)}"
    return f"unknown config key {prefix}{key}: {fix}"


def _coerce(value: Any, tp: Any, dotted: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):  # YAML 1.1 reads on as true
            value = "on" if value else "off"
        elif value is False and "off" in choices:  # ... and off as false
            value = "off"
        if value not in choices:
            raise ConfigError(f"{dotted} = {value!r} is not one of {', '.join(map(str, choices))}")
        return value
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(value, args[0], dotted)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{dotted} must be a list, got {value!r}: write [a, b]")
        return tuple(_coerce(v, typing.get_args(tp)[0], dotted) for v in value)
    if dataclasses.is_dataclass(tp):  # a list of sections (reward.components)
        return build_section(tp, value, dotted + ".")
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted} must be a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{dotted} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{dotted} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{dotted} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{dotted} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{dotted} must be a string, got {value!r}: quote it")
        return value
    raise ConfigError(f"{dotted}: unsupported type {tp}")


def to_dict(cfg: Any) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""
    out = dataclasses.asdict(cfg)

    def fix(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: fix(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [fix(v) for v in x]
        return x

    return fix(out)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def documented_yaml(cls: type = Config, indent: int = 0) -> str:
    """Every option with its default and docstring, as commented YAML (configs/example.yaml)."""
    lines: list[str] = []
    hints = typing.get_type_hints(cls)
    pad = "  " * indent
    for f in fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{pad}{f.name}:")
            lines.append(documented_yaml(tp, indent + 1))
            continue
        doc = f.metadata.get("doc", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, tuple):
            default = list(default)
        text = yaml.safe_dump({f.name: default}, default_flow_style=True, width=1000).strip()
        text = text[1:-1] if text.startswith("{") else text
        for line in _wrap(doc, 96 - len(pad)):
            lines.append(f"{pad}# {line}")
        lines.append(f"{pad}{text}")
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def check(cfg: Config) -> Config:
    """Cross-field checks that single-field checks cannot express."""
    r = cfg.reward
    check_components(cfg)
    if r.type == "mix" and r.exec_weight + r.teacher_weight <= 0:
        raise ConfigError("reward.exec_weight + reward.teacher_weight must be > 0 with type mix")
    kinds = {c.kind for c in reward_components(r)}
    if r.type in ("teacher", "mix") and r.teacher.provider == "none" and not r.components:
        raise ConfigError(f"reward.type = {r.type} needs a teacher: set reward.teacher.provider "
                          "to anthropic or openai")
    if r.teacher.mode == "rank" and "teacher" not in kinds:
        raise ConfigError("reward.teacher.mode = rank needs reward.type teacher or mix")
    if cfg.generation.num_samples_per_prompt < 2 and cfg.model.backend == "torch":
        raise ConfigError("generation.num_samples_per_prompt = 1 needs a critic (rl.advantage "
                          "gae), which is MLX-only: with model.backend torch set "
                          "num_samples_per_prompt to 2 or more")
    if cfg.generation.num_samples_per_prompt < 2 and cfg.rl.advantage != "gae":
        raise ConfigError("generation.num_samples_per_prompt = 1 leaves a group without a "
                          "baseline: set it to 2 or more, or use rl.advantage gae (a critic)")
    if cfg.generation.num_samples_per_prompt < 2 and cfg.rl.guidance:
        raise ConfigError("rl.guidance puts the reference answer in place of a group's last "
                          "completion, and a group of generation.num_samples_per_prompt = 1 "
                          "would lose its only sampled answer: set num_samples_per_prompt to 2 "
                          "or more, or rl.guidance to false")
    if cfg.generation.num_samples_per_prompt < 2 and cfg.rl.dynamic_sampling:
        # DAPO's filter keeps the groups whose rewards vary: a group of one never does
        raise ConfigError("rl.dynamic_sampling keeps groups whose rewards vary, and a group of "
                          "generation.num_samples_per_prompt = 1 never varies: set "
                          "num_samples_per_prompt to 2 or more, or rl.dynamic_sampling to false")
    age, updates = cfg.rl.carry_max_age, cfg.rl.num_iterations
    if cfg.rl.dynamic_sampling and age is not None and 0 < age < updates:
        raise ConfigError(f"rl.carry_max_age = {age} is below rl.num_iterations = {updates}: a "
                          f"group carried to the next step is {updates} updates old there, so "
                          "none would ever be used: set rl.carry_max_age to null (one step), 0 "
                          f"(never carry) or {updates} or more")
    if cfg.model.backend == "torch" and cfg.rl.advantage == "gae":
        raise ConfigError("rl.advantage gae (a critic) is MLX-only: with model.backend torch use "
                          "grpo, rloo or reinforce")
    if cfg.model.backend == "torch" and cfg.rl.reference != "base":
        raise ConfigError(f"rl.reference {cfg.rl.reference} is MLX-only: with model.backend torch "
                          "the reference is the frozen base (set rl.reference to base)")
    if cfg.rl.kl_penalty == 0 and cfg.rl.adaptive_kl:
        raise ConfigError("rl.adaptive_kl scales rl.kl_penalty, which is 0 (no KL at all, nothing "
                          "to adapt): set kl_penalty above 0, or adaptive_kl to false")
    if cfg.rl.kl_penalty == 0 and cfg.rl.reference != "base":
        raise ConfigError(f"rl.reference {cfg.rl.reference} sets the KL's reference, and "
                          "rl.kl_penalty = 0 computes no KL: set kl_penalty above 0, or "
                          "rl.reference to base")
    if cfg.rl.reference == "initial" and not cfg.lora.init_adapter:
        raise ConfigError("rl.reference initial is the adapters the run starts from, and "
                          "lora.init_adapter is empty: set lora.init_adapter (e.g. an `mlx-rlaif "
                          "sft` run directory), or rl.reference to base")
    if cfg.generation.max_turns > 1 and "exec" not in kinds:
        raise ConfigError("generation.max_turns > 1 feeds the exec reward's failure report back: "
                          "set reward.type to exec or mix")
    if cfg.generation.max_turns > 1 and cfg.rl.guidance:
        raise ConfigError("rl.guidance puts a reference answer in a group of single answers: "
                          "set generation.max_turns to 1, or rl.guidance to false")
    if cfg.generation.max_turns > 1 and cfg.model.backend == "torch":
        raise ConfigError("generation.max_turns > 1 is MLX-only (it continues the KV caches): "
                          "set it to 1 with model.backend torch")
    if cfg.generation.speculative != "off" and cfg.model.backend == "torch":
        raise ConfigError("generation.speculative ngram is MLX-only (it trims MLX's batch KV "
                          "caches per row): set it to off with model.backend torch")
    for key in ("wired_limit_gb", "cache_limit_gb"):
        if cfg.model.backend == "torch" and getattr(cfg.model, key):
            raise ConfigError(f"model.{key} is MLX-only: with model.backend torch leave it 0 "
                              "(torch has its own allocator)")
    if cfg.model.backend == "torch" and cfg.model.quantize:
        raise ConfigError("model.quantize is MLX-only: model.backend torch trains float weights "
                          "(pass a float model and set model.quantize to 0)")
    if cfg.rl.advantage == "reinforce" and cfg.rl.scale == "group":
        raise ConfigError("rl.advantage = reinforce has no group baseline, so rl.scale = group "
                          "(a group's std) is undefined for it: set rl.scale to batch "
                          "(REINFORCE++) or none")
    check_objective(cfg.rl)
    check_overlong(cfg)
    check_distill(cfg, kinds)
    d = cfg.data
    if d.eval_every and not d.eval_file:
        raise ConfigError("data.eval_every needs held-out tasks: set data.eval_file")
    if cfg.training.keep_best and not (d.eval_file and d.eval_every):
        raise ConfigError("training.keep_best needs a periodic evaluation: set data.eval_file and "
                          "data.eval_every")
    check_length(cfg.training)
    return cfg


def check_components(cfg: Config) -> None:
    """The reward's components (reward.components, reward.functions): each complete, names
    unique, some weight trained on; reward.components replaces reward.type's list."""
    r = cfg.reward
    if r.components and (r.type != "exec" or r.exec_weight != 0.5 or r.teacher_weight != 0.5):
        raise ConfigError(f"reward.components and reward.type = {r.type} (or exec_weight/"
                          "teacher_weight) both set: list every component, exec and teacher "
                          "included, in reward.components, and leave reward.type at exec")
    comps = reward_components(r)
    for i, c in enumerate(comps):
        first_fn = len(comps) - len(r.functions)
        where = f"reward.functions {r.functions[i - first_fn]!r}" if i >= first_fn else \
            f"reward.components[{i}] ({c.name})"
        if not (math.isfinite(c.weight) and c.weight >= 0):
            raise ConfigError(f"{where}: weight {c.weight} is not a number >= 0: write "
                              "FILE.py:fn@0.3 (or weight: 0.3)")
        if (c.kind == "function") != bool(c.fn) or (c.kind == "server") != bool(c.url):
            raise ConfigError(f"{where}: kind {c.kind} takes " + (
                "fn: path/to/file.py:function or package.module:function" if c.kind == "function"
                else "url: http://host:port/" if c.kind == "server" else "neither fn nor url"))
        if c.kind == "function" and ":" not in c.fn:
            raise ConfigError(f"{where}: {c.fn!r} names no function: write FILE.py:function or "
                              "package.module:function")
        if c.group and c.kind != "function":
            raise ConfigError(f"{where}: group applies to kind function only")
        if c.kind == "teacher" and r.teacher.provider == "none":
            raise ConfigError(f"{where}: a teacher component needs reward.teacher.provider "
                              "(anthropic or openai)")
    names = [c.name for c in comps]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"reward components named {dup[0]!r} twice: give each its own name "
                          "(name: ...) to keep their metrics apart")
    if (r.components or r.functions) and sum(c.weight for c in comps) <= 0:
        raise ConfigError("every reward component has weight 0: give at least one a weight > 0")


def check_objective(rl: Any) -> None:
    """The RL options whose combination would silently do something other than what each names
    (docs/algorithms.md: refused combinations)."""
    if rl.ratio_level == "sequence" and rl.loss_agg in ("token", "constant"):
        raise ConfigError("rl.ratio_level = sequence (GSPO) counts each sequence once, but "
                          f"rl.loss_agg = {rl.loss_agg} weighs it by its length: set "
                          "rl.loss_agg to auto or sequence (resuming a run saved that way: "
                          "--set rl.loss_agg=auto), or rl.ratio_level to token")
    if rl.kl_estimator == "k1" and rl.kl_penalty > 0 and not rl.kl_in_reward:
        raise ConfigError("rl.kl_estimator = k1 in the loss (rl.kl_in_reward false) has zero "
                          "gradient in expectation, so rl.kl_penalty would do nothing: use k2 "
                          "(the gradient of KL(policy || ref)) or k3, or set rl.kl_in_reward "
                          "to true (the reward takes k1)")


def check_overlong(cfg: Config) -> None:
    """rl.overlong_penalty needs a buffer inside the completion budget, and single answers."""
    rl, n = cfg.rl, cfg.generation.max_new_tokens
    if rl.overlong_penalty > 0 and not 0 < rl.overlong_buffer <= n:
        raise ConfigError(f"rl.overlong_penalty needs rl.overlong_buffer between 1 and "
                          f"generation.max_new_tokens ({n}), got {rl.overlong_buffer}: set the "
                          "number of tokens before the limit over which the penalty grows")
    if rl.overlong_penalty > 0 and cfg.generation.max_turns > 1:
        raise ConfigError("rl.overlong_penalty shapes the reward of one answer by its length: "
                          "set generation.max_turns to 1, or rl.overlong_penalty to 0")


def check_distill(cfg: Config, kinds: set[str]) -> None:
    """distill: MLX only, a teacher named for kind teacher, a context to read for kind self."""
    d = cfg.distill
    if d.kind != "off" and cfg.model.backend == "torch":
        raise ConfigError(f"distill.kind {d.kind} is MLX-only (the teacher's and the policy's "
                          "forward over the student's tokens): with model.backend torch set "
                          "distill.kind to off")
    if d.kind == "teacher" and not d.teacher:
        raise ConfigError("distill.kind teacher needs a teacher model: set distill.teacher to a "
                          "directory or hub id mlx-lm loads")
    if d.kind == "self" and not ({"exec", "teacher"} & kinds):
        raise ConfigError("distill.kind self places the exec feedback or a judge's critique in "
                          "the student's context, and the reward has neither: set reward.type "
                          "to exec, teacher or mix")


def check_length(t: Any) -> None:
    """A cosine schedule needs the run's step count as its horizon: a run bounded by
    training.max_minutes alone has none (train/length.py)."""
    if t.lr_schedule == "cosine" and t.max_minutes and not (t.max_steps or t.num_epochs):
        raise ConfigError("training.lr_schedule = cosine needs a step count for its horizon, "
                          "which training.max_minutes alone does not give: set "
                          "training.max_steps (or training.num_epochs) too, or use "
                          "lr_schedule constant")
