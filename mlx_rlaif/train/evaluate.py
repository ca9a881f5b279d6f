"""Evaluation: sample n completions per task, score them, report pass@k.

pass@k uses the unbiased estimator of Chen et al. (2021): 1 - C(n - c, k) / C(n, k) per task,
averaged over tasks, where c of the n samples passed every test. A sample passes when its reward
says all tests passed (`details["all_passed"]`, or the `tests` part equal to 1).

Not covered: pass@k for k > n (undefined), tasks without tests (they count as not passed and
only their mean reward is meaningful).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.ops import Sample
from ..backends.sampling import SamplingParams, prompt_formatter
from ..records import Reward, Rollout, Task
from ..rewards import signals as hacks
from ..rewards.base import RewardFn
from .multiturn import hidden_tasks, responder


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with c correct out of n samples."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def passed(reward: Reward) -> bool:
    if "all_passed" in reward.details:
        return bool(reward.details["all_passed"])
    return reward.parts.get("tests") == 1.0


def evaluate_tasks(sample: Sample, policy: Any, tasks: Sequence[Task], reward_fn: RewardFn,
                   cfg: Any, n: int = 1, ks: Sequence[int] = (1,), seed: int = 0,
                   temperature: float | None = None, batch_size: int = 8,
                   out: str | Path | None = None,
                   on_scored: Callable[[list[Rollout], list[Reward]], None] | None = None,
                   turns: int = 1, converse: Callable[..., Any] | None = None,
                   hidden_tests: bool = False) -> dict[str, Any]:
    """Score n samples of every task, drawn by the backend's `sample` (`backends.ops.Ops`);
    returns pass@k, mean reward, tokens/s and per-task rows. `on_scored(rollouts, rewards)` sees
    each scored chunk (the trainer keeps them as dataset records). With `turns` > 1 each sample
    is a conversation (the backend's `converse`, the exec reward's feedback between answers):
    its last answer and its first one are both scored on the hidden tests, pass@1 after turn K
    and `pass@1_turn1`. `hidden_tests` scores single answers on those hidden tests too (the
    single-turn baseline of a multi-turn evaluation)."""
    params = SamplingParams.from_config(cfg.generation)
    if temperature is not None:
        params = replace(params, temperature=temperature)
    fmt = prompt_formatter(policy.tokenizer, cfg.model)
    rows, tokens, seconds = [], 0.0, 0.0
    for start in range(0, len(tasks), batch_size):
        chunk = list(tasks[start: start + batch_size])
        first_seed = seed if start == 0 else None
        if turns > 1:
            respond = responder(reward_fn, policy.tokenizer, cfg.generation,
                                cfg.model.chat_template)
            rollouts, stats = converse(policy, chunk, params, n, fmt, first_seed, turns, respond)
        else:
            rollouts, stats = sample(policy, chunk, params, n, fmt, first_seed)
        tokens += stats["gen/tokens"]
        seconds += stats["gen/seconds"]
        hidden = (hidden_tasks(rollouts, cfg.generation.visible_tests)
                  if turns > 1 or hidden_tests else [r.task for r in rollouts])
        rewards = reward_fn.score(hidden, [r.text for r in rollouts])
        firsts = (reward_fn.score(hidden, [r.turns[0].text for r in rollouts]) if turns > 1
                  else None)
        if on_scored is not None:
            on_scored(rollouts, rewards)
        for p, task in enumerate(chunk):
            part = slice(p * n, (p + 1) * n)
            group = list(zip(rollouts[part], rewards[part], strict=True))
            rows.append(_row(task, group, firsts[part] if firsts else None))
    result = summarize(rows, n, ks)
    result["gen_tokens_per_sec"] = tokens / seconds if seconds else 0.0
    result["gen_tokens"] = tokens
    result["temperature"] = params.temperature
    if out is not None:
        _write_rows(Path(out), rows)
    result["tasks"] = rows
    return result


def _row(task: Task, group: list, firsts: list[Reward] | None = None) -> dict[str, Any]:
    vals = [rw.value for _, rw in group]
    row = {
        "id": task.id, "language": task.language, "difficulty": task.difficulty,
        "n": len(group), "correct": sum(passed(rw) for _, rw in group),
        "rewards": vals, "passed": [passed(rw) for _, rw in group],
        "completions": [r.text for r, _ in group],
        "reasons": [rw.reason for _, rw in group],
        "signals": [{s["name"]: s["reason"] for s in hacks.of(rw)} for _, rw in group],
    }
    if firsts is not None:
        row["correct_turn1"] = sum(passed(rw) for rw in firsts)
        row["turns"] = [len(r.turns) for r, _ in group]
    return row


def summarize(rows: list[dict], n: int, ks: Sequence[int]) -> dict[str, Any]:
    res: dict[str, Any] = {"n_tasks": len(rows), "samples_per_task": n}
    for k in ks:
        if k <= n:
            res[f"pass@{k}"] = float(np.mean([pass_at_k(r["n"], r["correct"], k) for r in rows]))
    vals = [v for r in rows for v in r["rewards"] if v is not None]
    res["reward_mean"] = float(np.mean(vals)) if vals else float("nan")
    res["hacking"] = hacks.tally((r["id"], found) for r in rows for found in r.get("signals", []))
    res["hack_frac"] = res["hacking"]["flagged"] / max(res["hacking"]["completions"], 1)
    if rows and "correct_turn1" in rows[0]:
        res["pass@1_turn1"] = float(np.mean([pass_at_k(r["n"], r["correct_turn1"], 1)
                                             for r in rows]))
        res["turns_mean"] = float(np.mean([t for r in rows for t in r["turns"]]))
    return res


def _write_rows(path: Path, rows: list[dict]) -> None:
    from ..artifacts.atomic import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
