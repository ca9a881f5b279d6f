"""How long a run is (train/length.py): training.max_steps is the number of steps, cycling the
task file; num_epochs bounds it only where set (whichever ends first, said at the start); a
run only time-limited cycles until training.max_minutes; the learning-rate schedule spans the
steps the run will take; a checkpoint written before the change (its config says num_epochs: 1)
resumes with that bound and says so; dynamic sampling and the curriculum keep an epoch's step
count; the progress display's total is the step the run will reach, or its time budget."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import check, load
from mlx_rlaif.data.curriculum import Curriculum, Stream
from mlx_rlaif.data.tasks import TaskOrder
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.metrics.dashboard import DashboardState, ends_by, plain_line, render
from mlx_rlaif.records import Task
from mlx_rlaif.train import loop as loop_module
from mlx_rlaif.train import train
from mlx_rlaif.train.length import run_length
from mlx_rlaif.train.sft import length_of as sft_length


def _t(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"max_steps": 0, "num_epochs": 0, "max_minutes": 0.0, **kw})


ITEMS = "the 8 tasks at 3 prompts a step"  # 3 steps an epoch (3 + 3 + 2 tasks)


@pytest.mark.parametrize("kw, steps, says", [
    ({}, 3, "3 steps: 1 epoch over the 8 tasks"),
    ({"max_steps": 12}, 12, "12 steps (training.max_steps): 4 epochs of 3 steps over"),
    ({"max_steps": 4}, 4, "4 steps (training.max_steps): 1 epoch of 3 steps and 1 more over"),
    ({"max_steps": 2}, 2, "2 of the 3 steps of an epoch"),
    ({"num_epochs": 2}, 6, "6 steps: 2 epochs of 3 steps over"),
    ({"max_steps": 12, "num_epochs": 1}, 3,
     "the run ends at step 3, whichever of training.max_steps = 12 and training.num_epochs = 1 "
     "(3 steps) comes first: training.num_epochs"),
    ({"max_steps": 5, "num_epochs": 4}, 5, "comes first: training.max_steps"),
    ({"max_minutes": 5.0}, None, "training for 5 min (training.max_minutes), cycling the 8"),
    ({"max_steps": 12, "max_minutes": 5.0}, 12,
     "12 steps (training.max_steps): 4 epochs of 3 steps over the 8 tasks at 3 prompts a step; "
     "or at the step that passes 5 min of training"),
])
def test_run_length_by_hand(kw, steps, says):
    length = run_length(_t(**kw), 3, ITEMS)
    assert length.steps == steps and says in length.line
    assert length.minutes == kw.get("max_minutes", 0.0)


def test_a_cosine_schedule_needs_a_step_count():
    with pytest.raises(ConfigError, match="training.max_minutes alone"):
        check(load(None, ["training.lr_schedule=cosine", "training.max_minutes=5"]))
    check(load(None, ["training.lr_schedule=cosine", "training.max_minutes=5",
                      "training.max_steps=10"]))
    check(load(None, ["training.max_minutes=5"]))  # constant: no horizon needed


def test_sft_counts_its_steps_the_same_way():
    cfg = SimpleNamespace(training=SimpleNamespace(**vars(_t(max_steps=7)), batch_size=4))
    assert sft_length(cfg, 10).steps == 7  # 2 steps an epoch: cycled
    cfg.training.num_epochs = 1
    assert sft_length(cfg, 10).steps == 2


def _tasks(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Write f{i}() returning {i}.",
                                        "language": "python"}) + "\n" for i in range(n)))
    return path


def _cfg(model: Path, tasks: Path, out: Path, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=syntax", "generation.max_new_tokens=6", "generation.num_samples_per_prompt=2",
        "rl.entropy_coef=0.05", "rl.drop_zero_std=false", "training.learning_rate=0.01",
        "logging.tensorboard=false", "training.save_every_epochs=0", *extra])


def test_max_steps_cycles_the_task_file(micro_model, tmp_path):
    """3 tasks at 2 prompts a step: 2 steps an epoch (2 + 1 tasks); 5 steps visit the file in
    each epoch's own order 2.5 times (the old code stopped after step 2)."""
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, tasks, tmp_path / "run", "training.max_steps=5"), hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2, 3, 4, 5]
    assert [m["epoch"] for _, m in hub.steps] == [1, 1, 2, 2, 3]
    assert hub.epochs == [1, 2]
    order = TaskOrder(3, 0)
    seen = [s["task_id"] for s in hub.samples[::2]]  # one record per completion, G = 2
    want = [f"t{i}" for e in range(3) for i in order.permutation(e)][:8]  # 2+1, 2+1, 2
    assert seen == want
    assert any("5 steps (training.max_steps): 2 epochs of 2 steps and 1 more over the 3 tasks"
               in m for m in hub.messages)
    assert checkpoint.load_state(checkpoint.latest_checkpoint(run_dir)).step == 5


