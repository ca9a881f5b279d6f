"""tools/learning.py's issue-58 parts, without training: the arms' overrides load as configs, the
curve picks the checkpoint nearest a training time (never the final one), and the report's
curve table divides by the teacher's pass@1 (by hand below)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import learning  # noqa: E402

from mlx_rlaif.config import load  # noqa: E402


def test_the_distillation_arms_load_as_configs() -> None:
    """opd: the teacher's term alone, no KL, no reward-only machinery; mix: the GRPO recipe
    with the term; self: the GRPO recipe with self-distill.yaml's distill section."""
    opd = load(str(learning.RECIPE), learning.DISTILL["opd"])
    mix = load(str(learning.RECIPE), learning.DISTILL["mix"])
    own = load(str(learning.RECIPE), learning.DISTILL["self"])
    assert (opd.distill.kind, opd.distill.weight_reward, opd.rl.kl_penalty) == ("teacher", 0, 0)
    assert not opd.rl.dynamic_sampling and not opd.rl.guidance
    grpo = load(str(learning.RECIPE))
    assert (mix.distill.weight_reward, mix.rl) == (1.0, grpo.rl)
    assert mix.distill.teacher == str(learning.TEACHER)
    assert (own.distill.kind, own.distill.self_context, own.distill.clip) == (
        "self", ("feedback", "sibling"), 1.0)
    assert own.rl == grpo.rl
    warm = load(str(learning.WARM_RL), learning.DISTILL["sft+rl+mix"])
    assert (warm.distill.kind, warm.distill.weight_reward) == ("teacher", 1.0)
    assert "sft+rl+mix" in learning.WARM and "sft+rl+mix" in learning.NEEDS_TEACHER


def _run_dir(root: Path, steps: int, every: int, seconds: float) -> Path:
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    rows = [{"step": s, "time/step": seconds} for s in range(1, steps + 1)]
    (run / "batches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in [*range(every, steps, every), steps]:
        name = f"checkpoint-final-gs{s}" if s == steps else f"checkpoint-e1-b{s}-gs{s}"
        (run / "checkpoints" / name).mkdir()
        for f in ("adapters.safetensors", "state.json"):
            (run / "checkpoints" / name / f).write_text("{}")
    return run


def test_the_curve_takes_the_checkpoint_nearest_the_time(tmp_path: Path) -> None:
    """30 steps of 2 s, a checkpoint every 10: 25 s is nearest step 10 (20 s); 55 s is nearest
    step 30, the final one, which is left out (the arm's own row): step 20 (40 s)."""
    run = _run_dir(tmp_path, 30, 10, 2.0)
    ckpt, seconds, step = learning.nearest_checkpoint(run, 25)
    assert (ckpt.name, seconds, step) == ("checkpoint-e1-b10-gs10", 20.0, 10)
    assert learning.nearest_checkpoint(run, 55)[2] == 20
    assert learning.nearest_checkpoint(tmp_path / "none", 10) is None


def test_the_report_gives_the_curve_as_a_share_of_the_teacher(tmp_path, monkeypatch,
                                                              capsys) -> None:
    """Teacher pass@1 0.5; the arm at its point 0.3 and 0.4 (shares 0.6, 0.8: mean 0.7) and at
    its end 0.45 (0.9); training minutes 1.0 at the point, 30 x 2 s = 1.0 at the end."""
    monkeypatch.setattr(learning, "WORK", tmp_path)
    run = _run_dir(tmp_path, 30, 10, 2.0)
    scores = {"pass@1": 0.2, "pass@8": 0.3, "greedy": 0.25, "tasks": 56}
    (tmp_path / "frozen.json").write_text(json.dumps({"before_eval": scores}))
    (tmp_path / "teacher.json").write_text(json.dumps({
        "minutes": 6, "steps": 600, "on": "eval", "after/pass@1": 0.5, "after/pass@8": 0.7,
        "after/greedy": 0.6, "gain/pass@1": 30.0, "gain/pass@8": 40.0, "gain/greedy": 35.0}))
    end = {"arm": "opd", "seed": 0, "on": "eval", "minutes": 3, "max_steps": 0, "steps": 30,
           "run_dir": run.name, "after/pass@1": 0.45, "gain/pass@1": 25.0, "gain/pass@8": 1.0,
           "gain/greedy": 5.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(end) + "\n")
    points = [{"arm": "opd", "budget": "3 min", "seed": s, "run_dir": run.name, "at": 1.0,
               "train_s": 60.0, "step": 10, "after/pass@1": p, "gain/pass@1": 100 * (p - 0.2),
               "gain/greedy": 1.0} for s, p in ((0, 0.3), (1, 0.4))]
    (tmp_path / "curve.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    learning.report(type("Args", (), {"on": "eval"})())
    out = capsys.readouterr().out
    assert "teacher (sft 6 min, 600 steps, fused): pass@1 0.500" in out
    assert "| opd | 3 min | 1 min | 0,1 | 1.0 | +15.0 (+10.0 to +20.0) | +1.0 (+1.0 to +1.0) | " \
           "70% (60% to 80%) |" in out
    assert "| opd | 3 min | end | 0 | 1.0 | +25.0 | +5.0 | 90% |" in out


def test_the_curve_evaluates_into_its_own_folder_and_only_the_budget_asked(
        tmp_path, monkeypatch) -> None:
    """A first `curve` on a fresh work folder (no curve/ yet) evaluates into curve/ (it once
    failed there: the folder was never made); `--budget 3` skips the 15-minute runs; a row
    whose folder now holds another run (other steps) is skipped."""
    monkeypatch.setattr(learning, "WORK", tmp_path)
    run = _run_dir(tmp_path, 30, 10, 2.0)
    scores = {"pass@1": 0.2, "pass@8": 0.3, "greedy": 0.25, "tasks": 56}
    (tmp_path / "frozen.json").write_text(json.dumps({"before_eval": scores}))
    rows = [{"arm": "new", "seed": 0, "on": "eval", "minutes": m, "max_steps": 0,
             "run_dir": run.name, "steps": 30} for m in (3, 15)]
    rows += [{**rows[0], "arm": "opd", "steps": 12}]  # its folder taken by another run since
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tags = []

    def evaluate(adapter: Path, on: str, tag: Path) -> dict[str, float]:
        tag.with_name(tag.name + "-sampled.log").write_text("")  # where cli() writes its log
        tags.append(tag)
        return scores

    monkeypatch.setattr(learning, "evaluate", evaluate)
    args = type("Args", (), {"at": 0.5, "on": "eval", "seeds": [], "budget": 3.0})()
    learning.curve(args)
    assert tags == [tmp_path / "curve" / "run-10"]
    point = json.loads((tmp_path / "curve.jsonl").read_text())
    assert (point["budget"], point["step"], point["train_s"]) == ("3 min", 10, 20.0)
