"""Fault injection, storage: the run directory on a small full filesystem (a tmpfs: mounted as
root, else `bwrap --size N --tmpfs DIR`, else skipped), damaged checkpoints found on `--resume`
and passed over, writes cut short (a checkpoint, a prune, a JSONL line) leaving nothing half
done. Figures: docs/reliability.md."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from recording_hub import RecordingHub
from train_cli import assert_same_adapters, command, config, env

from mlx_rlaif import cli
from mlx_rlaif.artifacts import checkpoint, integrity
from mlx_rlaif.artifacts.checkpoint import LoopState
from mlx_rlaif.metrics.jsonl import JsonlWriter, read_jsonl, repair_tail
from mlx_rlaif.train import train

# --- a small full disk --------------------------------------------------------------------------

INSPECT = """
import json, sys
from pathlib import Path
from mlx_rlaif.artifacts import checkpoint, integrity
out = Path(sys.argv[1])
print(json.dumps({
    "checkpoints": [[p.name, integrity.problem(p)] for p in checkpoint.list_checkpoints(out)],
    "paths": sorted(str(p.relative_to(out)) for p in out.rglob("*")),
}))
"""


@contextmanager
def small_fs(where: Path, size: int) -> Iterator[Callable[[list[str]], list[str]]]:
    """A tmpfs of `size` bytes at `where`; yields how to wrap a command so it sees it."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True).returncode == 0 if os.geteuid() == 0 else False
    if mounted:
        try:
            yield lambda cmd: cmd
        finally:
            subprocess.run(["umount", "-l", str(where)], check=False)
        return
    bwrap = shutil.which("bwrap")
    wrap = [bwrap, "--bind", "/", "/", "--dev", "/dev", "--size", str(size), "--tmpfs",
            str(where)] if bwrap else []
    if not bwrap or subprocess.run([*wrap, "true"], capture_output=True).returncode != 0:
        pytest.skip("no small filesystem: not root (mount) and bwrap --size does not work")
    yield lambda cmd: [*wrap, *cmd]


def test_full_disk_one_line_last_checkpoint_intact_nothing_partial(micro_model, prompts_file,
                                                                   tmp_path):
    out = tmp_path / "small" / "run"
    train_cmd = command(micro_model, prompts_file, out, 400, "training.save_total_limit=0",
                        "training.num_epochs=400")
    script = (f"import subprocess, sys\nr = subprocess.run({train_cmd!r}, capture_output=True, "
              "text=True)\nsys.stderr.write(r.stderr)\nprint('rc', r.returncode)\n"
              f"sys.argv = ['x', {str(out)!r}]\nexec({INSPECT!r})\n")
    with small_fs(tmp_path / "small", 1 << 20) as wrap:
        r = subprocess.run(wrap([sys.executable, "-c", script]), capture_output=True, text=True,
                           env=env(), timeout=600, cwd=tmp_path)
    lines = r.stdout.strip().splitlines()
    assert lines[-2] == "rc 1", r.stdout + r.stderr
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"mlx-rlaif train: error: no space left on the disk holding {out}")
    assert "free space there or pass another --output-dir" in errors[0]
    state = json.loads(lines[-1])
    assert len(state["checkpoints"]) >= 2  # it ran until the disk was full
    assert all(why is None for _, why in state["checkpoints"]), state["checkpoints"]
    assert f"the newest complete checkpoint, {out / 'checkpoints' / state['checkpoints'][-1][0]}, "\
           "is intact" in errors[0]
    assert [p for p in state["paths"] if ".tmp" in p] == []  # no partial checkpoint, no temp file


def test_a_failed_checkpoint_write_leaves_nothing(tmp_path):
    def full(tmp: Path) -> None:
        (tmp / "adapters.safetensors").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        checkpoint.write_checkpoint(tmp_path, "checkpoint-e1-b1-gs1", full, {}, LoopState())
    assert list((tmp_path / "checkpoints").iterdir()) == []


# --- damaged checkpoints ------------------------------------------------------------------------


def _truncate(p: Path) -> None:
    f = p / "adapters.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _bad_json(p: Path) -> None:
    (p / "state.json").write_text('{"step": 3, "epo')


def _missing(p: Path) -> None:
    (p / "optimizer.safetensors").unlink()


def _truncate_same_size(p: Path) -> None:  # a manifest size check alone would miss it
    f = p / "adapters.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:8] + b"#" + data[9:])


