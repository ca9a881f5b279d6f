"""Fault injection, interruptions: SIGINT and SIGTERM in each phase of a step, `kill -9` at named
points (the test-only hook `MLX_RLAIF_FAULT`, mlx_rlaif/faults.py) and at random moments. After
each, `--resume` starts from the newest complete checkpoint, the JSONL files read back, and the
adapters after N steps in all equal an uninterrupted run's. Figures: docs/reliability.md."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from recording_hub import RecordingHub
from train_cli import (
    assert_same_adapters,
    command,
    config,
    env,
    jsonl_files,
    leftovers,
    readable,
    run_cli,
    strict_records,
)

from mlx_rlaif import faults
from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.metrics.jsonl import read_jsonl
from mlx_rlaif.train import train

N = 10  # total steps of the interrupted runs


@pytest.fixture(scope="module")
def straight(micro_model, tmp_path_factory) -> dict:
    """Uninterrupted runs: `straight[steps]` is the final checkpoint of one (run once, kept)."""
    tasks = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    _write_tasks(tasks)

    class Runs(dict):
        def __missing__(self, steps: int) -> Path:
            run = train(config(micro_model, tasks, tmp_path_factory.mktemp("straight"), steps),
                        hub=RecordingHub())
            self[steps] = checkpoint.latest_checkpoint(run)
            return self[steps]

    runs = Runs()
    runs["tasks"] = tasks
    return runs


def _write_tasks(path: Path) -> None:
    import json

    path.write_text("".join(json.dumps({"prompt": f"Write a Python function number {i} that "
                                                  f"returns {i}.", "language": "python"}) + "\n"
                            for i in range(6)))


def _newest(run_dir: Path) -> Path | None:
    damaged: list[str] = []
    found = checkpoint.newest_valid(run_dir, say=damaged.append)
    assert damaged == []  # a kill or a signal never leaves a damaged checkpoint
    return found


# --- SIGINT / SIGTERM in each phase -------------------------------------------------------------

PHASES = ["generate", "score", "update", "checkpoint-weights"]


def test_sigint_and_sigterm_in_each_phase_then_resume_equals_a_straight_run(
        micro_model, straight, tmp_path, monkeypatch, capfd):
    """The hook sends the signal to this process as the phase starts (checkpoint-weights: in the
    middle of the step's checkpoint write). Each run finishes the step in progress, saves a
    checkpoint and returns; the next resumes. 8 interruptions, then the rest: same adapters."""
    run_dir = tmp_path / "run"
    for i, (phase, sig) in enumerate((p, s) for p in PHASES for s in ("sigint", "sigterm")):
        monkeypatch.setenv("MLX_RLAIF_FAULT", f"{phase}:{sig}")
        faults._hits.clear()
        train(config(micro_model, straight["tasks"], run_dir, N), resume_from=_newest(run_dir))
        said = capfd.readouterr().out
        name = "Ctrl-C" if sig == "sigint" else "SIGTERM"
        assert f"{name}: finishing this step" in said and "stopping: interrupted" in said, said
        steps = [r["step"] for r in read_jsonl(run_dir / "batches.jsonl")]
        assert steps == list(range(1, i + 2)), (phase, sig)  # the step in progress, no more
        latest = checkpoint.latest_checkpoint(run_dir)
        assert latest.name == f"checkpoint-final-gs{i + 1}"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers put back
    monkeypatch.delenv("MLX_RLAIF_FAULT")
    train(config(micro_model, straight["tasks"], run_dir, N), resume_from=_newest(run_dir))
    assert_same_adapters(checkpoint.latest_checkpoint(run_dir), straight[N])
    steps = [r["step"] for r in strict_records(run_dir / "batches.jsonl")]
    assert steps == list(range(1, N + 1))


def test_sigterm_from_outside_the_cli_saves_and_resume_continues(micro_model, straight,
                                                                 tmp_path):
    out, steps = tmp_path / "run", 40
    cmd = command(micro_model, straight["tasks"], out, steps)
    log = (tmp_path / "log.txt").open("w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: len(read_jsonl(out / "batches.jsonl")) >= 2, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    text = (tmp_path / "log.txt").read_text()
    assert "SIGTERM: finishing this step" in text and "stopping: interrupted" in text, text
    stopped = checkpoint.latest_checkpoint(out)
    assert stopped.name.startswith("checkpoint-final-gs")
    step = checkpoint.load_state(stopped).step
    assert 2 <= step < steps
    r = run_cli(command(micro_model, straight["tasks"], out, steps, resume=True), tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"resuming from {stopped} (step {step})" in r.stdout
    assert_same_adapters(checkpoint.latest_checkpoint(out), straight[steps])


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert proc.poll() is None, "the run ended early"
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


# --- kill -9 at named points --------------------------------------------------------------------


def test_kill_9_at_named_points_then_resume_equals_a_straight_run(micro_model, straight,
                                                                  tmp_path):
    """SIGKILL after the adapters of step 2's checkpoint are written, then before the rename of
    step 3's, then in the middle of a JSONL line: each resume starts from the newest complete
    checkpoint, cleans the partial one, repairs the torn line; the end result is the straight
    run's."""
    out, tasks = tmp_path / "run", straight["tasks"]
    plan = [("checkpoint-weights@2", None, 1), ("checkpoint-rename@2", 1, 2), ("jsonl@9", 2, None)]
    for fault, resumes_from, newest_after in plan:
        expected = _newest(out)
        assert (None if expected is None else checkpoint.checkpoint_step(expected)) == resumes_from
        r = run_cli(command(micro_model, tasks, out, N, resume=expected is not None), tmp_path,
                    fault=fault)
        assert r.returncode == -signal.SIGKILL, (fault, r.stdout, r.stderr)
        if expected is not None:
            assert f"resuming from {expected} " in r.stdout
        if newest_after is not None:
            assert checkpoint.checkpoint_step(_newest(out)) == newest_after
            assert any(".tmp-" in n for n in leftovers(out / "checkpoints")), fault
        readable(out)  # every JSONL file reads back, torn last lines skipped
    torn = [p for p in jsonl_files(out) if not p.read_bytes().endswith(b"\n")]
    assert len(torn) == 1, torn  # the jsonl fault tore exactly one line
    r = run_cli(command(micro_model, tasks, out, N, resume=True), tmp_path)
    assert r.returncode == 0, r.stderr
    assert leftovers(out) == []
    for p in jsonl_files(out):
        strict_records(p)  # repaired: no torn line left, none in the middle
    assert [r["step"] for r in _last_per_step(out)] == list(range(1, N + 1))
    assert_same_adapters(checkpoint.latest_checkpoint(out), straight[N])


def _last_per_step(run_dir: Path) -> list[dict]:
    from mlx_rlaif.metrics.jsonl import last_per_key

    return last_per_key(strict_records(run_dir / "batches.jsonl"), "step")


# --- kill -9 at random moments ------------------------------------------------------------------

RANDOM_N = 200
TRIALS = 10  # per chain; two chains run side by side


def _chain(micro_model: Path, tasks: Path, out: Path, seed: int) -> dict:
    """TRIALS runs each killed with SIGKILL a random 0-0.8 s after it logged its first step,
    then a run to the end. Returns what the kills hit."""
    rng = random.Random(seed)
    hits = {"kills": 0, "mid_checkpoint": 0, "torn_jsonl": 0, "resumes": 0}
    for trial in range(TRIALS):
        expected = _newest(out)
        before = len(read_jsonl(out / "batches.jsonl"))
        log_path = out.parent / f"log-{seed}-{trial}.txt"
        with log_path.open("w") as log:
            proc = subprocess.Popen(command(micro_model, tasks, out, RANDOM_N,
                                            resume=expected is not None),
                                    cwd=out.parent, env=env(), stdout=log,
                                    stderr=subprocess.STDOUT)
            try:
                _wait_for(lambda b=before: len(read_jsonl(out / "batches.jsonl")) > b, proc)
                time.sleep(rng.uniform(0.0, 0.8))
                proc.send_signal(signal.SIGKILL)
            finally:
                proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, log_path.read_text()
        hits["kills"] += 1
        if expected is not None:
            hits["resumes"] += 1
            assert f"resuming from {expected} " in log_path.read_text()
        hits["mid_checkpoint"] += any(".tmp-" in n for n in leftovers(out / "checkpoints"))
        hits["torn_jsonl"] += any(not p.read_bytes().endswith(b"\n") for p in jsonl_files(out))
        readable(out)
    r = run_cli(command(micro_model, tasks, out, RANDOM_N, resume=True), out.parent)
    assert r.returncode == 0, r.stderr
    assert leftovers(out) == []
    for p in jsonl_files(out):
        strict_records(p)
    assert [x["step"] for x in _last_per_step(out)] == list(range(1, RANDOM_N + 1))
    return hits


@pytest.mark.slow
def test_kill_9_at_random_moments(micro_model, straight, tmp_path):
    """20 SIGKILLs at random moments (two chains of 10, side by side), each followed by a
    resume from the newest complete checkpoint; the final adapters equal the straight run's."""
    outs = [tmp_path / f"chain{i}" / "run" for i in range(2)]
    for o in outs:
        o.parent.mkdir()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda i: _chain(micro_model, straight["tasks"], outs[i], 100 + i),
                                range(2)))
    total = {k: sum(r[k] for r in results) for k in results[0]}
    print(f"\nrandom kills: {total}")
    assert total["kills"] == 2 * TRIALS
    for o in outs:
        assert_same_adapters(checkpoint.latest_checkpoint(o), straight[RANDOM_N])
    assert os.environ.get("MLX_RLAIF_FAULT") is None
