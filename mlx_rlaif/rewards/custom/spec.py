"""Load a user's reward function from `path/to/file.py:function` or `package.module:function`
and check its signature against what the contract can give it.

What is covered: a missing file, module or attribute, an object that is not callable, a
parameter nothing would fill (not a name of the contract, not in the component's kwargs, not a
field of the tasks' records, and without a default), positional-only and `*args` parameters,
and `group: true` on a function that takes no lists: each one `ConfigError` line naming the
function and the fix. A function whose parameters include a plural name of the contract
(`completions`, `prompts`, ...) takes lists (a batch, or a group with `group: true`); else it is
called once per completion.

Not covered: type annotations (not checked), functions defined in `__main__`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError

# the names the contract fills, per completion and as lists (contract.py)
# (query and label as OpenRLHF names them: its reward_func(queries, prompts, labels) runs as is)
PLURALS = {"prompt": "prompts", "completion": "completions", "code": "codes", "task": "tasks",
           "record": "records", "task_id": "task_ids", "language": "languages",
           "exec_result": "exec_results", "query": "queries", "label": "labels"}
SINGULAR = tuple(PLURALS)
PLURAL = tuple(PLURALS.values())
SHARED = ("step",)


@dataclass(frozen=True)
class Loaded:
    """A loaded function: its spec, the object, its parameter names, whether it takes lists
    (`batched`), whether it is `async def`, whether it takes `**kwargs`, and the parameters
    that have defaults."""

    spec: str
    fn: Callable[..., Any]
    params: tuple[str, ...]
    batched: bool
    is_async: bool
    var_kw: bool
    optional: frozenset[str]


def load_function(spec: str, kwargs: dict | None = None, fields: Iterable[str] | None = None,
                  group: bool = False) -> Loaded:
    """The function `spec` names, its signature checked; `fields`: the keys of the tasks'
    records (None: not known, not checked)."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ConfigError(f"reward function {spec!r}: write path/to/file.py:function or "
                          "package.module:function")
    module = _module(spec, target)
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(f"reward function {spec}: {target} has no attribute {part!r}: "
                              "check the name after the colon")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(f"reward function {spec}: {attr} is a {type(fn).__name__}, not a "
                          "function")
    return check_signature(spec, fn, kwargs or {}, fields, group)


def _module(spec: str, target: str) -> Any:
    """The module of a spec: a .py file (loaded under a private name) or an importable
    module; ConfigError names what is missing."""
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"reward function {spec}: file {target} not found: give the "
                                  "path of a .py file (relative to where you run mlx-rlaif)")
            name = f"_mlx_rlaif_reward_{abs(hash(str(path)))}"
            if name in sys.modules:
                return sys.modules[name]
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return module
        return importlib.import_module(target)
    except ConfigError:
        raise
    except ModuleNotFoundError as e:
        raise ConfigError(f"reward function {spec}: module {e.name or target} not found: check "
                          "the module path, or give a file path ending in .py") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed to import: one line
        raise ConfigError(f"reward function {spec}: importing {target} failed: "
                          f"{type(e).__name__}: {e}") from None


def absolute(spec: str) -> str:
    """The spec with a file path made absolute (worker processes and resumed runs find it from
    anywhere)."""
    target, sep, attr = spec.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target):
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return spec


def check_signature(spec: str, fn: Callable[..., Any], kwargs: dict,
                    fields: Iterable[str] | None, group: bool) -> Loaded:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"reward function {spec}: its signature cannot be read: wrap it in a "
                          "def with named parameters") from None
    params, optional, var_kw = [], set(), False
    known = set(SINGULAR) | set(PLURAL) | set(SHARED) | set(kwargs) | set(fields or ())
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
            raise ConfigError(f"reward function {spec}: parameter {p.name} is positional-only: "
                              "arguments are passed by name (docs/rewards.md)")
        if p.default is not p.empty:
            optional.add(p.name)
        elif fields is not None and p.name not in known:
            raise ConfigError(
                f"reward function {spec}: nothing fills parameter {p.name!r}: use a name of the "
                f"contract ({', '.join(SINGULAR + SHARED)}, or the plural for lists), a field of "
                "the task records, a key of the component's kwargs, or give it a default")
        params.append(p.name)
    batched = any(p in PLURAL for p in params)
    mixed = [p for p in params if p in SINGULAR]
    if batched and mixed:
        lists = ", ".join(p for p in params if p in PLURAL)
        raise ConfigError(f"reward function {spec}: takes lists ({lists}) and single values "
                          f"({', '.join(mixed)}): use the plural names only")
    if group and not batched:
        raise ConfigError(f"reward function {spec}: group: true passes a prompt's completions "
                          "as lists: name its parameters completions, prompts, ... ")
    return Loaded(spec, fn, tuple(params), batched, inspect.iscoroutinefunction(fn), var_kw,
                  frozenset(optional))
