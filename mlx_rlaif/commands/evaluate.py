"""`mlx-rlaif eval`: pass@1 / pass@k of a model (optionally with adapters) on a task suite."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..config import check as check_config
from ..config import load, smoke_steps, with_functions
from ..config.loading import SMOKE_ENV, SMOKE_EVAL_TASKS
from ..errors import UsageError

HELP = "Evaluate a model (+ adapters) on a suite: pass@1, pass@k, tokens/s."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory or hub id")
    p.add_argument("--adapter", help="run directory or checkpoint with adapters")
    p.add_argument("--suite", required=True,
                   help="synthetic-eval, synthetic-train, humaneval, or a JSONL file")
    p.add_argument("-n", type=int, default=1, help="samples per task (pass@k for k <= n)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0.7 when n > 1, else 0.2)")
    p.add_argument("--max-tasks", type=int, default=0, help="evaluate at most N tasks")
    p.add_argument("--languages", type=_names, default=[],
                   help="only tasks in these languages, comma-separated (default: all)")
    p.add_argument("--difficulties", type=_names, default=[],
                   help="only tasks of these difficulties, comma-separated, e.g. medium,hard")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--out", help="per-task results JSONL (default: eval_results.jsonl)",
                   default="eval_results.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=1,
                   help="answers per conversation: after a failed answer the exec reward's "
                        "report on the visible tests is the next user turn; pass@1 is then "
                        "reported after turn 1 and after turn K, on the hidden tests")
    p.add_argument("--hidden-tests", action="store_true",
                   help="score on the hidden tests only (those --turns K keeps out of the "
                        "feedback): the single-turn pass@k to set beside --turns K")
    p.add_argument("--config", help="YAML config for generation/reward settings")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--reward", action="append", default=[], metavar="FILE.py:fn[@weight]",
                   help="add your reward function to the reward (repeatable; docs/rewards.md): "
                   "it joins the mean reward (pass@k stays the exec reward's tests)")


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def suite_spec(name: str) -> str:
    from pathlib import Path

    if name.endswith(".jsonl") or Path(name).exists():
        return name
    return f"suite:{name}"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..backends.mlx.policy import load_policy
    from ..backends.ops import mlx_ops
    from ..data import load_tasks
    from ..rewards.build import build_reward
    from ..rewards.custom.contract import record_fields
    from ..rewards.signals import tally_line
    from ..terminal import text, visible
    from ..train.evaluate import evaluate_tasks

    if args.n < 1 or args.turns < 1:
        raise UsageError("-n and --turns must be at least 1")
    cfg = load(args.config, list(args.set))
    if args.reward or cfg.reward.functions or cfg.reward.components:
        cfg = check_config(with_functions(cfg, args.reward))  # the components, complete, named
    if args.max_new_tokens:
        cfg = replace(cfg, generation=replace(cfg.generation, max_new_tokens=args.max_new_tokens))
    if cfg.reward.type == "teacher":
        raise UsageError("eval reports pass@k from tests: use reward.type exec (the default)")
    max_tasks = args.max_tasks
    if smoke_steps() and not 0 < max_tasks <= SMOKE_EVAL_TASKS:
        max_tasks = SMOKE_EVAL_TASKS
        print(f"{SMOKE_ENV}: at most {max_tasks} tasks", file=sys.stderr)
    tasks = load_tasks(suite_spec(args.suite), languages=args.languages, max_tasks=max_tasks,
                       difficulties=args.difficulties)
    reward_fn = build_reward(cfg, languages={t.language for t in tasks},
                             fields=record_fields(tasks))
    policy = load_policy(args.model, cfg.lora, args.adapter, args.seed)
    temp = args.temperature if args.temperature is not None else (0.7 if args.n > 1 else 0.2)
    ks = sorted({1, args.n} | {k for k in (5, 8, 10, 100) if k <= args.n})
    try:
        ops = mlx_ops()
        res = evaluate_tasks(ops.sample, policy, tasks, reward_fn, cfg, n=args.n, ks=ks,
                             seed=args.seed, temperature=temp, out=args.out, turns=args.turns,
                             converse=ops.converse, hidden_tests=args.hidden_tests)
    finally:
        reward_fn.close()
    table = Table(title=text(f"{args.suite}: {res['n_tasks']} tasks x {args.n} samples, "
                             f"T={temp}"))
    for col in ("metric", "value"):
        table.add_column(col)
    for k in ks:
        table.add_row(f"pass@{k}", f"{res[f'pass@{k}']:.3f}")
    if "pass@1_turn1" in res:
        table.add_row("pass@1 after turn 1", f"{res['pass@1_turn1']:.3f}")
        table.add_row(f"pass@1 after turn {args.turns}", f"{res['pass@1']:.3f}")
        table.add_row("answers per conversation", f"{res['turns_mean']:.2f}")
    table.add_row("mean reward", f"{res['reward_mean']:.3f}")
    table.add_row("generated tokens per task", f"{res['gen_tokens'] / res['n_tasks']:.1f}")
    table.add_row("generation tokens/s", f"{res['gen_tokens_per_sec']:.1f}")
    table.add_row("completions with a hacking signal", f"{res['hack_frac']:.2%}")
    Console().print(table)
    print(visible(tally_line(res["hacking"]), lines=False))  # task ids, reasons: one line
    print(visible(f"per-task results: {args.out}", lines=False))
    return 0
