"""Training with `reward.type: mix` reports how far the judge has drifted from the tests: a short
run of the shipped tiny model against a scripted judge (real openai SDK, local server) that
scores by correctness for three steps and then starts paying for failing code. The judge-vs-exec
metrics move, and the health check warns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import scripted_judges as sj
from fake_api import FakeAPI

from mlx_rlaif.config import load
from mlx_rlaif.data import load_tasks
from mlx_rlaif.metrics import MetricsHub
from mlx_rlaif.train import train

ROOT = Path(__file__).resolve().parent.parent
FLIP_AFTER = 3


class FlipAfter:
    """The real hub; after step `at` is logged, the judge flips."""

    def __init__(self, hub: MetricsHub, judge: sj.Flip, at: int) -> None:
        self.hub, self.judge, self.at = hub, judge, at
        self.metrics: list[dict] = []

    def log_step(self, step: int, metrics: dict) -> None:
        self.hub.log_step(step, metrics)
        self.metrics.append(dict(metrics))
        if step == self.at:
            self.judge.flipped = True

    def __getattr__(self, name: str):
        return getattr(self.hub, name)


@pytest.mark.slow
def test_the_metrics_move_when_the_judge_starts_paying_for_failing_code(tmp_path):
    tasks = load_tasks("suite:synthetic-train", languages=["python"])
    oracle = sj.Oracle([t for t in tasks if t.difficulty == "easy"])
    flip = sj.Flip(oracle)
    run_dir = tmp_path / "run"
    try:
        with FakeAPI() as srv:
            srv.responder = sj.responder(flip)
            cfg = load(ROOT / "configs/quickstart.yaml", [
                f"model.path={ROOT / 'models/tiny-coder'}", f"training.output_dir={run_dir}",
                "data.eval_file=", "training.max_steps=6", "training.save_every_batches=0",
                "logging.tensorboard=false", "logging.collect_dataset=false",
                "logging.health_check_interval_batches=3", "reward.type=mix",
                "reward.agreement_window=3", "training.batch_size=8", "reward.teacher.provider=openai",
                "reward.teacher.model=judge", f"reward.teacher.base_url={srv.openai_url}",
                "reward.teacher.reference=false", "reward.teacher.concurrency=8"])
            hub = FlipAfter(MetricsHub.create(cfg.logging, run_dir, False, 6, {}), flip,
                            FLIP_AFTER)
            train(cfg, hub=hub)
    finally:
        oracle.close()
    before, after = hub.metrics[FLIP_AFTER - 1], hub.metrics[-1]
    assert before["teacher/exec_pairs"] >= 8 and after["teacher/exec_pairs"] >= 8
    assert before["teacher/fail_over_pass"] == 0.0 and after["teacher/fail_over_pass"] == 1.0
    assert before["teacher/exec_corr"] > 0.5 and after["teacher/exec_corr"] < -0.5
    assert after["teacher/best_disagree"] > before["teacher/best_disagree"]
    checks = [json.loads(line) for line in (run_dir / "health.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checks] == [3, 6]
    assert checks[0]["ok"] and not any("judge" in i for i in checks[0]["issues"])
    assert any("judge pays for failing code" in i for i in checks[1]["issues"])
    logged = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert logged[-1]["teacher/fail_over_pass"] == 1.0  # in the run's own records too
