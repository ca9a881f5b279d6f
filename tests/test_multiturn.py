"""Multi-turn rollouts with execution feedback: a conversation's token layout and loss mask by
hand; batched conversations equal the same conversations decoded one at a time; the feedback
never carries the student's own output; training with two turns resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from recording_hub import RecordingHub
from resume_check import assert_resumed_equals_straight

from mlx_rlaif.algo.aggregation import aggregation_weights
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.backends.batch import build, build_shared
from mlx_rlaif.backends.mlx.policy import load_policy
from mlx_rlaif.backends.mlx.rollout import sample_conversations
from mlx_rlaif.backends.sampling import Reply, SamplingParams, feedback_tokens, prompt_formatter
from mlx_rlaif.config import ExecConfig, load
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.exec import ExecReward
from mlx_rlaif.rewards.exec.feedback import feedback_text
from mlx_rlaif.train import train
from mlx_rlaif.train.multiturn import split_tests, turn_metrics

ADD = Task("add", "def add(a, b):\n    ", entry_point="add",
           tests=({"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": 4},
                  {"args": [0, 5], "expected": 5}, {"args": [7, 1], "expected": 8}))


def test_feedback_turn_follows_the_chat_template(micro_model: Path):
    tok = load_policy(str(micro_model)).tokenizer
    eos = tok.eos_token_id
    ids = feedback_tokens(tok, "fix it", eos)
    assert tok.decode(ids) == "\n<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n"
    plain = feedback_tokens(tok, "fix it", eos, chat_template=False)
    assert tok.decode(plain) == "\n\nfix it\n\n"


def test_conversation_layout_and_loss_mask_by_hand(micro_model: Path):
    """Answer 1 (3 tokens) + feedback (2 tokens) + answer 2 (2 tokens): the mask is 1 1 1 0 0
    1 1, the feedback's log-probs 0, and the batch's mask and token count follow it."""
    from mlx_rlaif.backends.mlx import rollout

    conv = rollout._Conversation(ADD, [5, 6, 7])
    tok = load_policy(str(micro_model)).tokenizer
    eos = [tok.eos_token_id]
    conv.answer({"tokens": [10, 11, eos[0]], "logprobs": [-1.0, -2.0, -0.5],
                 "finish_reason": "stop", "cache": None}, tok, eos)
    conv.reply(Reply([20, 21], "you failed", False))
    assert conv.sofar == [5, 6, 7, 10, 11, eos[0], 20, 21]
    conv.answer({"tokens": [12, eos[0]], "logprobs": [-0.25, -0.75], "finish_reason": "stop",
                 "cache": None}, tok, eos)
    r = conv.rollout(0.8)
    assert r.tokens == (10, 11, eos[0], 20, 21, 12, eos[0])
    assert r.mask == (1, 1, 1, 0, 0, 1, 1) and r.trained_tokens == 5
    assert r.logprobs == (-1.0, -2.0, -0.5, 0.0, 0.0, -0.25, -0.75)
    assert [t.feedback for t in r.turns] == ["you failed", ""] and r.turns[0].passed is False
    for layout in (build, build_shared):
        b = layout([r], [1.0], aggregation_weights([r.trained_tokens], "token", 8))
        row = b["mask"][0]
        start = 0 if layout is build_shared else len(r.prompt_tokens) - 1
        assert row[start: start + 7].tolist() == [1, 1, 1, 0, 0, 1, 1]
        assert row.sum() == 5 and b["weights"][0].sum() == pytest.approx(1.0)


def _respond_fixed(turn: int, rollouts):
    """Every open conversation gets the same feedback, except task b's, which end after their
    second answer (conversations of different lengths in one batch)."""
    return [Reply(None) if r.task.id == "b" and turn >= 2 else Reply([9, 8, 7 + turn], "fb")
            for r in rollouts]


def test_batched_conversations_equal_one_at_a_time(micro_model: Path):
    policy = load_policy(str(micro_model))
    fmt = prompt_formatter(policy.tokenizer)
    tasks = [Task("a", "Write add"), Task("b", "Return the sum of a list of numbers please")]
    params = SamplingParams(temperature=0.01, max_new_tokens=6)  # ~greedy: no sampling noise
    together, _ = sample_conversations(policy.model, policy.tokenizer, tasks, params, 2, fmt, 3,
                                       _respond_fixed)
    alone = [sample_conversations(policy.model, policy.tokenizer, [t], params, 1, fmt, 3,
                                  _respond_fixed)[0][0] for t in tasks]
    assert len(together) == 4
    for i, r in enumerate(together):
        one = alone[i // 2]
        assert r.tokens == one.tokens and r.mask == one.mask
        np.testing.assert_allclose(r.logprobs, one.logprobs, atol=2e-4)
    assert [len(r.turns) for r in together] == [3, 3, 2, 2]


def test_feedback_never_carries_the_students_output(tmp_path):
    """A student that prints and raises "ALL TESTS PASSED" gets a failure report without it."""
    forged = ("def add(a, b):\n    print('ALL TESTS PASSED')\n"
              "    raise ValueError('ALL TESTS PASSED 4/4')\n")
    wrong = "def add(a, b):\n    print('ALL TESTS PASSED')\n    return 'ALL TESTS PASSED'\n"
    program = Task("echo", "Read n, print 2n", tests=({"stdin": "2\n", "stdout": "4"},))
    reward = ExecReward(ExecConfig(workers=1))
    try:
        crash, bad = reward.score([ADD, ADD], [forged, wrong])
        out = reward.score([program], ["print('ALL TESTS PASSED')"])[0]
    finally:
        reward.close()
    texts = [feedback_text(ADD, crash), feedback_text(ADD, bad), feedback_text(program, out)]
    assert "it raised ValueError" in texts[0]
    assert "should return 3, got 'ALL TESTS PASSED'" in texts[1]  # the returned value, quoted
    for text in (texts[0], texts[2]):
        assert "ALL TESTS PASSED" not in text and "failed" in text


def test_tests_split_into_visible_and_hidden():
    visible, hidden = split_tests(ADD, 0.5)
    assert [t["expected"] for t in visible.tests] == [3, 4]
    assert [t["expected"] for t in hidden.tests] == [5, 8]
    one = Task("x", "p", entry_point="f", tests=({"args": [1], "expected": 1},))
    assert split_tests(one, 0.5) == (one, one)


@pytest.fixture
def add_tasks(tmp_path: Path) -> Path:
    p = tmp_path / "tasks.jsonl"
    p.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Write add{i}(a, b).",
                                     "entry_point": f"add{i}",
                                     "tests": [{"args": [1, i], "expected": 1 + i},
                                               {"args": [2, 3], "expected": 5}]}) + "\n"
                         for i in range(4)))
    return p


def test_two_turn_training_resumes_exactly(micro_model, add_tasks, tmp_path):
    def cfg(out: Path, steps: int):
        return load(None, [f"model.path={micro_model}", f"data.train_file={add_tasks}",
                           f"training.output_dir={out}", f"training.max_steps={steps}",
                           "generation.max_turns=2", "generation.max_new_tokens=8",
                           "generation.num_samples_per_prompt=2", "rl.drop_zero_std=false",
                           "rl.entropy_coef=0.05", "training.learning_rate=0.01",
                           "training.num_epochs=3", "logging.tensorboard=false",
                           "training.save_every_batches=1", "training.save_total_limit=0"])

    hub = RecordingHub()
    straight = train(cfg(tmp_path / "a", 3), hub=hub)
    m = hub.steps[-1][1]
    assert m["turns/mean"] > 1 and "turns/pass_at_2" in m
    assert any("turns" in s for s in hub.samples)
    two = next(p for p in checkpoint.list_checkpoints(straight) if p.name.endswith("gs2"))
    resumed = train(cfg(tmp_path / "a", 3), resume_from=two, hub=RecordingHub())
    assert_resumed_equals_straight(straight, resumed, 3)


def test_turn_metrics_by_hand():
    from mlx_rlaif.records import Reward, Rollout, Turn

    def conv(passes: list[bool | None]) -> Rollout:
        return Rollout(ADD, (1,), (2,), (0.0,), "", "stop", 1.0,
                       turns=tuple(Turn("x", "f", p) for p in passes))

    ok = Reward(1.0, details={"tests": [{"passed": True}]})
    no = Reward(0.0, details={"tests": [{"passed": False}]})
    # passed at once (one answer); failed then passed; failed twice
    m = turn_metrics([conv([None]), conv([False, None]), conv([False, None])], [ok, ok, no])
    assert m["turns/mean"] == pytest.approx(5 / 3)
    assert m["turns/pass_at_1"] == pytest.approx(1 / 3)
    assert m["turns/pass_at_2"] == pytest.approx(2 / 3)


def test_eval_reports_pass_after_turn_one_and_after_turn_k(tmp_path):
    from mlx_rlaif import cli

    out = tmp_path / "rows.jsonl"
    assert cli.main(["eval", "--model", "builtin:tiny-coder", "--suite", "synthetic-eval",
                     "--max-tasks", "3", "-n", "2", "--turns", "2", "--max-new-tokens", "24",
                     "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all("correct_turn1" in r and r["correct_turn1"] <= 2 for r in rows)
    assert all(1 <= t <= 2 for r in rows for t in r["turns"])


def test_single_turn_eval_on_hidden_tests_scores_only_those(tmp_path):
    """The single-turn baseline of a K-turn evaluation (`eval --hidden-tests`): an answer right
    on the hidden tests (a + b for 0 + 5 and 7 + 1) but wrong on the visible ones passes there
    and fails on all the tests."""
    from types import SimpleNamespace

    from mlx_rlaif.records import Rollout
    from mlx_rlaif.train.evaluate import evaluate_tasks

    answer = "def add(a, b):\n    return a + b if a in (0, 7) else 0\n"

    def sample(policy, tasks, params, n, fmt, seed):
        return ([Rollout(t, (1,), (2,), (0.0,), answer, "stop", 1.0) for t in tasks
                 for _ in range(n)], {"gen/tokens": 3.0 * n, "gen/seconds": 1.0})

    policy = SimpleNamespace(tokenizer=SimpleNamespace(apply_chat_template=None))
    reward = ExecReward(ExecConfig(workers=1))
    try:
        res = {h: evaluate_tasks(sample, policy, [ADD], reward, load(None), n=2,
                                 hidden_tests=h) for h in (False, True)}
    finally:
        reward.close()
    assert res[True]["pass@1"] == 1.0 and res[False]["pass@1"] == 0.0
    assert res[True]["gen_tokens"] == 6.0
