"""A sandbox self-test (`mlx-rlaif doctor`): a trivial program must run and print its answer; a
hostile one must be contained: killed at its time limit, held to its memory limit, and, where
the mode claims it, cut off from the network and from files outside its box.

Not covered: the full set of escapes tests/test_sandbox.py tries (forged verdicts, orphans,
signals to the trainer); this is a quick check of the machine a run is about to use.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from .box import Limits, RunResult, Sandbox

TRIVIAL = "print(sum(range(10)))\n"
HOSTILE = """import socket, sys
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1).close()
    print("network: open")
except OSError:
    print("network: blocked")
try:
    open(sys.argv[1], "w").write("escaped")
    print("write: done")
except OSError:
    print("write: blocked")
try:
    hog = bytearray(1 << 30)
    print("memory: allocated")
except MemoryError:
    print("memory: blocked")
sys.stdout.flush()
while True:
    pass
"""
LIMITS = Limits(timeout_s=2.0, cpu_s=5, memory_mb=256)  # the hostile program's
TRIVIAL_LIMITS = Limits(timeout_s=30.0, cpu_s=10, memory_mb=256)  # a loaded machine is slow


@dataclass(frozen=True)
class Check:
    """One property: ok True (held), False (broken) or None (the mode does not claim it)."""

    name: str
    ok: bool | None
    detail: str


def run_program(sandbox: Sandbox, source: str, *args: str, limits: Limits | None = None
                ) -> RunResult:
    """`source` run as a Python file in a fresh box (LIMITS unless `limits` is given)."""
    with sandbox.box() as box:
        return sandbox.run(box, [box.write("main.py", source), *args], limits or LIMITS,
                           python_file=True)


def self_test(sandbox: Sandbox) -> list[Check]:
    """The trivial program, then each property of the hostile one."""
    trivial = run_program(sandbox, TRIVIAL, limits=TRIVIAL_LIMITS)
    checks = [Check("trivial program", trivial.ok and trivial.stdout.strip() == b"45",
                    trivial.describe())]
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-doctor-") as outside:
        target = Path(outside) / "escaped"
        hostile = run_program(sandbox, HOSTILE, str(target))
        escaped = target.exists()
    out = hostile.stdout
    checks += [
        Check("killed at its time limit", hostile.timed_out, hostile.describe()),
        Check("memory limit held", b"memory: blocked" in out, f"{LIMITS.memory_mb} MB"),
        Check("network blocked", (b"network: blocked" in out) if sandbox.network_isolated
              else None, "" if sandbox.network_isolated else f"{sandbox.mode} mode has network"),
        Check("writes outside its box blocked", not escaped if sandbox.uid_isolated else None,
              "" if sandbox.uid_isolated else f"{sandbox.mode} mode runs as your uid"),
    ]
    return checks
