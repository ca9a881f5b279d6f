"""`mlx-rlaif score`: score completions from a JSONL file with a reward; no model is loaded.

Each input line is a task record (the fields of a task line: `prompt`, `language`, `entry_point`,
`test`, `tests`, ...; `id` optional) plus `completion`. Each output line is the input plus
`reward` (a number, or null when the completion could not be scored), `parts`, `reason` and
`details`. The reward comes from the config (`reward.type`, default exec; `reward.components`,
`reward.functions`) or the flags: `--reward TYPE`, `--reward FILE.py:fn[@weight]` (your function
added as a component, repeatable; docs/rewards.md), and `--teacher/--base-url/--model`, which
only set `reward.type=teacher` and `reward.teacher.provider/base_url/model`. The output file is written whole or not at all. Teacher
answers are cached between runs (`reward.teacher.cache_path`, default the user cache
~/.cache/mlx-rlaif/teacher_cache.db; `--no-cache` turns it off): a user tuning a rubric pays
only for what changed. What it prints (component names, task ids, signal reasons) goes through
terminal.visible: one line each, control characters escaped.

Not covered: streaming files larger than memory (every line is scored in one batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import DataError, UsageError
from ..terminal import json_visible, visible

HELP = "Score completions (task record + completion per JSONL line) with the exec or a teacher reward."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", required=True, metavar="IN.jsonl",
                   help="Task records with a `completion` field, one JSON object per line.")
    p.add_argument("--out", default=None, metavar="OUT.jsonl",
                   help="Where to write the scored lines (default: standard output).")
    p.add_argument("--reward", action="append", default=[],
                   metavar="{exec,syntax,teacher,mix} | FILE.py:fn[@weight]",
                   help="Scorer (default: the config's reward.type, or teacher with --teacher); "
                   "FILE.py:fn[@weight] adds your function to it (repeatable; docs/rewards.md).")
    p.add_argument("--teacher", choices=("anthropic", "openai"), default=None,
                   help="Teacher API that grades the completions (key from the environment).")
    p.add_argument("--base-url", default=None, help="Base URL of an OpenAI-compatible teacher.")
    p.add_argument("--model", default=None, help="Teacher model name.")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML config to take the reward settings from.")
    p.add_argument("--no-cache", action="store_true",
                   help="Do not read or keep teacher answers in the user cache.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="Override a config value, e.g. --set reward.exec.timeout_s=10 (repeatable).")


TYPES = ("exec", "syntax", "teacher", "mix")


def reward_flags(values: list[str]) -> tuple[str | None, list[str]]:
    """(the reward.type a --reward names, the functions the others name)."""
    types = [v for v in values if v in TYPES]
    specs = [v for v in values if v not in TYPES]
    if len(types) > 1:
        raise UsageError(f"--reward {' and '.join(types)}: name one type (mix is exec + teacher)")
    for spec in specs:
        if ":" not in spec:
            raise UsageError(f"--reward {spec}: use {', '.join(TYPES)}, or FILE.py:fn[@weight] "
                             "for your function")
    return (types[0] if types else None), specs


def overrides(args: argparse.Namespace) -> list[str]:
    """The `--set` items the flags stand for, before the user's own `--set` items."""
    reward = reward_flags(args.reward)[0] or ("teacher" if args.teacher else None)
    if args.teacher and reward not in ("teacher", "mix"):
        raise UsageError(f"--teacher needs --reward teacher or mix, not {reward}")
    sets = [f"reward.type={reward}"] if reward else []
    for key, value in (("provider", args.teacher), ("base_url", args.base_url),
                       ("model", args.model)):
        if value:
            sets.append(f"reward.teacher.{key}={value}")
    return [*sets, *args.overrides]


def read_scoring_input(path: str) -> tuple[list[dict], list, list[str]]:
    """(records, tasks, completions) of a scoring file; DataError names file:line."""
    from ..data import read_jsonl, task_from_record

    records, tasks, completions = [], [], []
    for where, rec in read_jsonl(path):
        completion = rec.get("completion")
        if not isinstance(completion, str):
            raise DataError(f"{where}: missing 'completion' (the text to score, a string)")
        task_rec = {k: v for k, v in rec.items() if k != "completion"}
        records.append(rec)
        tasks.append(task_from_record(task_rec, where))
        completions.append(completion)
    if not records:
        raise DataError(f"{path}: no lines to score")
    return records, tasks, completions


def scored_line(rec: dict, reward: Any) -> str:
    out = {**rec, "reward": reward.value, "parts": dict(reward.parts), "reason": reward.reason,
           "details": dict(reward.details)}
    return json_visible(json.dumps(out, ensure_ascii=False, default=str))  # the same value


def write_atomic(path: str, lines: list[str]) -> None:
    """Write all lines to `path` whole or not at all (artifacts.atomic.write_text_atomic)."""
    from ..artifacts.atomic import write_text_atomic

    write_text_atomic(Path(path), "".join(line + "\n" for line in lines))


def with_user_cache(cfg: Any, off: bool) -> Any:
    """The config with the user cache as the teacher's cache where none is set."""
    from dataclasses import replace

    from ..rewards.teacher.cache import user_cache_path

    t = cfg.reward.teacher
    if off or t.cache_path:
        return cfg
    path = user_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace(cfg, reward=replace(cfg.reward, teacher=replace(t, cache_path=str(path))))


def run(args: argparse.Namespace) -> int:
    from ..config import check, load, reward_components, with_functions
    from ..rewards.build import build_reward
    from ..rewards.custom.contract import record_fields
    from ..rewards.signals import tally_line, tally_rewards

    cfg = with_functions(load(args.config, overrides(args)), reward_flags(args.reward)[1])
    cfg = with_user_cache(check(cfg), args.no_cache)
    records, tasks, completions = read_scoring_input(args.file)
    reward_fn = build_reward(cfg, None, languages={t.language for t in tasks},
                             fields=record_fields(tasks))
    try:
        rewards = reward_fn.score(tasks, completions)
    finally:
        reward_fn.close()
    lines = [scored_line(r, w) for r, w in zip(records, rewards, strict=True)]
    if args.out:
        write_atomic(args.out, lines)
    else:
        sys.stdout.writelines(line + "\n" for line in lines)
    scored = [w.value for w in rewards if w.value is not None]
    mean = f"{sum(scored) / len(scored):.4f}" if scored else "n/a"
    how = " + ".join(c.name for c in reward_components(cfg.reward)) \
        if cfg.reward.components or cfg.reward.functions else cfg.reward.type
    say = [f"scored {len(scored)}/{len(rewards)} completions with {how}: mean reward {mean}, "
           f"{len(rewards) - len(scored)} unscorable" + (f"; wrote {args.out}" if args.out else ""),
           tally_line(tally_rewards([t.id for t in tasks], rewards))]
    for line in say:  # component names, task ids, reasons: one visible line each
        print(visible(line, lines=False), file=sys.stderr)
    return 0
