"""Off-policy guidance (LUFFY: Yan et al. 2025, "Learning to Reason under Off-Policy Guidance"):
a group none of whose completions does as well as the task's reference solution gets that
solution as one of its completions, so a task the model never solves still teaches something.

With `rl.guidance`, after a batch is sampled and scored, each task with a reference solution
(its record's `solution` field: the shipped suites and the converted sets carry one) has that
answer scored by the run's own reward; a group whose every completion scores below it has its
last completion replaced by the reference answer (the completions of a group are drawn
independently, so which one makes way does not matter). The group then has signal, and the
group baseline pushes the policy toward the reference and away from its own failures, in the
same clipped policy-gradient update as everything else. The replacement's log-probs are the
live policy's at the sampling temperature (`ops.logprobs`), so its importance ratio starts
at 1: a policy-gradient term on a sequence the sampler did not draw, as LUFFY's off-policy
term is, without its policy shaping. A reference answer longer than
`generation.max_new_tokens` is not used (the sampler could never have written it).

The reference answer is written as the model is asked to answer (`reference_answer`). Where the
prompt is code to complete, the student writes what follows it (the exec reward puts the prompt
before a body), so the answer is the solution's continuation of the prompt: what follows the
whole prompt where the solution contains it (a converted HumanEval record stores `solution =
prompt + canonical_solution`), else what follows the prompt's last `def` line where the
solution repeats that signature (the shipped suites: signature and body, no docstring); never
the re-emitted signature and docstring. Otherwise (an instruction prompt) the solution fenced
in the task's language.

Scoring the reference answers costs one reward call per group: a sandbox run with the exec
reward, a judge call with a teacher.

Not covered: several answers of one conversation (refused by config.check with
generation.max_turns above 1), guidance from a teacher's own answer (`teacher_code`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..records import Reward, Rollout, Task
from .draws import draw_indices


def reference_answer(task: Task) -> str | None:
    """The task's reference solution as the model is asked to write it, or None without one."""
    solution = task.meta.get("solution")
    if not isinstance(solution, str) or not solution.strip():
        return None
    rest = continuation(task.prompt, solution)
    if rest is not None:
        return rest
    return f"```{task.language}\n{solution.rstrip()}\n```"


def continuation(prompt: str, solution: str) -> str | None:
    """What `solution` writes after the code of `prompt`: after the whole prompt where the
    solution holds it from a line start, else after the prompt's last `def` line (its stub's
    signature) where the solution holds that line, provided what follows is an indented body;
    None where neither (the prompt is not code the solution continues)."""
    stub = prompt.strip("\n")
    at = _line_start_find(solution, stub) if stub.strip() else -1
    if at >= 0:
        return _body(solution[at + len(stub):])
    signature = next((line for line in reversed(prompt.splitlines())
                      if line.lstrip().startswith(("def ", "async def "))), None)
    if signature is None:
        return None
    lines = solution.splitlines()
    found = [i for i, line in enumerate(lines) if line.rstrip() == signature.rstrip()]
    return _body("\n".join(lines[found[-1] + 1:])) if found else None


def _line_start_find(text: str, part: str) -> int:
    """Where `part` first occurs in `text` at the start of a line, or -1."""
    at = text.find(part)
    while at > 0 and text[at - 1] != "\n":
        at = text.find(part, at + 1)
    return at


def _body(rest: str) -> str | None:
    """`rest` without the line break that ends the prompt, when it is an indented body."""
    rest = rest.rstrip().lstrip("\n")
    return rest if rest.strip() and rest[0] in " \t" else None


def to_replace(group_values: list[list[float | None]], reference_values: list[float | None]
               ) -> list[bool]:
    """Per group: whether every completion scored below the reference answer (a completion that
    could not be scored counts as below; a reference that could not be scored guides nothing)."""
    return [ref is not None and all(v is None or v < ref for v in values)
            for values, ref in zip(group_values, reference_values, strict=True)]


def reference_rollout(task: Task, prompt_tokens: list[int], answer: str, tokenizer: Any,
                      temperature: float) -> Rollout:
    """A rollout of `answer` ending with the EOS token the sampler stops at; its log-probs are
    filled in by the caller (the live policy's)."""
    tokens = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
    return Rollout(task=task, prompt_tokens=tuple(prompt_tokens), tokens=tuple(tokens),
                   logprobs=(0.0,) * len(tokens), text=answer, finish_reason="stop",
                   temperature=temperature)


def reference_scores(reward_fn: Any, tasks: list[Task], answers: list[str]) -> list[Reward]:
    """The reward of each reference answer, scored once per task (a task drawn twice in the
    batch has the same answer in both groups)."""
    first: dict[str, int] = {}
    unique = [i for i, t in enumerate(tasks) if first.setdefault(t.id, i) == i]
    scored = reward_fn.score([tasks[i] for i in unique], [answers[i] for i in unique])
    by_task = {tasks[i].id: w for i, w in zip(unique, scored, strict=True)}
    return [by_task[t.id] for t in tasks]


def guide(run: Any, rollouts: list[Rollout], rewards: list[Reward]
          ) -> tuple[list[Rollout], list[Reward], int]:
    """`rollouts` and `rewards` (prompt-major: each draw's completions together) with the
    reference answer in place of the last completion of each group that scored below it, a
    group being one draw (draws.py: a task drawn twice is two groups) (train.run.Run `run`: its
    reward, policy, prompt format and backend); returns them and the number of groups
    guided."""
    cfg = run.cfg
    groups = draw_indices([r.task.id for r in rollouts], cfg.generation.num_samples_per_prompt)
    tasks = [rollouts[idx[0]].task for idx in groups]
    answers = [reference_answer(t) for t in tasks]
    tokenizer = run.policy.tokenizer
    built = [None if a is None else reference_rollout(t, run.format(t), a, tokenizer,
                                                      cfg.generation.temperature)
             for t, a in zip(tasks, answers, strict=True)]
    usable = [i for i, b in enumerate(built)
              if b is not None and len(b.tokens) <= cfg.generation.max_new_tokens]
    if not usable:
        return rollouts, rewards, 0
    scored = reference_scores(run.reward_fn, [tasks[i] for i in usable],
                              [answers[i] for i in usable])
    chosen = [i for i, yes in zip(usable, to_replace(
        [[rewards[j].value for j in groups[i]] for i in usable], [w.value for w in scored]),
        strict=True) if yes]
    if not chosen:
        return rollouts, rewards, 0
    by_group = dict(zip(usable, scored, strict=True))
    fresh = [built[i] for i in chosen]
    logps = run.ops.logprobs(run.policy, fresh, cfg)
    rollouts, rewards = list(rollouts), list(rewards)
    for i, r, lp in zip(chosen, fresh, logps, strict=True):
        j = groups[i][-1]
        rollouts[j] = replace(r, logprobs=tuple(float(x) for x in np.asarray(lp)))
        w = by_group[i]
        rewards[j] = replace(w, reason=f"reference solution (rl.guidance); {w.reason}".rstrip("; "),
                             details={**w.details, "guidance": True})
    return rollouts, rewards, len(chosen)
