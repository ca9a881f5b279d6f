"""`--out` at a device or a pipe (`/dev/null`, `/dev/stdout`) is written into, never renamed over
(issue 57's red-team pass: `score --out /dev/null` as root made a temporary file in /dev and
renamed it over /dev/null, and every later sandbox failed on the machine's missing device); a
directory is refused in one line. A device node made in the test's directory stands in for
/dev/null, so the test never touches the machine's."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from mlx_rlaif.artifacts.atomic import write_text_atomic
from mlx_rlaif.commands.score import write_atomic
from mlx_rlaif.errors import UsageError


def test_a_device_is_written_into_not_replaced(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    write_atomic(str(null), ['{"reward": 1.0}'])
    write_text_atomic(null, "x\n")
    assert stat.S_ISCHR(null.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left


def test_a_pipe_gets_the_text_and_stays_a_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomic(str(fifo), ["a", "b"])
    reader.join(10)
    assert got == ["a\nb\n"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_regular_file_is_still_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    write_atomic(str(out), ["new"])
    assert out.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory: pass a file path"):
        write_atomic(str(tmp_path), ["x"])