def test_the_cosine_schedule_spans_the_cycled_steps(micro_model, tmp_path):
    """lr at update k of n (no warmup): lr_min + (lr - lr_min)(1 + cos(pi k / n)) / 2, with n
    = max_steps x rl.num_iterations = 10, not one epoch's 2 x 2."""
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    hub = RecordingHub()
    run_dir = train(_cfg(micro_model, tasks, tmp_path / "run", "training.max_steps=5",
                         "rl.num_iterations=2", "training.lr_schedule=cosine",
                         "training.min_lr_ratio=0.1"), hub=hub)
    assert checkpoint.load_state(checkpoint.latest_checkpoint(run_dir)).total_updates == 10
    lr = [m["optim/lr"] for _, m in hub.steps]
    want = [0.001 + 0.009 * (1 + math.cos(math.pi * k / 10)) / 2 for k in (1, 3, 5, 7, 9)]
    assert lr == pytest.approx(want, rel=1e-5)  # the lr of each step's last update


def test_both_set_ends_at_whichever_comes_first_and_says_so(micro_model, tmp_path):
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    hub = RecordingHub()
    train(_cfg(micro_model, tasks, tmp_path / "run", "training.max_steps=5",
               "training.num_epochs=1"), hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2]
    assert any("whichever of training.max_steps = 5 and training.num_epochs = 1 (2 steps) comes "
               "first: training.num_epochs" in m for m in hub.messages)


def test_a_checkpoint_from_before_resumes_with_its_saved_epoch_bound(micro_model, tmp_path):
    """Configs written before num_epochs defaulted to 0 say `num_epochs: 1`: a resume from
    them (the CLI reads the run's config.yaml) keeps that bound and the line says which key
    ends the run; num_epochs=0 lifts it. The schedule keeps its first horizon."""
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    out = tmp_path / "run"
    first = train(_cfg(micro_model, tasks, out, "training.max_steps=1", "training.num_epochs=1",
                       "training.lr_schedule=cosine"), hub=RecordingHub())
    saved = (first / "config.yaml").read_text()
    assert "num_epochs: 1\n" in saved  # what every config.yaml written before said
    ckpt = checkpoint.latest_checkpoint(first)
    assert checkpoint.load_state(ckpt).total_updates == 1
    hub = RecordingHub()
    train(load(first / "config.yaml", ["training.max_steps=4"]), resume_from=ckpt, hub=hub)
    assert [s for s, _ in hub.steps] == [2]  # the end of epoch 1, as before the change
    assert any("comes first: training.num_epochs" in m for m in hub.messages)
    assert any("keeps the horizon of the run's first launch (1 updates)" in m
               for m in hub.messages)
    hub = RecordingHub()
    resumed = checkpoint.latest_checkpoint(first)
    train(load(first / "config.yaml", ["training.max_steps=4", "training.num_epochs=0"]),
          resume_from=resumed, hub=hub)
    assert [s for s, _ in hub.steps] == [3, 4]


def test_dynamic_sampling_keeps_an_epochs_step_count(micro_model, tmp_path):
    """With dynamic sampling a step may draw more tasks than it trains on: num_epochs = 1 is
    still 2 steps here (3 tasks, 2 a step), though the first round alone draws 4 tasks
    (rl.oversample 2), and epochs.jsonl numbers the passes the stream completed (one record a
step at most)."""
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    hub = RecordingHub()
    train(_cfg(micro_model, tasks, tmp_path / "run", "training.num_epochs=1",
               "rl.dynamic_sampling=true", "rl.oversample=2", "rl.max_extra_rounds=1"), hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2]
    drawn = sum(m["sample/generations"] for _, m in hub.steps) / 2  # G = 2
    assert drawn >= 4 and hub.epochs[-1] == drawn // 3 and len(hub.epochs) <= 2


