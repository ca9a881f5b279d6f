"""Metrics: stats maths, health checks, JSONL, TensorBoard event files, the hub and resume."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from mlx_rlaif.config import Config, LoggingConfig, to_dict
from mlx_rlaif.errors import UsageError
from mlx_rlaif.metrics import MetricsHub, health, system
from mlx_rlaif.metrics.dashboard import PlainPrinter
from mlx_rlaif.metrics.jsonl import JsonlWriter, last_per_key, read_jsonl
from mlx_rlaif.metrics.stats import Counter, RunStats, aggregate, p99, pooled_variance


def step_metrics(step: int, **extra: float) -> dict[str, float]:
    """A step's metrics with simple known values: reward 0.1 * step, KL 0.001 * step, ..."""
    m = {
        "epoch": 1.0,
        "batch": float(step),
        "reward/mean": 0.1 * step,
        "reward/std": 0.1,
        "reward/min": 0.0,
        "reward/max": 0.5,
        "reward/frac_zero_std": 0.25,
        "kl/mean": 0.001 * step,
        "loss/total": 0.5 - 0.1 * step,
        "loss/policy": 0.25,
        "loss/kl": 0.01,
        "policy/clipfrac": 0.125,
        "policy/entropy": 1.5,
        "kl/sample_train": 0.002,
        "gen/tokens": 100.0,
        "gen/tokens_per_sec": 50.0 * step,
        "gen/completion_len_mean": 25.0,
        "gen/truncated_frac": 0.5,
        "gen/diversity": 0.9,
        "train/tokens": 200.0,
        "train/tokens_per_sec": 400.0,
        "time/generate": 2.0,
        "time/score": 0.5,
        "time/train": 1.5,
        "time/step": 4.0,
    }
    m.update(extra)
    return m


def sample(step: int, split: str = "train", reward: float | None = 0.5) -> dict:
    return {
        "step": step,
        "task_id": f"t{step}",
        "prompt": "Write add(a, b).",
        "language": "python",
        "completion": "```python\ndef add(a, b):\n    return a + b\n```",
        "reward": reward,
        "parts": {"tests": 1.0, "build": 1.0},
        "advantage": 0.25,
        "reason": "4/4 tests",
        "rationale": "Correct.",
        "truncated": False,
        "teacher_code": None,
        "teacher_score": None,
        "split": split,
    }


def make_hub(run_dir: Path, resume: bool = False, **cfg: object) -> MetricsHub:
    logging_cfg = LoggingConfig(**{"health_check_interval_batches": 2, **cfg})
    return MetricsHub.create(
        logging_cfg,
        run_dir,
        interactive=False,
        total_steps=4,
        hparams=to_dict(Config()),
        resume=resume,
    )


# --- a real event-file reader: TFRecord framing with CRCs, tensorboardX's Event protobuf ------


def read_events(logdir: Path) -> list[event_pb2.Event]:
    events = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            header = data[i : i + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[i + 8 : i + 12])[0] == masked_crc32c(header)
            body = data[i + 12 : i + 12 + n]
            assert struct.unpack("<I", data[i + 12 + n : i + 16 + n])[0] == masked_crc32c(body)
            event = event_pb2.Event()
            event.ParseFromString(body)
            events.append(event)
            i += 16 + n
    return events


