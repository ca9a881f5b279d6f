"""A task drawn twice in one step is two groups (design.md: groups are keyed by prompt, never
by task id alone): two baselines, two entries in dynamic sampling's group count, two reference
answers with rl.guidance, a judge's call per draw, every completion seen by the curriculum.
One step (`rl_step`) on a scripted sampler and reward: no model, the update recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mlx_rlaif.artifacts.checkpoint import LoopState
from mlx_rlaif.config import load
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.train.run import Run
from mlx_rlaif.train.step import rl_step

TASK = Task("A", "def f():\n", meta={"solution": "def f():\n    return 1\n"})
REFERENCE = "    return 1"


class Ops:
    """The backend's side of a step: completions from a script of texts per draw, the update
    recorded (the kept rollouts and their advantages)."""

    def __init__(self, script: Iterator[list[str]]) -> None:
        self.script, self.updates = script, []

    def sample(self, policy, tasks, params, G, fmt, seed, on_group=None):
        out = []
        for t in tasks:
            group = [Rollout(t, (1, 2), (5, 6), (-1.0, -1.0), text, "stop", 1.0)
                     for text in next(self.script)]
            assert len(group) == G
            out += group
            if on_group is not None:
                on_group(group)
        return out, {"gen/tokens": 2.0 * len(out), "gen/seconds": 1.0,
                     "gen/tokens_per_sec": 2.0 * len(out), "gen/decode_width": float(len(out)),
                     "gen/decode_width_mean": float(len(out))}

    def update(self, policy, optimizer, kept, adv, ref, cfg, kl_penalty, critic, shard=None):
        self.updates.append(([r.text for r in kept], [float(a) for a in adv]))
        return {"loss/total": 0.0}, 0

    def advance_reference(self, policy, cfg, step):
        pass

    def logprobs(self, policy, rollouts, cfg):
        return [np.full(len(r.tokens), -1.0) for r in rollouts]


class Scores:
    """pass / the reference answer: 1, anything else 0; every call's task ids recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, tasks, texts):
        self.calls.append([t.id for t in tasks])
        return [Reward(1.0 if x in ("pass", REFERENCE) else 0.0) for x in texts]

    def metrics(self):
        return {}


def _run(script: list[list[str]], *sets: str) -> Run:
    cfg = load(None, ["generation.num_samples_per_prompt=2", "training.batch_size=2",
                      "rl.kl_penalty=0", "generation.score_while_decoding=false", *sets])
    tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens=False: [7] * 3,
                                eos_token_id=2)
    return Run(cfg, Ops(iter(script)), SimpleNamespace(tokenizer=tokenizer), None, Scores(),
               Path("."), LoopState(), lambda task: [1, 2])


def test_draw_indices_by_hand():
    from mlx_rlaif.train.draws import draw_indices

    assert draw_indices(["a", "a", "a", "a", "b", "b", "a"], 2) == [[0, 1], [2, 3], [4, 5], [6]]
    assert draw_indices(["a", "b", "a"], 4) == [[0], [1], [2]]


def test_a_task_drawn_twice_is_two_groups():
    """Draw 1 all pass, draw 2 all fail: two zero-variance groups, nothing to train on (merged,
    they made one group of 2G with advantages +-1). The curriculum still sees all 2G
    completions, and each draw is scored in its own call."""
    run = _run([["pass", "pass"], ["fail", "fail"]])
    seen = []
    metrics, records = rl_step(run, lambda n, across=False: [TASK] * n,
                               lambda rs, ws: seen.extend(w.value for w in ws))
    assert metrics["reward/frac_zero_std"] == 1.0 and metrics["train/sequences"] == 0
    assert run.ops.updates == [([], [])]
    assert sorted(seen) == [0.0, 0.0, 1.0, 1.0] and len(records) == 4
    assert run.reward_fn.calls == [["A", "A"], ["A", "A"]]


def test_guidance_takes_a_place_in_each_draw():
    """Both draws fail: each gets the reference answer (one group, before: one of them), the
    reference scored once."""
    run = _run([["fail", "fail"], ["fail", "fail"]], "rl.guidance=true",
               "generation.max_new_tokens=8")
    metrics, _ = rl_step(run, lambda n, across=False: [TASK] * n)
    assert metrics["sample/guided"] == 2
    texts, adv = run.ops.updates[0]
    assert texts == ["fail", REFERENCE, "fail", REFERENCE]
    np.testing.assert_allclose(adv, [-1, 1, -1, 1], atol=1e-5)
    assert run.reward_fn.calls[-1] == ["A"]  # the reference answer's score, once


def test_dynamic_sampling_counts_each_draw():
    """Two groups needed; the first round draws 3 prompts, all the same task, each with
    signal: two are used (2 x G sequences, not 3 x G as one merged group), one carried."""
    run = _run([["pass", "fail"]] * 6, "rl.dynamic_sampling=true")
    metrics, _ = rl_step(run, lambda n, across=False: [TASK] * n)
    assert metrics["sample/groups_kept"] == 2 and metrics["sample/rounds"] == 1
    assert metrics["train/sequences"] == 4
    texts, adv = run.ops.updates[0]
    np.testing.assert_allclose(adv, [1, -1, 1, -1], atol=1e-5)
    assert len(run.carry) == 1 and len(run.carry[0].rollouts) == 2


@pytest.mark.parametrize("sets", [(), ("rl.advantage=rloo",)])
def test_baselines_are_per_draw(sets):
    """Draw 1 [1, 0], draw 2 [1, 1]: draw 1 alone has a baseline of 0.5; draw 2 none."""
    run = _run([["pass", "fail"], ["pass", "pass"]], "rl.scale=none", *sets)
    metrics, _ = rl_step(run, lambda n, across=False: [TASK] * n)
    texts, adv = run.ops.updates[0]
    assert texts == ["pass", "fail"] and metrics["reward/frac_zero_std"] == 0.5
    np.testing.assert_allclose(adv, [0.5, -0.5] if not sets else [1.0, -1.0])