def test_the_curriculum_and_fixed_order_take_the_same_steps_an_epoch():
    """The stream's epoch is one pass of len(tasks) draws: a fixed order's last batch of an
    epoch is shorter, and so is the curriculum's, so both take ceil(N / P) steps a pass."""
    tasks = [Task(f"t{i}", f"p{i}", difficulty="easy") for i in range(5)]
    for cur in (None, Curriculum.of(tasks, ["difficulty"], 0, 0.05, 0.3)):
        stream = Stream(tasks, TaskOrder(5, 0), curriculum=cur)
        sizes = [len(stream.take(2)) for _ in range(3)]
        assert sizes == [2, 2, 1] and (stream.epoch, stream.cursor) == (1, 0)
    stream = Stream(tasks, TaskOrder(5, 0))  # dynamic sampling's draws cross epochs
    assert len(stream.take(7, across=True)) == 7 and (stream.epoch, stream.cursor) == (1, 2)


def test_a_time_limited_run_cycles_until_its_budget(micro_model, tmp_path, monkeypatch):
    """max_minutes alone: no step bound; the loop's clock (a fake one, 1 s a reading) ends it
    after the step that passes 0.1 min, past the first epoch."""
    clock = iter(range(10_000))  # read at the start, then twice a step: its record, the check
    monkeypatch.setattr(loop_module, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    tasks = _tasks(tmp_path / "t.jsonl", 3)
    hub = RecordingHub()
    train(_cfg(micro_model, tasks, tmp_path / "run", "training.max_minutes=0.1"), hub=hub)
    assert [m["time/training_s"] for _, m in hub.steps] == [1, 3, 5]  # 6 s at step 3's check
    assert hub.epochs == [1]  # steps 1-2 were the first epoch
    assert any("training for 0.1 min (training.max_minutes), cycling" in m
               for m in hub.messages)


def test_the_progress_total_is_the_last_step_or_the_time_budget():
    """The issue's `step 26/32000`: a 5-minute run bounded at 32,000 steps shows its time."""
    m = {"time/training_s": 192.0, "reward/mean": 0.5}
    assert ends_by(26, 32000, 192.0, 300.0) == "time"
    assert ends_by(26, 30, 192.0, 300.0) == "steps"  # 26 steps in 192 s: 30 comes first
    assert ends_by(0, 30, 0.0, 300.0) == "steps" and ends_by(0, 0, 0.0, 300.0) == "time"
    assert plain_line(26, 32000, m, 300.0).startswith("step 26 (3.2 of 5 min) | reward")
    assert plain_line(26, 30, m, 300.0).startswith("step 26/30 | reward")
    assert plain_line(26, 0, m, 300.0).startswith("step 26 (3.2 of 5 min)")
    text = _render(DashboardState(total_steps=32000, time_budget_s=300.0, step=26, first_step=1,
                                  metrics=m))
    assert "32000" not in text and "of 0:05:00 training time" in text
    text = _render(DashboardState(total_steps=30, step=26, first_step=1, metrics=m))
    assert "step 26/30" in text


def _render(state: DashboardState) -> str:
    import os

    from rich.console import Console

    state.updated = state.started + 1
    console = Console(record=True, width=140, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(state))
    return console.export_text()


def test_the_hub_hands_the_time_budget_to_the_plain_lines(tmp_path, capsys):
    from mlx_rlaif.config import LoggingConfig
    from mlx_rlaif.metrics import MetricsHub

    hub = MetricsHub.create(LoggingConfig(tensorboard=False), tmp_path, False, 32000, {},
                            time_budget_s=300.0)
    hub.log_step(1, {"time/training_s": 192.0, "reward/mean": 0.5})
    hub.close()
    assert "step 1 (3.2 of 5 min) | elapsed 0s | reward 0.5000" in capsys.readouterr().out