def scalars(events: list[event_pb2.Event]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for e in events:
        for v in e.summary.value:
            if v.WhichOneof("value") == "simple_value":
                out.setdefault(v.tag, {})[e.step] = v.simple_value
    return out


# --- stats --------------------------------------------------------------------------------------


def test_pooled_variance_equals_variance_of_all_rewards():
    # batch A = [0, 1] (mean .5, std .5), batch B = [1, 1] (mean 1, std 0); all = [0, 1, 1, 1]
    # mean .75, variance (0.5625 + 3 * 0.0625) / 4 = 0.1875
    assert pooled_variance([0.5, 1.0], [0.5, 0.0]) == pytest.approx(0.1875)


def test_p99_interpolates_like_numpy_default():
    assert p99([float(x) for x in range(1, 101)]) == pytest.approx(99.01)
    assert p99([]) is None


def test_counter_total_survives_a_restart():
    c = Counter()
    for reading in (3.0, 5.0, 1.0, 4.0):  # restart after 5: +3, +2, +1, +3
        c.update(reading)
    assert c.total == 9.0


def test_aggregate_sums_amounts_and_averages_rates():
    agg = aggregate([step_metrics(1), step_metrics(2)])
    assert agg["gen/tokens"] == 200.0 and agg["time/step"] == 8.0
    assert agg["reward/mean"] == pytest.approx(0.15)
    assert "epoch" not in agg and "batch" not in agg


def test_epochs_trends_and_teacher_deltas():
    s = RunStats()
    for step in (1, 2):
        s.observe(
            step,
            step_metrics(
                step, **{"teacher/input_tokens": 1000.0 * step, "teacher/cost_usd": 0.01 * step}
            ),
        )
    e1 = s.end_epoch(1, num_samples=8)
    for step in (3, 4):
        s.observe(
            step,
            step_metrics(
                step, **{"teacher/input_tokens": 1000.0 * step, "teacher/cost_usd": 0.01 * step}
            ),
        )
    e2 = s.end_epoch(2, num_samples=8)
    assert e1["teacher/input_tokens"] == 2000.0 and e2["teacher/input_tokens"] == 2000.0
    assert e2["teacher/cost_usd"] == pytest.approx(0.02)
    assert e2["reward/trend"] == pytest.approx(0.35 - 0.15)
    assert e2["loss/trend"] == pytest.approx(0.35 - 0.15)  # loss went down by 0.2
    # both batches have std .1: pooled variance = .01 + variance of the means (.1, .2) = .0125
    assert e1["reward/variance"] == pytest.approx(0.0125)
    d = s.as_dict()
    assert d["baseline_reward"] == pytest.approx(0.1) and d["best_step"] == 4
    assert d["generation"]["avg_tokens_per_sec"] == pytest.approx(125.0)
    assert d["generation"]["total_tokens"] == 400.0
    assert [e["input_tokens"] for e in d["teacher"]["per_epoch"]] == [2000.0, 2000.0]


def test_summary_text_has_the_seed_sections():
    s = RunStats()
    for step in (1, 2):
        s.observe(
            step,
            step_metrics(
                step,
                **{"teacher/input_tokens": 1000.0 * step, "teacher/output_tokens": 10.0 * step},
            ),
        )
    s.end_epoch(1, num_samples=4)
    text = s.summary_text()
    assert "Average: 75.00 tokens/sec" in text
    assert "P99:     99.50 tokens/sec" in text  # 50 + 0.99 * 50
    assert "Total Tokens Generated: 200" in text and "Total Tokens Consumed: 400" in text
    assert "Total Tokens Sent: 2,000" in text and "Total Tokens Received: 20" in text
    assert "Epoch 1: 2,020 tokens" in text
    assert "Total Time: 0h 0m" in text


# --- health -------------------------------------------------------------------------------------


def test_health_line_ok():
    window = [step_metrics(1), step_metrics(2)]
    r = health.check(window, step=2, ema=0.15, baseline=0.1, checks_done=0)
    assert r.ok and r.issues == ()
    assert r.line == (
        "[HealthCheck] OK | e1 b2 | reward(mean=0.150, ema=0.150, bestN=0.200) | "
        "kl=0.0015 | time(gen=50%, score=12%, train=38%) | gen(tok/s=75.0, div=0.90)"
    )


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"kl/mean": 2.5}, "KL blow-up (kl 2.5 > 1)"),
        ({"reward/frac_zero_std": 1.0}, "all groups zero-variance for 2 batches"),
        ({"gen/diversity": 0.1}, "low diversity (0.10 < 0.2)"),
        ({"time/generate": 19.0}, "generation bottleneck (90% of step time)"),
        ({"reward/frac_none": 0.75}, "many unscorable completions (75%)"),
        ({"optim/skipped": 1.0}, "2 updates skipped"),
    ],
)
def test_health_warnings(extra, expected):
    r = health.check([step_metrics(1, **extra), step_metrics(2, **extra)], 2, 0.15, None)
    assert not r.ok and r.line.startswith("[HealthCheck] WARN")
    assert any(i.startswith(expected) for i in r.issues), r.issues


def test_no_gain_over_baseline_only_after_two_checks():
    window = [step_metrics(1), step_metrics(2)]
    assert health.check(window, 2, ema=0.3, baseline=0.3, checks_done=1).ok
    late = health.check(window, 2, ema=0.3, baseline=0.3, checks_done=2)
    assert late.issues == ("no gain over baseline (ema 0.300 <= baseline 0.300)",)


# --- jsonl --------------------------------------------------------------------------------------


