"""Sample a student's completions of a task suite into a file for `mlx-rlaif audit-judge` (or
`score`): one line per completion, the task record plus `completion`.

Usage: python tools/sample_completions.py --model models/tiny-coder --suite synthetic-eval \
           --tasks 10 -n 4 --out audit.jsonl [--language python] [--difficulty easy]

Completions are drawn with the eval command's sampler (`evaluate_tasks`, temperature 0.7 by
default), so a file holds the student's own mix of passing and failing answers. Not covered:
suites without tests (the audit needs an exec verdict), adapters.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.ops import mlx_ops
from mlx_rlaif.config import load
from mlx_rlaif.data import load_tasks
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.build import build_reward
from mlx_rlaif.train.evaluate import evaluate_tasks


def record(task: Task) -> dict:
    rec = {"id": task.id, "prompt": task.prompt, "language": task.language,
           "entry_point": task.entry_point, "test": task.test, "tests": list(task.tests),
           "difficulty": task.difficulty}
    return {k: v for k, v in rec.items() if v not in (None, [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--suite", default="synthetic-eval")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("-n", type=int, default=4, help="completions per task")
    ap.add_argument("--language", default="python")
    ap.add_argument("--difficulty", default="easy")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    spec = args.suite if args.suite.endswith(".jsonl") else f"suite:{args.suite}"
    tasks = [t for t in load_tasks(spec, languages=[args.language])
             if not args.difficulty or t.difficulty == args.difficulty][: args.tasks]
    cfg = load(None, [])
    cfg = replace(cfg, generation=replace(cfg.generation, max_new_tokens=args.max_new_tokens))
    reward_fn = build_reward(cfg, languages={args.language})
    policy = load_policy(args.model, cfg.lora, None, args.seed)
    try:
        res = evaluate_tasks(mlx_ops().sample, policy, tasks, reward_fn, cfg, n=args.n,
                             seed=args.seed, temperature=args.temperature)
    finally:
        reward_fn.close()
    by_id = {t.id: t for t in tasks}
    lines = [json.dumps({**record(by_id[row["id"]]), "completion": c})
             for row in res["tasks"] for c in row["completions"]]
    Path(args.out).write_text("".join(line + "\n" for line in lines))
    print(f"wrote {len(lines)} completions of {len(tasks)} tasks to {args.out} "
          f"(pass@1 {res['pass@1']:.3f})")


if __name__ == "__main__":
    main()
