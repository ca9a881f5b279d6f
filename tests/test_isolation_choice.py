"""Running student code with the user's own rights is the user's decision: with `sandbox: auto`
where no isolating sandbox works (no bubblewrap, namespaces refused, sandbox-exec refused) and
the trainer is not root, the run stops with one line naming the fix; as root, process mode gives
each slot its own uid, as before; an explicit `sandbox: process` is always accepted.

This machine runs the tests as root with bubblewrap installed: the uid query is stood in
(`modes.is_root`, or `os.geteuid` in the CLI's process) and bubblewrap is really absent from
the CLI's PATH. Not covered: a real unprivileged account (the interpreter here lives in /root).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlx_rlaif.errors import ConfigError
from mlx_rlaif.sandbox import modes

ROOT = Path(__file__).resolve().parent.parent
FIX = ("apt-get install bubblewrap", "reward.exec.sandbox: process")


@pytest.fixture()
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modes, "host_platform", lambda: "linux")
    monkeypatch.setattr(modes, "bwrap_problem", lambda: "bwrap not found on PATH")


def test_auto_refuses_process_mode_for_a_user(no_bwrap: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modes, "is_root", lambda: False)
    with pytest.raises(ConfigError) as e:
        modes.choose_mode("auto")
    line = str(e.value)
    assert "\n" not in line and "bwrap not found on PATH" in line
    assert all(f in line for f in FIX)
    assert modes.choose_mode("process") == ("process", "process limits only (requested)")


def test_auto_as_root_keeps_a_uid_per_slot(no_bwrap: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modes, "is_root", lambda: True)
    mode, why = modes.choose_mode("auto")
    assert mode == "process" and "own uid per slot" in why and "bwrap not found" in why


def test_other_platforms_refuse_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modes, "is_root", lambda: False)
    monkeypatch.setattr(modes, "host_platform", lambda: "darwin")
    monkeypatch.setattr(modes, "seatbelt_problem", lambda: "sandbox_apply: Operation not permitted")
    with pytest.raises(ConfigError, match="Operation not permitted.*reward.exec.sandbox: process"):
        modes.choose_mode("auto")
    with pytest.raises(ConfigError, match="sandbox = seatbelt does not work here"):
        modes.choose_mode("seatbelt")
    monkeypatch.setattr(modes, "host_platform", lambda: "freebsd14")
    with pytest.raises(ConfigError, match="no isolating sandbox works here"):
        modes.choose_mode("auto")


def as_user_without_bwrap(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI with `bwrap` missing from PATH and a uid other than root's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # this interpreter as it was started (a venv's python keeps its venv): never the base one
    # behind its symlink, which may have none of the packages (a fresh machine)
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    code = ("import os, sys\nos.geteuid = lambda: 1000\nfrom mlx_rlaif.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "MLX_RLAIF_FAST_BLAS": "0", "MLX_RLAIF_SMOKE": "1"}
    return subprocess.run([str(bin_dir / "python3"), "-c", code, *args], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=600)


def test_train_without_bubblewrap_as_a_user_stops_with_the_fix(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = as_user_without_bwrap(tmp_path, "train", "--output-dir", str(run_dir),
                                 "--no-dashboard")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no isolating sandbox works here (bwrap unavailable (bwrap not found on PATH))" \
        in errors[0] and all(f in errors[0] for f in FIX)
    assert not (run_dir / "batches.jsonl").exists()


def test_doctor_says_the_same(tmp_path: Path) -> None:
    proc = as_user_without_bwrap(tmp_path, "doctor", "--no-probe")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("sandbox"))
    assert "cannot start: no isolating sandbox works here" in line
    assert all(f in line for f in FIX) and "Traceback" not in proc.stderr