def test_jsonl_is_strict_and_tolerates_a_torn_last_line(tmp_path):
    w = JsonlWriter(tmp_path / "a.jsonl", append=False)
    w.write({"step": 1, "loss": float("nan"), "x": [float("inf"), 1.0]})
    w.close()
    text = (tmp_path / "a.jsonl").read_text()
    assert json.loads(text) == {"step": 1, "loss": None, "x": [None, 1.0]}
    (tmp_path / "a.jsonl").write_text(text + '{"step": 2, "lo')
    assert read_jsonl(tmp_path / "a.jsonl") == [{"step": 1, "loss": None, "x": [None, 1.0]}]
    (tmp_path / "b.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UsageError, match="b.jsonl:2"):
        read_jsonl(tmp_path / "b.jsonl")


def test_last_per_key_keeps_the_later_record():
    recs = [{"step": 1, "v": 1}, {"step": 2, "v": 2}, {"step": 2, "v": 3}, {"step": 3, "v": 4}]
    assert [r["v"] for r in last_per_key(recs, "step")] == [1, 3, 4]


def test_system_snapshot_reads_this_process():
    snap = system.snapshot()
    assert 0 < snap["memory/rss_gb"] < 24
    assert 0 < snap["system/memory_percent"] <= 100


# --- the hub ------------------------------------------------------------------------------------


def run_two_epochs(hub: MetricsHub, steps=(1, 2, 3, 4)) -> None:
    for step in steps:
        hub.log_step(step, step_metrics(step))
        hub.log_samples(
            step, [sample(step), sample(step, reward=None), sample(step, split="evaluation")]
        )
        if step % 2 == 0:
            hub.end_epoch(step // 2)


def test_hub_writes_every_file_and_plain_lines(tmp_path, capsys):
    hub = make_hub(tmp_path, samples_per_step=2)
    assert isinstance(hub.view, PlainPrinter)
    run_two_epochs(hub)
    summary = hub.close()
    assert hub.close() == summary  # idempotent
    batches = read_jsonl(tmp_path / "batches.jsonl")
    assert [b["step"] for b in batches] == [1, 2, 3, 4]
    assert batches[2]["reward/mean"] == pytest.approx(0.3)
    assert batches[2]["reward/baseline"] == pytest.approx(0.1)
    assert "memory/rss_gb" in batches[0] and "system/cpu_percent" in batches[0]
    epochs = read_jsonl(tmp_path / "epochs.jsonl")
    assert [e["epoch"] for e in epochs] == [1, 2] and epochs[0]["num_samples"] == 4
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 4 * 2  # samples_per_step = 2
    assert [h["step"] for h in read_jsonl(tmp_path / "health.jsonl")] == [2, 4]
    assert len(read_jsonl(tmp_path / "datasets" / "train.jsonl")) == 8
    assert len(read_jsonl(tmp_path / "datasets" / "evaluation.jsonl")) == 4
    assert (tmp_path / "datasets" / "README.md").read_text().startswith("---\nconfigs:")
    out = capsys.readouterr().out
    assert re.search(  # the elapsed time: the hub's clock (no ETA: the loop sends it)
        r"step 3/4 \| elapsed \d+s \| reward 0.3000 \| kl 0.003 \| loss 0.2 \| clip 0.125 \| "
        r"gen tok/s 150.0 \| train tok/s 400.0 \| step s 4.00", out)
    assert "[HealthCheck] OK | e1 b2 |" in out
    assert "epoch 2: 2 steps | reward 0.3500 | trend +0.2000" in out
    assert "Training summary" in out and summary in out


def test_dashboard_switch_and_optional_sinks(tmp_path):
    hub = MetricsHub.create(
        LoggingConfig(dashboard=False, tensorboard=False, collect_dataset=False),
        tmp_path,
        interactive=True,
        total_steps=1,
        hparams={},
        resume=False,
    )
    assert isinstance(hub.view, PlainPrinter)
    hub.log_step(1, step_metrics(1))
    hub.log_samples(1, [sample(1)])
    hub.close()
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "datasets").exists()


def test_tensorboard_tags_read_back(tmp_path):
    hub = make_hub(tmp_path)
    run_two_epochs(hub)
    hub.close()
    events = read_events(tmp_path / "tensorboard")
    tags = scalars(events)
    for tag in (
        "Train/Loss",
        "Train/PolicyLoss",
        "Train/KLPenalty",
        "Train/AvgReward",
        "Train/RewardStd",
        "Train/RewardMin",
        "Train/RewardMax",
        "Train/RewardVariance",
        "Performance/Generation_TokensPerSec",
        "Performance/Backprop_TokensPerSec",
        "Performance/Generation_Time",
        "System/Process_RSS_GB",
        "System/CPU_Percent",
        "System/Memory_Percent",
        "policy/clipfrac",
        "policy/entropy",
        "reward/frac_zero_std",
        "kl/sample_train",
        "gen/completion_len_mean",
        "gen/truncated_frac",
        "time/generate",
        "time/score",
        "time/train",
        "Epoch/AvgReward",
        "Epoch/AvgLoss",
        "Epoch/RewardVariance",
        "Epoch/RewardTrend",
        "Epoch/LossTrend",
        "Epoch/NumSamples",
        "Performance/Generation_P99TokensPerSec",
        "Performance/Generation_TotalTokens_Cumulative",
    ):
        assert tag in tags, tag
    assert tags["Train/AvgReward"][3] == pytest.approx(0.3)
    assert tags["Train/RewardVariance"][1] == pytest.approx(0.01)
    assert tags["policy/clipfrac"][2] == pytest.approx(0.125)
    assert tags["Epoch/AvgReward"] == pytest.approx({1: 0.15, 2: 0.35})
    assert tags["Epoch/RewardTrend"] == pytest.approx({2: 0.2})
    assert tags["Epoch/NumSamples"] == {1: 4.0, 2: 4.0}
    assert tags["Performance/Generation_TotalTokens_Cumulative"][4] == 400.0
    others = {v.tag for e in events for v in e.summary.value} - set(tags)
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= others
    assert any(
        "rl.kl_penalty" in v.tensor.string_val[0].decode()
        for e in events
        for v in e.summary.value
        if v.tag == "hparams/text_summary"
    )


def test_resume_appends_and_rebuilds_stats(tmp_path):
    hub = make_hub(tmp_path)
    run_two_epochs(hub, steps=(1, 2, 3))
    hub.close()  # crashed after step 3; the checkpoint was at step 2
    hub = make_hub(tmp_path, resume=True)
    hub.message("resumed")  # nothing before the first step replays the old records
    for step in (3, 4):
        hub.log_step(step, step_metrics(step))
        hub.log_samples(step, [sample(step)])
    agg = hub.end_epoch(2)
    stats = hub.stats()
    hub.close()
    assert stats["baseline_reward"] == pytest.approx(0.1)  # from the first run's first step
    assert stats["steps"] == 4  # steps 1, 2 replayed, 3, 4 logged again
    assert stats["generation"]["total_tokens"] == 400.0
    assert agg["steps"] == 2 and agg["reward/trend"] == pytest.approx(0.2)
    steps = [b["step"] for b in read_jsonl(tmp_path / "batches.jsonl")]
    assert steps == [1, 2, 3, 3, 4]  # appended; readers keep the last step 3
    # TensorBoard: the resumed writer purges steps >= 3 of the old file
    purges = [
        e.step
        for e in read_events(tmp_path / "tensorboard")
        if e.session_log.status == event_pb2.SessionLog.START
    ]
    assert purges == [3]


def test_explicit_baseline(tmp_path):
    hub = make_hub(tmp_path)
    hub.set_baseline(float("nan"))  # nothing scorable: ignored
    hub.set_baseline(0.05, "baseline evaluation (2 batches)")
    hub.log_step(1, step_metrics(1))
    stats = hub.stats()
    hub.close()
    assert stats["baseline_reward"] == 0.05
    assert stats["reward_gain_from_baseline"] == pytest.approx(0.1 - 0.05)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_tensorboard_does_not_load_torch(tmp_path):
    code = (
        "import sys; from pathlib import Path\n"
        "from mlx_rlaif.metrics.tensorboard import TensorBoardSink\n"
        "from mlx_rlaif.metrics.stats import RunStats\n"
        f"sink = TensorBoardSink(Path({str(tmp_path)!r}), {{'lr': 0.1}}, resume=False)\n"
        "sink.step(1, {'reward/mean': 0.5}, RunStats()); sink.close()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert scalars(read_events(tmp_path))["Train/AvgReward"] == {1: 0.5}


def test_log_step_takes_numpy_scalars_and_rejects_arrays(tmp_path):
    import numpy as np

    hub = make_hub(tmp_path)
    with pytest.raises(TypeError, match="'loss/total' is a ndarray"):
        hub.log_step(1, {"loss/total": np.array(0.5)})
    hub.log_step(1, {"loss/total": np.float32(0.5), "gen/tokens": np.int64(7)})
    hub.close()
    record = read_jsonl(tmp_path / "batches.jsonl")[0]
    assert record["loss/total"] == 0.5 and record["gen/tokens"] == 7.0


def test_teacher_totals_continue_across_a_resume(tmp_path):
    hub = make_hub(tmp_path)
    for step in (1, 2):
        hub.log_step(step, step_metrics(step, **{"teacher/input_tokens": 100.0 * step}))
    hub.close()
    hub = make_hub(tmp_path, resume=True)
    hub.log_step(3, step_metrics(3, **{"teacher/input_tokens": 250.0}))  # a new process: 250 new
    stats = hub.stats()
    hub.close()
    assert stats["teacher"]["input_tokens"] == 200.0 + 250.0


def test_explicit_baseline_survives_the_resume_replay(tmp_path):
    hub = make_hub(tmp_path)
    run_two_epochs(hub, steps=(1, 2))
    hub.close()
    hub = make_hub(tmp_path, resume=True)
    hub.set_baseline(0.07, "checkpoint")
    hub.log_step(3, step_metrics(3))
    stats = hub.stats()
    hub.close()
    assert stats["baseline_reward"] == 0.07 and stats["steps"] == 3


def test_files_appear_with_the_first_record_and_stale_ones_go(tmp_path):
    (tmp_path / "batches.jsonl").write_text('{"step": 9}\n')  # an older run in the same dir
    hub = make_hub(tmp_path)
    assert not (tmp_path / "batches.jsonl").exists()
    hub.log_step(1, step_metrics(1))
    assert [r["step"] for r in read_jsonl(tmp_path / "batches.jsonl")] == [1]
    hub.close()
    assert not (tmp_path / "samples.jsonl").exists() and not (tmp_path / "datasets").exists()


def test_card_meta_reads_nested_and_flat_configs():
    from mlx_rlaif.metrics.hub import card_meta

    nested = card_meta(to_dict(Config()))
    flat = card_meta({"model.path": "builtin:tiny-coder", "reward.type": "exec"})
    assert nested["model"] == flat["model"] == "builtin:tiny-coder"
    assert nested["reward"] == flat["reward"] == "exec" and "teacher_provider" not in nested


def test_seed_scoring_and_metal_tags(tmp_path, monkeypatch):
    """The seed's Scoring/* tags (the rubric's weights) and, on Apple silicon, its Metal memory
    tags: GPU memory used (MLX active memory), the MLX cache and its growth, and macOS's
    physical footprint. Elsewhere the Metal and footprint tags are left out."""
    assert "memory/mlx_active_gb" not in system.snapshot()  # this CPU build: no Metal readings
    assert "memory/footprint_gb" not in system.snapshot()  # Linux: no footprint
    caches = iter([1.0, 1.25, 1.75, 2.0])
    monkeypatch.setattr(system, "metal_memory", lambda: {"memory/mlx_active_gb": 3.5,
                                                         "memory/mlx_cache_gb": next(caches)})
    monkeypatch.setattr(system, "footprint_gb", lambda: 4.25)
    hub = make_hub(tmp_path)
    for step in (1, 2, 3):
        hub.log_step(step, step_metrics(step, **{"scoring/correctness": 0.3,
                                                 "scoring/code_quality": 0.3}))
    hub.close()
    tags = scalars(read_events(tmp_path / "tensorboard"))
    assert tags["Scoring/Correctness"][1] == pytest.approx(0.3)
    assert tags["Scoring/CodeQuality"][3] == pytest.approx(0.3)
    assert tags["System/GPU_Memory_Used_GB"][2] == 3.5
    assert tags["Batch/Metal/MLX_Cache_GB"] == {1: 1.0, 2: 1.25, 3: 1.75}
    assert tags["Batch/Metal/MLX_Cache_Growth_GB"] == {2: 0.25, 3: 0.5}
    assert tags["System/Process_Footprint_GB"][1] == 4.25


def test_footprint_is_read_from_rusage_info():
    import struct

    buf = bytes(16) + struct.pack("<9Q", 1, 2, 3, 4, 5, 6, 7, 3 * 1024**3, 9)
    assert system.footprint_from(buf) == pytest.approx(3.0)  # phys_footprint, in GiB


def test_metal_memory_is_read_only_on_metal(monkeypatch):
    import mlx.core as mx

    monkeypatch.setattr(system, "on_metal", lambda: True)
    got = system.metal_memory()
    assert got["memory/mlx_active_gb"] == pytest.approx(mx.get_active_memory() / 1024**3)
    assert set(got) == {"memory/mlx_active_gb", "memory/mlx_cache_gb"}
    monkeypatch.setattr(system, "on_metal", lambda: False)
    assert system.metal_memory() == {}
