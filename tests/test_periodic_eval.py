"""Periodic held-out evaluation (`data.eval_every`) and the best checkpoint
(`training.keep_best`): rows in eval.jsonl and TensorBoard, retention that never deletes the best,
`summary` naming it, a resume that neither loses nor repeats a row, and training left unperturbed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from recording_hub import RecordingHub
from test_metrics import read_events, scalars

from mlx_rlaif import cli
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.metrics.dashboard import DashboardState, eval_line, render
from mlx_rlaif.metrics.jsonl import read_jsonl
from mlx_rlaif.train import periodic, train


def _cfg(model: Path, tasks: Path, out: Path, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"data.eval_file={tasks}",
        f"training.output_dir={out}", "reward.type=syntax", "generation.max_new_tokens=12",
        "generation.num_samples_per_prompt=3", "rl.drop_zero_std=false",
        "training.learning_rate=0.01", "training.num_epochs=3", "logging.tensorboard=false",
        "logging.dashboard=false", "data.eval_samples=2", *extra])


def _adapters(ckpt: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(ckpt / checkpoint.ADAPTERS)).items()}


def _fake_checkpoint(run_dir: Path, step: int) -> Path:
    p = run_dir / "checkpoints" / f"checkpoint-e1-b{step}-gs{step}"
    p.mkdir(parents=True)
    (p / checkpoint.ADAPTERS).write_bytes(b"x")
    (p / checkpoint.STATE).write_text("{}")
    return p


def test_retention_never_deletes_the_best(tmp_path):
    ckpts = [_fake_checkpoint(tmp_path, s) for s in (2, 4, 6, 8)]
    checkpoint.mark_best(tmp_path, ckpts[0], {"step": 2, "eval/pass@1": 0.5})
    assert checkpoint.prune(tmp_path, 1) == ckpts[1:3]  # the best does not count toward keep
    assert checkpoint.list_checkpoints(tmp_path) == [ckpts[0], ckpts[3]]
    assert checkpoint.best_checkpoint(tmp_path) == ckpts[0]
    assert checkpoint.latest_checkpoint(tmp_path) == ckpts[3]  # resume takes the newest
    shutil.rmtree(ckpts[0])  # a best.json naming a checkpoint that is gone is ignored
    assert checkpoint.read_best(tmp_path) is None and checkpoint.prune(tmp_path, 1) == []


def test_eval_subset_is_seeded_and_in_file_order():
    tasks = list(range(10))
    a = periodic.eval_subset(tasks, 4, seed=0)
    assert a == periodic.eval_subset(tasks, 4, seed=0) and len(a) == 4 and a == sorted(a)
    assert periodic.eval_subset(tasks, 0, 0) == tasks == periodic.eval_subset(tasks, 20, 0)
    assert [s for s in range(1, 11) if periodic.is_due(s, 3)] == [3, 6, 9]


def test_config_needs_an_eval_file_and_a_period():
    with pytest.raises(ConfigError, match="data.eval_every needs"):
        check(load(None, ["data.eval_every=5"]))
    with pytest.raises(ConfigError, match="training.keep_best needs"):
        check(load(None, ["training.keep_best=true", "data.eval_file=suite:synthetic-eval"]))


def test_keep_best_marks_and_spares_the_best_and_summary_names_it(
        micro_model, prompts_file, tmp_path, monkeypatch, capsys):
    """Scripted held-out scores (the selection is under test, the sampler is the backend's):
    pass@1 0.2, 0.6, 0.4, 0.1 at steps 2, 4, 6, 8 -> the step-4 checkpoint is the best and
    outlives a retention of 1."""
    scores = iter([0.2, 0.6, 0.4, 0.1])
    calls = []

    def scripted(sample, policy, tasks, reward_fn, cfg, n, seed, temperature):
        calls.append((sample, len(tasks), n, seed, temperature))
        return {"pass@1": next(scores), "reward_mean": 0.5, "n_tasks": len(tasks)}

    monkeypatch.setattr(periodic, "evaluate_tasks", scripted)
    cfg = _cfg(micro_model, prompts_file, tmp_path / "run", "training.max_steps=8",
               "data.eval_every=2", "data.eval_max_tasks=4", "training.keep_best=true",
               "training.save_total_limit=1", "training.save_every_epochs=0",
               "logging.tensorboard=true")
    run_dir = train(cfg)
    assert calls[0][0].__qualname__ == "mlx_ops.<locals>.sample"  # the backend's sampler
    assert [c[1:] for c in calls] == [(4, 2, 0, 0.7)] * 4
    rows = read_jsonl(run_dir / "eval.jsonl")
    assert [(r["step"], r["eval/pass@1"], r["new_best"]) for r in rows] == [
        (2, 0.2, True), (4, 0.6, True), (6, 0.4, False), (8, 0.1, False)]
    names = [p.name for p in checkpoint.list_checkpoints(run_dir)]
    assert names == ["checkpoint-e2-b1-gs4", "checkpoint-final-gs8"]
    best = checkpoint.read_best(run_dir)
    assert best["checkpoint"] == "checkpoint-e2-b1-gs4" and best["eval/pass@1"] == 0.6
    assert checkpoint.load_state(checkpoint.best_checkpoint(run_dir)).step == 4
    tb = scalars(read_events(run_dir / "tensorboard"))
    assert tb["eval/pass@1"] == pytest.approx({2: 0.2, 4: 0.6, 6: 0.4, 8: 0.1})
    assert tb["eval/reward_mean"] == pytest.approx({s: 0.5 for s in (2, 4, 6, 8)})
    out = capsys.readouterr().out
    assert "held-out eval at step 4 (4 tasks x 2): pass@1 0.600" in out and "[new best]" in out
    assert cli.main(["summary", str(run_dir), "--type", "eval"]) == 0
    text = capsys.readouterr().out
    assert f"best checkpoint: {run_dir / 'checkpoints' / 'checkpoint-e2-b1-gs4'}" in text
    assert "pass@1 0.600" in text and "eval: 4 of 4" in text


def test_resume_keeps_the_eval_history_and_training_is_unperturbed(
        micro_model, prompts_file, tmp_path):
    """Real evaluations (the backend's sampler, the syntax reward). A resumed run's eval.jsonl
    equals the straight run's: the rows after its checkpoint are redone once, and a row lost
    in a crash during the evaluation at the checkpoint's step is redone."""
    every = ("data.eval_every=2", "training.save_every_batches=4")
    straight = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=8",
                          *every), hub=None)
    want = [(r["step"], r["eval/reward_mean"]) for r in read_jsonl(straight / "eval.jsonl")]
    assert [s for s, _ in want] == [2, 4, 6, 8]
    crashed = train(_cfg(micro_model, prompts_file, tmp_path / "b", "training.max_steps=6",
                         *every))
    # the crash: the step-6 checkpoint never appeared, nor the row of the evaluation at step 4
    shutil.rmtree(checkpoint.latest_checkpoint(crashed))
    rows = read_jsonl(crashed / "eval.jsonl")
    (crashed / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows
                                                if r["step"] != 4))
    ckpt = checkpoint.latest_checkpoint(crashed)
    assert checkpoint.checkpoint_step(ckpt) == 4
    train(_cfg(micro_model, prompts_file, tmp_path / "b", "training.max_steps=8", *every),
          resume_from=ckpt)
    got = [(r["step"], r["eval/reward_mean"]) for r in read_jsonl(crashed / "eval.jsonl")]
    assert [s for s, _ in got] == [2, 4, 6, 8]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], atol=1e-9)
    # the same training without any periodic evaluation ends on the same adapters
    plain = train(_cfg(micro_model, prompts_file, tmp_path / "c", "training.max_steps=8",
                       "training.save_every_batches=4"), hub=RecordingHub())
    a = _adapters(checkpoint.latest_checkpoint(straight))
    c = _adapters(checkpoint.latest_checkpoint(plain))
    for k in a:
        np.testing.assert_allclose(a[k], c[k], atol=1e-6)


def test_dashboard_shows_the_held_out_row():
    s = DashboardState(total_steps=10)
    s.evals = [(2, {"eval/pass@1": 0.25, "eval/reward_mean": 0.5}),
               (4, {"eval/pass@1": 0.5, "eval/reward_mean": 0.6})]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render(s))
    text = console.export_text()
    assert "Held-out" in text and "pass@1 0.500" in text and "best 0.500 (step 4)" in text
    assert eval_line(4, {"eval/pass@1": 0.5, "eval/reward_mean": 0.6, "eval/tasks": 3,
                         "eval/samples_per_task": 2, "new_best": True}) == (
        "held-out eval at step 4 (3 tasks x 2): pass@1 0.500, mean reward 0.600 [new best]")
