"""One sandbox, one fresh process per test (mlx_rlaif/sandbox/runs.py): each isolation guarantee
between the tests of one completion, tried by a hostile program, in `process` mode, in `process`
mode through the launcher's portable path (the one seatbelt uses on macOS: a stream socket, a
SIGCHLD wakeup instead of a pidfd, the run's process group killed until empty) and, where
bubblewrap works, `bwrap` mode.

The hostile program is the same for every test (as a completion's program is): its stdin says
which test it is. Test 0 attacks (a daemon left behind, files left in every writable place,
System V IPC objects, the output pipe held open, forged protocol messages, a stopped or killed
launcher), later tests report what they see; the trusted side must see only what each run
printed itself.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_sandbox import BWRAP_SKIP, assert_gone, live_with

from mlx_rlaif.sandbox import Limits, RunResult, Sandbox, SandboxError
from mlx_rlaif.sandbox import runs as runs_mod
from mlx_rlaif.sandbox.runs import portable, reuses_sandbox, run_each

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the guarantees tried here are Linux's (runs.py)")
FAST = Limits(timeout_s=3.0, cpu_s=3, memory_mb=512, file_size_mb=4, open_files=64,
              processes=16, output_bytes=1 << 16)


@pytest.fixture(scope="module", params=["process", "process-portable", "bwrap"])
def sb(request: pytest.FixtureRequest) -> Sandbox:
    mode, _, how = request.param.partition("-")
    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    sandbox = Sandbox(mode, slots=4, uid_base=64200)
    sandbox.portable_runs = how == "portable"  # runs.portable: the macOS path, here
    return sandbox


def run(sb: Sandbox, code: str, stdins: list[str], limits: Limits = FAST) -> list[RunResult]:
    with sb.box() as box:
        box.write("main.py", code)
        out = list(run_each(sb, box, "main.py", [s.encode() for s in stdins], limits,
                            python_file=True))
    assert not runs_mod._REFUSED  # no attack makes the portable path give up (runs._refused)
    return out


def test_one_sandbox_serves_every_test_as_a_fresh_process(
        sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    start = sb.start
    monkeypatch.setattr(sb, "start", lambda *a, **kw: starts.append(kw["runs"]) or start(*a, **kw))
    code = ("import os, sys\nn = int(input())\nprint(n * 2, os.getpid() > 0)\n"
            "print('err', n, file=sys.stderr)\nsys.exit(n % 3)\n")
    out = run(sb, code, [f"{i}\n" for i in range(7)])
    assert [r.stdout for r in out] == [f"{2 * i} True\n".encode() for i in range(7)]
    assert [r.stderr for r in out] == [f"err {i}\n".encode() for i in range(7)]
    assert [r.exit_code for r in out] == [i % 3 for i in range(7)]
    assert reuses_sandbox(sb) and len(starts) == 1
    assert starts[0]["portable"] == sb.portable_runs == portable(sb)


def test_what_a_run_leaves_in_its_process_group_is_killed(sb: Sandbox) -> None:
    """Test 0 leaves children in its own process group (no setsid): the portable path's
    sweep on macOS is this group kill; the next test sees none of them."""
    token = secrets.token_hex(8)
    code = ("import os, sys, time\nn = int(input())\n"
            "if n == 0:\n"
            "    for _ in range(3):\n"
            "        if os.fork() == 0:\n"
            f"            sys.argv[0] = '{token}'\n"
            "            time.sleep(60)\n            os._exit(0)\n"
            "    print('left', os.getpgrp() == os.getpid())\n"
            "else:\n"
            "    print('second', n)\n")
    first, second = run(sb, code, ["0", "1"])
    assert first.stdout == b"left True\n" and first.duration_s < 2.5, first
    assert second.stdout == b"second 1\n"
    assert_gone(token)


def test_timeouts_cpu_and_exceptions_are_per_run(sb: Sandbox) -> None:
    code = ("import sys, time\nn = int(input())\n"
            "if n == 0:\n    time.sleep(600)\n"
            "if n == 1:\n    while True:\n        pass\n"
            "if n == 2:\n    raise KeyError('boom')\n"
            "if n == 3:\n    sys.exit('bye')\n"
            "print('ok', n)\n")
    limits = Limits(timeout_s=4.0, cpu_s=1, output_bytes=4096)  # 1 s of CPU: a loaded machine
    t0 = time.monotonic()
    slow, spin, raised, message, ok = run(sb, code, ["0", "1", "2", "3", "4"], limits)
    assert slow.timed_out and slow.exit_code is None
    assert not spin.timed_out and spin.signal is not None  # SIGXCPU/SIGKILL: its own CPU budget
    assert raised.exit_code == 1 and b"KeyError: 'boom'" in raised.stderr
    assert message.exit_code == 1 and message.stderr == b"bye\n"
    assert ok.ok and ok.stdout == b"ok 4\n"
    assert time.monotonic() - t0 < 30


def test_a_daemon_left_behind_is_killed_before_the_next_test(sb: Sandbox) -> None:
    """Test 0 leaves a setsid daemon that keeps writing into every stdout it can reach through
    /proc and killing every process it may (the next test's included), and holds its own
    stdout open."""
    token = secrets.token_hex(8)
    code = ("import os, sys, time\nn = int(input())\n"
            "if n == 0:\n"
            "    main = os.getpid()\n"
            "    if os.fork() == 0:\n        os.setsid()\n"
            "        if os.fork() == 0:\n"
            f"            sys.argv[0] = '{token}'\n"
            "            while True:\n"
            "                for p in os.listdir('/proc'):\n"
            "                    if not p.isdigit() or int(p) in (os.getpid(), main):\n"
            "                        continue\n"
            "                    try:\n"
            "                        fd = os.open(f'/proc/{p}/fd/1', os.O_WRONLY | os.O_APPEND)\n"
            "                        os.write(fd, b'FORGED\\n'); os.close(fd)\n"
            "                    except OSError:\n                        pass\n"
            "                    try:\n                        os.kill(int(p), 9)\n"
            "                    except OSError:\n                        pass\n"
            "                print('daemon', flush=True)\n"
            "                time.sleep(0.01)\n"
            "        os._exit(0)\n"
            "    time.sleep(0.2)\n"
            "    print('first')\n"
            "else:\n    time.sleep(0.5)\n    print('second', n)\n")
    first, second, third = run(sb, code, ["0", "1", "2"])
    if sb.root:  # as non-root under bwrap the daemon may kill the launcher too: test 0 fails
        assert first.ok and b"first" in first.stdout
    assert second.stdout == b"second 1\n" and third.stdout == b"second 2\n"
    assert first.duration_s < 2.5  # the held pipe does not keep the run open: no pipe at all
    assert_gone(token)


def test_files_left_for_the_next_test_are_gone(sb: Sandbox) -> None:
    token = secrets.token_hex(8)
    places = ["", "~/", "/tmp/", "/dev/shm/", "/var/tmp/"]
    code = ("import os, sys\nn = int(input())\n"
            f"places = [os.path.expanduser(p) + '{token}' for p in {places!r}]\n"
            "if n == 0:\n"
            "    for p in places:\n"
            "        try:\n"
            "            open(p, 'w').write('left')\n"
            "            os.makedirs(p + '.d/x', exist_ok=True); os.chmod(p + '.d', 0)\n"
            "            print('wrote', p)\n"
            "        except OSError as e:\n            print('could not', p, e)\n"
            "    print(sorted(os.listdir('.')))\n"
            "    try:\n        open(sys.argv[0], 'a').write('\\nprint(\"PATCHED\")\\n')\n"
            "        print('patched the program')\n"
            "    except OSError as e:\n        print('program read-only', e.errno)\n"
            "else:\n"
            "    print('seen', [p for p in places if os.path.exists(p)], os.listdir('.'))\n")
    first, second = run(sb, code, ["0", "1"])
    assert first.ok, first.stderr
    assert b"wrote " in first.stdout and b"program read-only" in first.stdout, first.stdout
    shared = ["/var/tmp/", "/tmp/", "/dev/shm/"]  # the host's, in process mode
    if sb.mode == "process" and sb.root:
        shared = []
    elif sb.mode == "bwrap":
        shared = ["/var/tmp/"]  # bwrap binds no /var: test 0 could not write there
    leftover = [p for p in shared if f"{p}{token}".encode() in second.stdout]
    if sb.mode == "process" and not sb.root:
        pytest.skip("process mode as non-root: files outside the box are not covered")
    assert second.stdout == b"seen [] []\n", (second.stdout, leftover)
    assert b"PATCHED" not in second.stdout


def test_system_v_ipc_and_message_queues_do_not_carry_over(sb: Sandbox) -> None:
    if sb.mode == "process" and not sb.root:
        pytest.skip("process mode as non-root: IPC objects of our uid are not covered")
    key = secrets.randbelow(1 << 30) + 1
    code = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nn = int(input())\n"
            f"key = {key}\n"
            "if n == 0:\n"
            "    print('shm', libc.shmget(key, 4096, 0o1666) >= 0)\n"
            "    print('msg', libc.msgget(key, 0o1666) >= 0)\n"
            "    print('sem', libc.semget(key, 1, 0o1666) >= 0)\n"
            "    mq = libc.mq_open(b'/mlxrlaif%d' % key, 0o100 | 2, 0o666, None)\n"
            "    print('mq', mq >= 0)\n"
            "else:\n"
            "    print('found', [libc.shmget(key, 0, 0) >= 0, libc.msgget(key, 0) >= 0,\n"
            "                    libc.semget(key, 0, 0) >= 0,\n"
            "                    libc.mq_open(b'/mlxrlaif%d' % key, 2) >= 0])\n")
    first, second = run(sb, code, ["0", "1"])
    assert first.ok, first.stderr
    assert b"shm True" in first.stdout and b"mq False" in first.stdout, first.stdout
    assert second.stdout == b"found [False, False, False, False]\n", second.stdout


def test_forged_protocol_messages_change_nothing(sb: Sandbox) -> None:
    """The program writes the launcher's answers and our status lines everywhere it can: into
    its output and into every fd number it might have inherited; the verdict is its own."""
    code = ("import os, socket, sys\nn = int(input())\n"
            "for line in ['X 0', 'T', 'E boom', 'R', 'S 9', 'K']:\n"
            "    print(line); print(line, file=sys.stderr)\n"
            "    for fd in range(3, 256):\n"
            "        try:\n            os.write(fd, (line + '\\n').encode())\n"
            "        except OSError:\n            pass\n"
            "        try:\n"
            "            socket.socket(fileno=fd).send(line.encode())\n"
            "        except OSError:\n            pass\n"
            "sys.exit(3 + n)\n")
    out = run(sb, code, ["0", "1", "2"])
    assert [r.exit_code for r in out] == [3, 4, 5]
    assert all(not r.timed_out and r.signal is None for r in out)


def test_a_stopped_or_killed_launcher_fails_only_that_test(sb: Sandbox) -> None:
    """A program that stops or kills its parent (the launcher, where it may: same uid) loses
    that test; the next tests run in a fresh sandbox."""
    code = ("import os, signal, time\nn = int(input())\n"
            "if n == 0:\n    os.kill(os.getppid(), signal.SIGSTOP)\n    time.sleep(5)\n"
            "if n == 1:\n    os.kill(os.getppid(), signal.SIGKILL)\n    time.sleep(5)\n"
            "print('ok', n)\n")
    limits = Limits(timeout_s=1.0, output_bytes=4096)
    out = run(sb, code, ["0", "1", "2", "3"], limits)
    assert [r.stdout for r in out[2:]] == [b"ok 2\n", b"ok 3\n"]
    for r in out[:2]:
        assert not r.ok


def test_memory_watchdog_kills_one_test_and_the_rest_run(sb: Sandbox) -> None:
    code = ("import time\nn = int(input())\n"
            "if n == 0:\n    x = bytearray(200 << 20)\n"
            "    for i in range(0, len(x), 4096):\n        x[i] = 1\n    time.sleep(5)\n"
            "print('ok', n)\n")
    limits = Limits(timeout_s=4.0, memory_mb=512, rss_mb=96, output_bytes=4096)
    over, ok = run(sb, code, ["0", "1"], limits)
    assert over.over_memory and not over.ok
    assert ok.ok and ok.stdout == b"ok 1\n"


def test_output_capped_per_run_and_closing_early_stops(sb: Sandbox) -> None:
    code = "import sys\nn = int(input())\nsys.stdout.write('x' * (n * 40000))\n"
    limits = Limits(output_bytes=50000)
    with sb.box() as box:
        box.write("main.py", code)
        runs = run_each(sb, box, "main.py", [b"1", b"2", b"3"], limits, python_file=True)
        first, second = next(runs), next(runs)
        runs.close()  # the third never runs; the sandbox is gone
    assert (len(first.stdout), first.truncated) == (40000, False)
    assert (len(second.stdout), second.truncated) == (50000, True)


def test_a_program_that_is_not_a_file_is_our_error(sb: Sandbox) -> None:
    with sb.box() as box, tempfile.NamedTemporaryFile() as outside:
        (box.host / "prog").symlink_to(outside.name)
        with pytest.raises(SandboxError, match="prog"):
            list(run_each(sb, box, "prog", [b""], FAST))
    with sb.box() as box:
        box.write("prog", b"\x7fELF not really")
        box.host.joinpath("prog").chmod(0o755)
        with pytest.raises(SandboxError, match="exec"):
            list(run_each(sb, box, "prog", [b""], FAST))
    assert not runs_mod._REFUSED  # the program's fault: the portable path is not given up


def test_compiled_program_many_runs(sb: Sandbox) -> None:
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    with sb.box() as box:
        src = box.host / "p.c"
        src.write_text("#include <stdio.h>\nint main(){int a;if(scanf(\"%d\",&a)!=1)return 9;"
                       "printf(\"%d\\n\",a*a);return a==3;}\n")
        import subprocess

        subprocess.run([cc, "-o", str(box.host / "prog"), str(src)], check=True)
        out = list(run_each(sb, box, "prog", [b"2", b"3", b"x"], FAST))
    assert [(r.stdout, r.exit_code) for r in out] == [(b"4\n", 0), (b"9\n", 1), (b"", 9)]
    assert Path(box.host).exists() is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
@pytest.mark.parametrize("which", ["box", "launcher"])
def test_unreadable_directories_are_removed_as_their_owner(which: str) -> None:
    """A run leaves `d/x` with `d` at mode 0 (and a link out): without root's override, the
    trusted side (runs.empty, before a restart) and the launcher (launcher._empty, as the run's
    own uid under bwrap) must still empty the box; before, Python's rmtree handed their error
    handler os.open, which it called with one argument (a TypeError that ended the launcher,
    and the restarted sandbox's next test saw the directory)."""
    from mlx_rlaif.sandbox import box as box_mod
    from mlx_rlaif.sandbox import launcher, runs

    empty = runs.empty if which == "box" else launcher._empty
    tmp_path = Path(tempfile.mkdtemp(prefix="mlx-rlaif-test-"))  # pytest's is root's alone
    tmp_path.chmod(0o755)
    top = tmp_path / "box"
    top.mkdir()
    os.chown(top, 65534, 65534)
    pid = os.fork()
    if pid == 0:  # the run's uid, without root's override
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            (top / "d" / "x").mkdir(parents=True)
            (top / "d" / "x" / "f").write_text("left")
            (top / "d" / "link").symlink_to(tmp_path)
            (top / "d").chmod(0)
            empty(top if which == "box" else str(top))
            code = 1 if os.listdir(top) else 0
        except BaseException:  # noqa: BLE001 - the exit code is the verdict
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 0
        assert tmp_path.exists()  # the link's target untouched
    finally:
        box_mod._rmtree(tmp_path)


# --- the portable path's own parts, as a macOS launcher runs them (no subreaper, no /proc) ---


@pytest.fixture()
def sigchld():
    """The launcher's SIGCHLD handler and wakeup fd installed in this process, then undone."""
    import signal

    from mlx_rlaif.sandbox import launcher

    handler = signal.getsignal(signal.SIGCHLD)
    wake = launcher._wakeup()
    try:
        yield wake
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, handler)
        os.close(wake)


def _group(token: str, then: str) -> int:
    """A child in a process group of its own, with two members left sleeping (no subreaper
    here: when the child ends they are init's, as a macOS launcher's would be)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for _ in range(2):
                if os.fork() == 0:
                    os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 60; :", token])
            if then == "sleep":
                time.sleep(60)
        finally:
            os._exit(0)
    return pid


def test_portable_wait_wakes_at_the_end_and_kills_at_the_deadline(sigchld: int) -> None:
    import select

    from mlx_rlaif.sandbox import launcher

    token = secrets.token_hex(8)
    child = _group(token, "exit")
    t0 = time.monotonic()
    st, verdict = launcher._wait_portable(child, 10.0, sigchld, select)
    assert verdict is None and os.waitstatus_to_exitcode(st) == 0
    assert time.monotonic() - t0 < 0.9  # woken by SIGCHLD, not the 1 s poll
    assert live_with(token)  # the group's members outlive it: the sweep is what kills them
    launcher._kill_group(child)
    time.sleep(0.05)
    assert_gone(token)

    slow = _group(token, "sleep")
    t0 = time.monotonic()
    st, verdict = launcher._wait_portable(slow, 0.3, sigchld, select)
    assert verdict == "T" and os.WIFSIGNALED(st) and time.monotonic() - t0 < 1.5
    time.sleep(0.05)
    assert_gone(token)  # the deadline killed the whole group


@pytest.mark.parametrize("what", ["vanished", "link"])
def test_the_launchers_rmtree_never_changes_the_directory_holding_the_tree(
        tmp_path: Path, what: str) -> None:
    """Emptying /tmp in process mode as root (launcher._wipe) removes a run's directory with
    launcher._rmtree. Its error handler made the directory holding the failed path 0700: where
    that path itself failed (gone by then, or a link by then) it made the host's /tmp 0700, and
    every later run of every user failed. It may open up only what lies inside the tree."""
    from mlx_rlaif.sandbox import launcher

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / what
    if what == "link":
        target.symlink_to(tmp_path)
    outside = tmp_path.stat().st_mode
    launcher._rmtree(str(target))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert tmp_path.stat().st_mode == outside  # a link's target is never touched
