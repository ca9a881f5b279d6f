"""A run's stdout and stderr are memfds where Linux has them (runs.py `run_file`): memory, not
disk. The file-size limit must still bound them, or a flood would fill the trainer's RAM."""

from __future__ import annotations

import sys

import pytest
from test_sandbox import BWRAP_SKIP

from mlx_rlaif.sandbox import Limits, Sandbox
from mlx_rlaif.sandbox.runs import run_each, run_file

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd is Linux's")
FLOOD = ("import sys\nout = sys.stdout.buffer if input() == 'out' else sys.stderr.buffer\n"
         "for i in range(64):\n    out.write(b'x' * (1 << 20))\n    out.flush()\n"
         "print('wrote 64 MB', file=sys.stderr)\n")


def test_run_files_are_memfds_here():
    with run_file() as f:
        assert "memfd:" in __import__("os").readlink(f"/proc/self/fd/{f.fileno()}")


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_a_flood_of_output_stops_at_the_file_size_limit(mode):
    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    sb = Sandbox(mode, slots=1, uid_base=64760)
    limits = Limits(timeout_s=10.0, file_size_mb=4, output_bytes=1 << 16)
    with sb.box() as box:
        box.write("main.py", FLOOD)
        out, err = run_each(sb, box, "main.py", [b"out\n", b"err\n"], limits, python_file=True)
    for r in (out, err):
        assert r.exit_code == 1 and r.truncated, r
        assert b"wrote 64 MB" not in r.stderr
    assert b"File too large" in out.stderr  # EFBIG: RLIMIT_FSIZE applies to the memfd
