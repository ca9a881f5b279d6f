"""pass@k against hand-computed numbers, and `mlx-rlaif eval` / exec-reward training end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from recording_hub import RecordingHub

from mlx_rlaif.config import load
from mlx_rlaif.records import Reward
from mlx_rlaif.train import train
from mlx_rlaif.train.evaluate import pass_at_k, passed, summarize


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),        # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 2, 0.7),        # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 0, 1, 0.0),
    (5, 4, 2, 1.0),        # n - c < k: some pair always holds a correct sample
    (10, 1, 5, 0.5),       # 1 - C(9,5)/C(10,5) = 1 - 126/252
])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_passed_and_summary():
    assert passed(Reward(1.0, {"builds": 1.0, "tests": 1.0}))
    assert not passed(Reward(0.9, {"builds": 1.0, "tests": 0.8}))
    assert not passed(Reward(None, {"tests": None}))
    rows = [{"n": 2, "correct": 1, "rewards": [1.0, 0.1]}, {"n": 2, "correct": 0,
                                                            "rewards": [None, 0.3]}]
    res = summarize(rows, 2, [1, 2])
    assert res["pass@1"] == pytest.approx(0.25) and res["pass@2"] == pytest.approx(0.5)
    assert res["reward_mean"] == pytest.approx((1.0 + 0.1 + 0.3) / 3)


def test_eval_command_writes_per_task_results(micro_model, tmp_path):
    out = tmp_path / "res.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "eval", "--model", str(micro_model),
         "--suite", "synthetic-eval", "--max-tasks", "3", "-n", "2", "--max-new-tokens", "8",
         "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pass@1" in proc.stdout and "pass@2" in proc.stdout and "tokens/s" in proc.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["n"] == 2 and len(r["rewards"]) == 2 for r in rows)
    # a random model does not solve them, but every sample was scored (no None)
    assert all(v is not None for r in rows for v in r["rewards"])


def test_training_with_the_exec_reward_on_the_shipped_suite(micro_model, tmp_path):
    hub = RecordingHub()
    cfg = load(None, [f"model.path={micro_model}", "data.train_file=suite:synthetic-train",
                      "data.languages=[python]", f"training.output_dir={tmp_path / 'run'}",
                      "training.max_steps=1", "generation.max_new_tokens=8",
                      "generation.num_samples_per_prompt=2", "reward.exec.sandbox=process"])
    train(cfg, hub=hub)
    m = hub.steps[0][1]
    assert m["reward/frac_none"] == 0.0 and "reward/part/tests" in m
    assert hub.samples and hub.samples[0]["reason"]
