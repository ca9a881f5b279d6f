"""One run's files (the checker's task and tests, the student's code and results) are readable
by that run's sandboxes only: not by a concurrent run, not by the next one. Checked in every
mode that works here, with a run that searches the temporary directories for other runs' boxes
and reads what it finds.

Not covered: process mode as an unprivileged user (the runs have your uid: they read each
other's boxes; `sandbox: auto` refuses it, tests/test_isolation_choice.py); macOS (the seatbelt
profile reads only its own box: tests/test_seatbelt.py holds that rule).
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile

import pytest

from mlx_rlaif.sandbox import Limits, Sandbox
from mlx_rlaif.sandbox.modes import bwrap_problem

BWRAP_SKIP = None if sys.platform.startswith("linux") and bwrap_problem() is None else (
    "bubblewrap does not work here")
LIMITS = Limits(timeout_s=20.0, cpu_s=10, memory_mb=512)

SEARCH = """import glob, os, sys
found = []
for pattern in sys.argv[1:]:
    for path in glob.glob(pattern, recursive=True):
        try:
            with open(path) as f:
                found.append(f.read())
        except OSError as e:
            found.append(f"refused {e.errno}")
print("|".join(found))
"""


@pytest.fixture(params=["process", "bwrap"])
def sb(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    s = Sandbox(request.param, slots=3, uid_base=64600)
    if not s.uid_isolated:
        pytest.skip("process mode as non-root: runs share your uid (documented)")
    return s


def test_a_runs_files_are_its_own(sb: Sandbox) -> None:
    secret = "expected-answer-" + secrets.token_hex(8)
    tmp = tempfile.gettempdir()
    patterns = [f"{tmp}/mlx-rlaif-box-*/**", "/tmp/mlx-rlaif-box-*/**", "/box/**"]
    with sb.box() as checker:
        checker.write("task.json", f'{{"expected": "{secret}"}}')  # as exec reward writes it
        # the checked run's own results, written by its program (the launcher's umask)
        r = sb.run(checker, [checker.write("main.py", f"open('result', 'w').write({secret!r})"
                                           )], LIMITS, python_file=True)
        assert r.ok, r.stderr
        own = sb.run(checker, [checker.write("search.py", SEARCH), *patterns], LIMITS,
                     python_file=True)
        assert own.stdout.count(secret.encode()) >= 2, own.stdout  # its own box: readable
        with sb.box() as other:  # a concurrent run: another completion, another task
            direct = [str(checker.host / "task.json"), str(checker.host / "result")]
            r = sb.run(other, [other.write("search.py", SEARCH), *patterns, *direct], LIMITS,
                       python_file=True)
            assert r.ok and secret.encode() not in r.stdout + r.stderr, r.stdout
    with sb.box() as later:  # the next run: nothing of the last one is left to read
        r = sb.run(later, [later.write("search.py", SEARCH), *patterns, *direct], LIMITS,
                   python_file=True)
        assert r.ok and secret.encode() not in r.stdout + r.stderr, r.stdout
    assert not os.path.exists(checker.host)


def test_a_programs_copy_is_its_own(sb: Sandbox) -> None:
    """The stdin/stdout tests' program, copied out of the box for its runs (runs.py), is read by
    those runs only: a concurrent run (another completion of the same group, say) cannot read
    or execute it to pass on its work."""
    from mlx_rlaif.sandbox.runs import run_each

    secret = "solution-" + secrets.token_hex(8)
    program = f"import time\n# {secret}\nprint(input())\ntime.sleep(2)\n"
    patterns = ["/tmp/mlx-rlaif-prog-*/**", f"{tempfile.gettempdir()}/mlx-rlaif-prog-*/**",
                "/prog/**"]
    with sb.box() as owner, sb.box() as other:
        owner.write("solution.py", program)
        runs = run_each(sb, owner, "solution.py", [b"a\n", b"b\n"], LIMITS, python_file=True)
        first = next(runs)  # the program directory exists while the runs go on
        assert first.ok and first.stdout == b"a\n", first.stderr
        r = sb.run(other, [other.write("search.py", SEARCH), *patterns], LIMITS,
                   python_file=True)
        assert r.ok and secret.encode() not in r.stdout + r.stderr, r.stdout
        assert [x.stdout for x in runs] == [b"b\n"]
