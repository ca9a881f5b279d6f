"""The live dashboard: pure rendering, plain lines, and the real thing in a pseudo-terminal."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from mlx_rlaif.metrics.dashboard import DashboardState, plain_line, render, sparkline
from mlx_rlaif.metrics.health import HealthReport

ROOT = Path(__file__).resolve().parents[1]


def test_sparkline_scales_between_min_and_max():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▅▅"
    assert sparkline([]) == ""
    assert len(sparkline([float(i) for i in range(100)], width=10)) == 10


def test_plain_line_leaves_out_missing_keys():
    m = {"reward/mean": 0.5, "kl/mean": 0.00123, "policy/clipfrac": 0.25}
    assert plain_line(3, 10, m) == "step 3/10 | reward 0.5000 | kl 0.00123 | clip 0.250"
    assert plain_line(3, 0, {}) == "step 3"


def render_text(state: DashboardState) -> str:
    console = Console(record=True, width=140, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(state))
    return console.export_text()


def test_render_shows_values_completion_and_health():
    s = DashboardState(total_steps=10, step=4, first_step=1)
    s.metrics = {
        "reward/mean": 0.4321,
        "kl/mean": 0.00321,
        "loss/total": 0.0456,
        "policy/clipfrac": 0.0625,
        "policy/entropy": 1.375,
        "gen/tokens_per_sec": 87.5,
        "train/tokens_per_sec": 654.5,
        "memory/mlx_peak_gb": 1.5,
        "memory/rss_gb": 2.25,
        "teacher/calls": 12.0,
        "teacher/cost_usd": 0.0375,
        "teacher/cache_hits": 5.0,
        "time/step": 4.0,
        "time/generate": 3.0,
        "time/score": 0.5,
        "time/train": 0.5,
    }
    s.best, s.baseline = 0.5, 0.25
    s.rewards.extend([0.1, 0.4321])
    s.sample = {
        "task_id": "fizz[2]",
        "language": "python",
        "completion": "print('fizz')",
        "reward": 0.75,
        "advantage": 0.5,
        "parts": {"tests": 0.5},
        "rationale": "Handles [3] but not 5.",
    }
    s.health = HealthReport(4, False, "[HealthCheck] WARN | e1 b4 | low diversity")
    text = render_text(s)
    for expected in (
        "step 4/10",
        "40%",
        "mean 0.432",
        "best 0.500",
        "baseline 0.250",
        "▁█",
        "0.00321",
        "0.0456",
        "clip frac 0.062",
        "entropy 1.375",
        "gen 87.5 tok/s",
        "train 654.5 tok/s",
        "gen 75%",
        "MLX peak 1.50 GB",
        "RSS 2.25 GB",
        "calls 12",
        "cache hits 5",
        "cost $0.0375",
        "fizz[2] (python)",
        "reward 0.750",
        "print('fizz')",
        "tests=0.50",
        "rationale: Handles [3] but not 5.",
        "[HealthCheck] WARN",
    ):
        assert expected in text, expected


def test_render_hides_teacher_row_without_a_teacher():
    text = render_text(
        DashboardState(total_steps=2, step=1, first_step=1, metrics={"reward/mean": 0.5})
    )
    assert "Teacher" not in text and "step 1/2" in text


def test_render_shows_turns_of_multi_turn_rollouts():
    metrics = {"reward/mean": 0.5, "turns/mean": 1.75, "turns/pass_at_1": 0.25,
               "turns/pass_at_2": 0.5}
    text = render_text(DashboardState(total_steps=2, step=1, first_step=1, metrics=metrics))
    assert "mean 1.75 answers  pass after 1: 25%  after 2: 50%" in text
    assert "Turns" not in render_text(DashboardState(total_steps=2, step=1, first_step=1,
                                                     metrics={"reward/mean": 0.5}))


SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from mlx_rlaif.config import LoggingConfig
    from mlx_rlaif.metrics import MetricsHub

    cfg = LoggingConfig(health_check_interval_batches=2)
    hub = MetricsHub.create(cfg, Path(sys.argv[1]), interactive=True, total_steps=3,
                            hparams={}, resume=False)
    for step, reward in ((1, 0.1111), (2, 0.2222)):
        hub.log_step(step, {"epoch": 1, "batch": step, "reward/mean": reward,
                            "kl/mean": 0.00777 * step, "loss/total": 0.0333,
                            "policy/clipfrac": 0.0625, "policy/entropy": 1.375,
                            "gen/tokens_per_sec": 123.5, "train/tokens_per_sec": 456.5,
                            "memory/mlx_peak_gb": 1.25, "teacher/calls": 7.0,
                            "teacher/cost_usd": 0.0125, "gen/diversity": 0.9})
        hub.log_samples(step, [{"task_id": "add", "language": "python",
                                "completion": "def add(a, b):\\n    return a + b",
                                "reward": 0.75, "parts": {"tests": 1.0},
                                "rationale": "Short and right.", "split": "train"}])
        sys.stdin.readline()  # the test lets the next step run once it saw this one
    hub.close()
""")


@pytest.mark.slow
def test_dashboard_in_a_pseudo_terminal(tmp_path):
    script = tmp_path / "dash.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        [str(script), str(tmp_path / "run")],
        env=env,
        dimensions=(50, 130),
        encoding="utf-8",
        timeout=60,
    )
    try:
        # step 1 values appear while the script waits: the live display refreshes on its own
        for pattern in (
            "mlx-rlaif",
            r"step 1/3",
            r"0\.111",
            r"0\.00777",
            "clip frac 0.062",
            r"gen 123\.5 tok/s",
            r"train 456\.5 tok/s",
            r"MLX peak 1\.25 GB",
            "calls 7",
            r"\$0\.0125",
            "return a \\+ b",
            "Short and right",
        ):
            child.expect(pattern)
        child.sendline("")
        for pattern in (r"step 2/3", r"0\.222", r"0\.0155", r"\[HealthCheck\] OK"):
            child.expect(pattern)
        child.sendline("")
        child.expect("Training summary")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
