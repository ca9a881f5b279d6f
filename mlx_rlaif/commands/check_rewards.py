"""`mlx-rlaif check-rewards`: run every component of the configured reward on a few tasks'
reference solutions and on a deliberately wrong answer, and print one table: the way to test a
reward (your function, a server, the exec reward's tests) before a long run. No model loads.

Tasks are the first `--tasks` (default 4) of `--file` (default the config's data.train_file)
that have a reference solution (their record's `solution`). The wrong answer is code that
defines the task's function (or program) and returns nothing useful. The last line says
whether the reward tells them apart: a task whose wrong answer scores at least as high as its
reference is named. Exit 1 when a component fails (the error line names it). Task ids and
component names reach the terminal through terminal.text / visible: no control characters, no
rich markup read from them.

Not covered: sampling from a model (that is `mlx-rlaif eval`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import DataError
from ..terminal import text, visible

HELP = "Try the reward's components on reference solutions and a wrong answer (a table)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (its reward and data.train_file)")
    p.add_argument("--file", help="tasks with a `solution` field: JSONL or suite:NAME "
                   "(default: data.train_file)")
    p.add_argument("--tasks", type=int, default=4, help="tasks to try (default 4)")
    p.add_argument("--reward", action="append", default=[], metavar="FILE.py:fn[@weight]",
                   help="add your reward function (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable)")


def wrong_answer(task: Any) -> str:
    """A deliberately wrong answer in the task's language, fenced."""
    if task.language == "python":
        body = (f"def {task.entry_point.rsplit('.', 1)[-1]}(*args, **kwargs):\n    return None"
                if task.entry_point and "." not in task.entry_point else "pass")
    elif task.language == "cpp":
        body = "int main() { return 0; }"
    else:
        body = "fn main() {}"
    return f"```{task.language}\n{body}\n```"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..config import check, load, reward_components, with_functions
    from ..data import load_tasks
    from ..rewards.build import build_reward
    from ..rewards.custom.contract import record_fields
    from ..train.guidance import reference_answer

    cfg = check(with_functions(load(args.config, list(args.set)), args.reward))
    spec = args.file or cfg.data.train_file
    tasks = [t for t in load_tasks(spec, cfg.data.languages) if reference_answer(t)]
    tasks = tasks[: max(1, args.tasks)]
    if not tasks:
        raise DataError(f"{spec}: no task with a reference solution (a `solution` field) to "
                        "check the reward on: pass --file with some")
    names = [c.name for c in reward_components(cfg.reward)]
    reward_fn = build_reward(cfg, None, languages={t.language for t in tasks},
                             fields=record_fields(tasks))
    pairs = [(t, kind, answer) for t in tasks
             for kind, answer in (("reference", reference_answer(t)), ("wrong", wrong_answer(t)))]
    try:
        rewards = reward_fn.score([t for t, _, _ in pairs], [a for _, _, a in pairs])
    finally:
        reward_fn.close()
    table = Table(title=text(f"reward components on {len(tasks)} tasks of {spec}"))
    for col in ("task", "answer", *names, "reward"):  # names, ids: rich reads no markup in them
        table.add_column(text(col), justify="left" if col in ("task", "answer") else "right")
    for (t, kind, _), w in zip(pairs, rewards, strict=True):
        parts = w.parts if len(names) > 1 else {names[0]: w.value}
        table.add_row(text(t.id), kind, *(_fmt(parts.get(n)) for n in names), _fmt(w.value))
    Console(file=sys.stdout, width=160).print(table)
    bad = [t.id for t, r, w in zip(tasks, rewards[0::2], rewards[1::2], strict=True)
           if r.value is not None and w.value is not None and w.value >= r.value]
    print(f"the wrong answer scores at least the reference on {len(bad)} of {len(tasks)} tasks"
          + (f": {visible(', '.join(bad), lines=False)}" if bad else ""))
    return 0


def _fmt(v: float | None) -> str:
    return "None" if v is None else f"{v:.3f}"
