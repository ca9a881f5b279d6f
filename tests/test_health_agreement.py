"""The health checks of issue 37: a sampler that disagrees with the trainer (uncorrected), and an
entropy collapse against the run's first steps, through the hub and across a resume."""

from __future__ import annotations

from test_metrics import make_hub, step_metrics

from mlx_rlaif.metrics import health
from mlx_rlaif.metrics.jsonl import read_jsonl


def test_sampler_mismatch_warns_only_uncorrected():
    bad = {"policy/sampler_kl": 4e-3, "policy/sampler_far_frac": 0.01}
    r = health.check([step_metrics(1, **bad), step_metrics(2, **bad)], 2, 0.15, None)
    assert r.issues == ("sampler and trainer disagree (policy/sampler_kl 0.004 > 0.001, 1.00% of "
                        "tokens past rl.is_cap): set rl.is_correction tis, or decode unfused "
                        "(generation.fuse_lora_max_mb 0)",)
    assert "sampler_kl=0.004" in r.line
    on = {**bad, "policy/is_weight_mean": 0.99}
    assert health.check([step_metrics(1, **on), step_metrics(2, **on)], 2, 0.15, None).ok
    fine = {"policy/sampler_kl": 5e-4}
    assert health.check([step_metrics(1, **fine), step_metrics(2, **fine)], 2, 0.15, None).ok


def test_entropy_collapse_against_the_first_steps():
    low = [step_metrics(s, **{"policy/entropy": 0.25}) for s in (9, 10)]
    r = health.check(low, 10, 0.15, None, entropy_start=1.5)
    assert len(r.issues) == 1 and r.issues[0].startswith(
        "entropy collapse (policy/entropy 0.25 < 20% of its first steps' 1.5")
    assert "rl.clip_high" in r.issues[0] and "rl.entropy_coef" in r.issues[0]
    assert health.check(low, 10, 0.15, None, entropy_start=1.0).ok  # 0.25 >= 0.2
    assert health.check(low, 10, 0.15, None).ok  # no reference yet


def _entropy(step: int) -> float:
    return {1: 1.0, 2: 2.0, 3: 3.0}.get(step, 0.3)  # first steps' mean 2.0; then 0.3 < 0.4


def test_the_hub_keeps_the_first_steps_entropy_across_a_resume(tmp_path):
    hub = make_hub(tmp_path)  # a check every 2 steps
    for s in range(1, 7):
        hub.log_step(s, step_metrics(s, **{"policy/entropy": _entropy(s)}))
    hub.close()
    checks = read_jsonl(tmp_path / "health.jsonl")
    collapsed = [any(i.startswith("entropy collapse") for i in c["issues"]) for c in checks]
    assert collapsed == [False, False, True]  # steps 2 (no reference yet), 4 (1.65), 6 (0.3)
    again = make_hub(tmp_path, resume=True)  # the first steps come back from batches.jsonl
    for s in (7, 8):
        again.log_step(s, step_metrics(s, **{"policy/entropy": _entropy(s)}))
    again.close()
    assert any("first steps' 2" in i for i in read_jsonl(tmp_path / "health.jsonl")[-1]["issues"])