@pytest.fixture(scope="module")
def three_steps(micro_model, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(tasks, a run with checkpoints at steps 1-3, the final checkpoint of a straight 4 steps)."""
    tasks = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Write f{i}.", "language": "python"}) + "\n"
                             for i in range(6)))
    run = train(config(micro_model, tasks, tmp_path_factory.mktemp("r") / "run", 3),
                hub=RecordingHub())
    straight = train(config(micro_model, tasks, tmp_path_factory.mktemp("s") / "run", 4),
                     hub=RecordingHub())
    return tasks, run, checkpoint.latest_checkpoint(straight)


@pytest.mark.parametrize("damage, words", [
    (_truncate, "adapters.safetensors has"), (_bad_json, "state.json has"),
    (_missing, "optimizer.safetensors is missing"),
    (_truncate_same_size, "adapters.safetensors has an unreadable header"),
])
def test_damaged_newest_checkpoint_is_reported_and_the_one_before_used(
        micro_model, three_steps, tmp_path, capsys, damage, words):
    tasks, src, straight4 = three_steps
    run = tmp_path / "run"
    shutil.copytree(src, run)
    names = [p.name for p in checkpoint.list_checkpoints(run)]
    assert names == ["checkpoint-e1-b1-gs1", "checkpoint-e1-b2-gs2", "checkpoint-e1-b3-gs3"]
    newest = run / "checkpoints" / names[-1]
    damage(newest)
    assert words in integrity.problem(newest)
    argv = command(micro_model, tasks, run, 4, resume=True)[3:]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert f"checkpoint {names[-1]} is damaged ({words}" in err
    assert f"moved to {run / 'checkpoints' / ('damaged-' + names[-1])}" in err
    assert f"resuming from {run / 'checkpoints' / names[1]} (step 2)" in out
    assert (run / "checkpoints" / f"damaged-{names[-1]}").is_dir()  # kept for a look
    assert_same_adapters(checkpoint.latest_checkpoint(run), straight4)


def test_every_checkpoint_damaged_is_a_usage_error(micro_model, three_steps, tmp_path, capsys):
    tasks, src, _ = three_steps
    run = tmp_path / "run"
    shutil.copytree(src, run)
    for p in checkpoint.list_checkpoints(run):
        _missing(p)
    assert cli.main(command(micro_model, tasks, run, 4, resume=True)[3:]) == 2
    err = capsys.readouterr().err
    assert err.count("is damaged") == 3 and "no complete checkpoint" in err


def test_resume_from_a_damaged_checkpoint_by_path_is_refused(micro_model, three_steps, tmp_path):
    from mlx_rlaif.errors import CheckpointError

    tasks, src, _ = three_steps
    run = tmp_path / "run"
    shutil.copytree(src, run)
    newest = checkpoint.latest_checkpoint(run)
    _bad_json(newest)
    with pytest.raises(CheckpointError, match="is damaged"):
        train(config(micro_model, tasks, run, 4), resume_from=newest, hub=RecordingHub())


def test_checkpoint_without_manifest_is_checked_for_its_required_files(three_steps, tmp_path):
    _, src, _ = three_steps
    old = tmp_path / "old"
    shutil.copytree(checkpoint.latest_checkpoint(src), old)
    (old / integrity.MANIFEST).unlink()  # as written before manifests
    assert integrity.problem(old) is None
    (old / "state.json").unlink()
    assert integrity.problem(old) == "state.json is missing"


def test_a_prune_cut_short_never_leaves_a_half_checkpoint(three_steps, tmp_path, monkeypatch):
    """Deleting an old checkpoint renames it first: a crash mid-delete leaves a `.tmp` directory
    (removed at the next start), never a checkpoint with files missing under a complete name."""
    _, src, _ = three_steps
    run = tmp_path / "run"
    shutil.copytree(src, run)

    def killed_midway(path, ignore_errors=False):
        os.unlink(Path(path) / "optimizer.safetensors")
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(run, 2)
    monkeypatch.undo()
    left = checkpoint.list_checkpoints(run)
    assert [p.name for p in left] == ["checkpoint-e1-b2-gs2", "checkpoint-e1-b3-gs3"]
    assert all(integrity.problem(p) is None for p in left)
    checkpoint.clean_partial(run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [p.name for p in left]


# --- JSONL files cut short ---------------------------------------------------------------------


@pytest.mark.parametrize("content, kept", [
    (b'{"a": 1}\n{"a": 2}\n{"a"', b'{"a": 1}\n{"a": 2}\n'),
    (b'{"a": 1}\n', b'{"a": 1}\n'),
    (b'{"a": 1', b""),
    (b"", b""),
    (b'{"a": 1}\n' + b"x" * 200_000, b'{"a": 1}\n'),  # a torn line longer than one read
])
def test_repair_tail_cuts_a_torn_last_line(tmp_path, content, kept):
    p = tmp_path / "f.jsonl"
    p.write_bytes(content)
    assert repair_tail(p) == len(content) - len(kept)
    assert p.read_bytes() == kept


def test_appending_after_a_crash_starts_a_new_line(tmp_path):
    """Without the repair the next record would be glued to the torn line, and that line, no
    longer the last, would make the whole file unreadable."""
    p = tmp_path / "batches.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "rew')
    assert [r["step"] for r in read_jsonl(p)] == [1]  # the torn last line is skipped on read
    w = JsonlWriter(p, append=True)
    w.write({"step": 2})
    w.close()
    assert [r["step"] for r in read_jsonl(p)] == [1, 2]
    assert p.read_text() == '{"step": 1}\n{"step": 2}\n'
