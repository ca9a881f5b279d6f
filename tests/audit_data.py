"""A small file of completions with tests for the judge audit: eight easy Python tasks of the
shipped synthetic eval suite, each with two passing and two failing completions (a whole
function and a body fragment of each), built from the suite's reference solutions."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from mlx_rlaif.data import read_jsonl

SUITE = Path(__file__).resolve().parent.parent / "mlx_rlaif/data/suites/synthetic-eval.jsonl"


def _return_expr(solution: str) -> str | None:
    fn = ast.parse(solution).body[0]
    if len(fn.body) != 1 or not isinstance(fn.body[0], ast.Return) or fn.body[0].value is None:
        return None
    return ast.get_source_segment(solution, fn.body[0].value)


def records(n_tasks: int = 8) -> list[dict]:
    """Task records with a `completion`: per task, pass/pass/fail/fail."""
    out = []
    for _, rec in read_jsonl(SUITE):
        if rec.get("language") != "python" or rec.get("difficulty") != "easy":
            continue
        expr = _return_expr(rec["solution"])
        if expr is None:
            continue
        head = rec["solution"].splitlines()[0]
        task = {k: v for k, v in rec.items() if k != "solution"}
        completions = [
            f"```python\n{head}\n    result = {expr}\n    return result\n```",
            f"    total = {expr}\n    return total\n",
            f"```python\n{head}\n    result = ({expr})\n    return [result]\n```",
            f"    total = ({expr})\n    return total + 1\n",
        ]
        out += [{**task, "completion": c} for c in completions]
        if len(out) >= 4 * n_tasks:
            break
    return out


def write(path: Path, n_tasks: int = 8) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records(n_tasks)))
    return path
