"""The distillation targets of a step (`distill.kind` teacher or self): the target log-probs of
every completion's tokens, the per-token terms they make (algo/distill.py) and the metrics.

- teacher: the local teacher model (backends/mlx/teacher.py, loaded once beside the student)
  scores the student's prompt + completion; every completion gets a term.
- self: the student scores its own attempt with the feedback the run already has placed in
  the prompt (`context`): the exec report of its failed tests (`rewards/exec/feedback.py`:
  built by trusted code from the verdict's data, never the student's output), a teacher
  judge's rationale, and a completion of the same group that passed every test. The scorer is
  the live policy (`distill.self_adapters: policy`) or the KL reference (`reference`). A
  completion with no context, or one that passed without a passing sibling, gets no term.

Metrics: distill/kl and distill/kl_p90 (the per-token reverse KL to the target, over the
tokens that have one: this rank's), distill/seconds (the target pass), distill/frac_context
(self: the share of completions that had a context).

Not covered: the torch backend (config.check refuses it); context longer than the model's
window (the prompt is not cut); the memory plan counts self-distillation's pass as a reference
pass over the task's prompt, not the longer prompt with context (its phase limit, made from
the rollouts at hand, does see it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..algo import distill as algo
from ..records import Reward, Rollout, Task
from ..rewards.exec.feedback import feedback_text
from .multiturn import all_passed, hidden_tasks
from .run import Run


@dataclass(frozen=True)
class Terms:
    """Per rollout, its distillation term [len(tokens)] (None: no term), and the metrics."""

    per_token: list[np.ndarray | None]
    metrics: dict[str, float]


def terms(run: Run, rollouts: list[Rollout], rewards: list[Reward], keys: Sequence[str]
          ) -> Terms | None:
    """The step's distillation terms (None where distill.kind is off)."""
    d = run.cfg.distill
    if d.kind == "off":
        return None
    tic = time.perf_counter()
    extra: dict[str, float] = {}
    if d.kind == "teacher":
        scored = list(range(len(rollouts)))
        target = target_teacher(run, rollouts)
    else:
        gen = run.cfg.generation
        tasks = hidden_tasks(rollouts, gen.visible_tests) if gen.max_turns > 1 \
            else [r.task for r in rollouts]  # the tests the final reward ran
        texts = contexts(rollouts, rewards, tasks, keys, d.self_context, gen.feedback_chars)
        scored = [i for i, t in enumerate(texts) if t]
        extra["distill/frac_context"] = len(scored) / max(len(rollouts), 1)
        moved = [with_context(run, rollouts[i], texts[i]) for i in scored]
        target = target_self(run, moved) if moved else []
    per_token: list[np.ndarray | None] = [None] * len(rollouts)
    for i, t in zip(scored, target, strict=True):
        r = rollouts[i]
        per_token[i] = algo.token_terms(t, np.asarray(r.logprobs), r.mask, d.coef, d.clip)
    k = algo.reverse_kl(target, [rollouts[i].logprobs for i in scored],
                        [rollouts[i].mask for i in scored])
    metrics = {**algo.kl_metrics(k), **extra,
               "distill/seconds": time.perf_counter() - tic}
    return Terms(per_token, metrics)


def load_teacher(cfg: Any, policy: Any) -> Any:
    """The teacher of distill.kind teacher, loaded once beside `policy` (None otherwise); its
    weights planned from its files first against the memory budget less the student's weights
    (a teacher over it, or whose config disagrees with its weights, stops here in one line)."""
    if cfg.distill.kind != "teacher":
        return None
    from ..backends.mlx import memory
    from ..backends.mlx.teacher import load_teacher as load
    from ..backends.mlx.teacher import weight_bytes

    budget, _ = memory.device_budget(cfg.training.max_memory_gb)
    return load(cfg.distill.teacher, policy.tokenizer, cfg.model.path,
                cfg.distill.teacher_quantize, cfg.model.trust_remote_code,
                room=budget - weight_bytes(policy.model))


def target_teacher(run: Run, rollouts: list[Rollout]) -> list[np.ndarray]:
    from ..backends.mlx.teacher import teacher_logprobs

    return teacher_logprobs(run.teacher, rollouts, run.cfg)


def target_self(run: Run, rollouts: list[Rollout]) -> list[np.ndarray]:
    """The student's log-probs of its own tokens after the prompt with context: the live
    policy's, or the KL reference's (distill.self_adapters)."""
    if run.cfg.distill.self_adapters == "reference":
        return run.ops.reference(run.policy, rollouts, run.cfg)
    return run.ops.logprobs(run.policy, rollouts, run.cfg)


def with_context(run: Run, r: Rollout, text: str) -> Rollout:
    """`r` with its prompt replaced by the task's prompt followed by `text`, formatted as the
    run formats prompts (the completion's tokens unchanged)."""
    task = replace(r.task, prompt=f"{r.task.prompt}\n\n{text}")
    return replace(r, prompt_tokens=tuple(run.format(task)))


def exec_details(reward: Reward) -> Mapping[str, Any] | None:
    """The exec reward's details in `reward` (its own, or a mix's exec part's)."""
    if "tests" in reward.details:
        return reward.details
    found = [v for v in reward.details.values() if isinstance(v, Mapping) and "tests" in v]
    return found[0] if found else None


def passed(reward: Reward) -> bool:
    details = exec_details(reward)
    return details is not None and reward.value is not None and \
        all_passed(Reward(reward.value, details=details))


def critique(reward: Reward) -> str:
    """A teacher judge's rationale ('' for none)."""
    if isinstance(reward.details.get("rationale"), str):
        return reward.details["rationale"]
    found = [v["rationale"] for v in reward.details.values()
             if isinstance(v, Mapping) and isinstance(v.get("rationale"), str)]
    return found[0] if found else ""


def contexts(rollouts: list[Rollout], rewards: list[Reward], tasks: Sequence[Task],
             keys: Sequence[str], use: Sequence[str], feedback_chars: int) -> list[str]:
    """The context text of each rollout ('': no term): the parts `use` names that exist;
    `tasks` those the rewards ran (with several turns, the hidden tests)."""
    passing: dict[str, list[int]] = {}
    for i, (k, rw) in enumerate(zip(keys, rewards, strict=True)):
        if passed(rw):
            passing.setdefault(k, []).append(i)
    out = []
    for i, (task, rw, k) in enumerate(zip(tasks, rewards, keys, strict=True)):
        sibling = next((rollouts[j].text for j in passing.get(k, []) if j != i), "")
        out.append(context(task, rw, sibling if "sibling" in use else "",
                           "feedback" in use, "critique" in use, feedback_chars))
    return out


def context(task: Task, reward: Reward, sibling: str, feedback: bool, judge: bool,
            feedback_chars: int) -> str:
    """The text placed after the prompt: the failed tests' report, a judge's critique, a
    passing sibling; '' where the completion passed and has no sibling, or nothing applies."""
    ok = passed(reward)
    if ok and not sibling:
        return ""
    parts = []
    details = exec_details(reward)
    if feedback and not ok and details is not None and details.get("tests"):
        report = feedback_text(task, Reward(reward.value, details=details), feedback_chars)
        parts.append(f"An earlier attempt was run on the tests.\n{report}")
    if judge and (text := critique(reward)):
        parts.append(f"A reviewer's critique of an earlier attempt:\n{text}")
    if sibling:
        parts.append(f"A correct solution:\n{sibling}")
    if not parts:
        return ""
    return "\n\n".join(parts) + "\n\nNow answer the task."
