"""The sandbox (mlx_rlaif/sandbox.py): limits, isolation and cleanup, in each mode that works here.

Every test runs in `process` mode and, where bubblewrap works, in `bwrap` mode. Hostile programs
target the test process itself (it stands for the trainer): its pid, its environment, its
directories, a socket it listens on.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mlx_rlaif.errors import ConfigError
from mlx_rlaif.sandbox import Limits, RunResult, Sandbox, SandboxError
from mlx_rlaif.sandbox.modes import UID_SPAN, bwrap_problem, choose_mode

FAST = Limits(timeout_s=3.0, cpu_s=3, memory_mb=512, file_size_mb=4, open_files=64,
              processes=16, output_bytes=4096)
BWRAP_SKIP = None if sys.platform.startswith("linux") and bwrap_problem() is None else (
    f"bubblewrap does not work here: {bwrap_problem() if sys.platform.startswith('linux') else 'not Linux'}")


@pytest.fixture(scope="module", params=["process", "bwrap"])
def sb(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    return Sandbox(request.param, slots=4, uid_base=64100)


def run_py(sb: Sandbox, code: str, limits: Limits = FAST, args: tuple[str, ...] = (),
           **kw) -> RunResult:
    with sb.box() as box:
        path = box.write("main.py", code)
        return sb.run(box, [path, *args], limits, python_file=True, **kw)


def live_with(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line holds `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmd and state != "Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def assert_gone(token: str) -> None:
    left = {pid: Path(f"/proc/{pid}/stat").read_text()[:120] for pid in live_with(token)}
    assert left == {}


def needs_isolation(sb: Sandbox) -> None:
    if not sb.uid_isolated:
        pytest.skip("process mode as non-root: runs have our uid (documented as not covered)")


# --- basics ---------------------------------------------------------------------------------


def test_fresh_box_clean_environment_closed_stdin(sb: Sandbox) -> None:
    code = ("import os, sys\nprint(sorted(os.environ))\nprint(os.getcwd())\n"
            "print(sorted(os.listdir('.')))\nprint(repr(sys.stdin.read()))\nprint(os.getuid())\n")
    with sb.box() as box:
        path = box.write("main.py", code)
        r = sb.run(box, [path], FAST, python_file=True)
        inside = box.inside
    env, cwd, files, stdin, uid = r.stdout.decode().splitlines()
    assert r.ok, r.stderr
    assert set(eval(env)) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD"}
    assert cwd == inside and eval(files) == ["main.py"] and stdin == "''"
    if os.geteuid() == 0:
        # an unprivileged uid of the pool, not root: from uid_base up, past the uids other runs
        # on this machine hold (modes.UidPool skips those; CI met 64104 beside another run)
        assert int(uid) in range(64100, 64100 + UID_SPAN)


def test_exit_code_signal_and_sandbox_failure(sb: Sandbox) -> None:
    assert run_py(sb, "raise SystemExit(3)").exit_code == 3
    r = run_py(sb, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (r.exit_code, r.signal) == (None, signal.SIGSEGV)
    assert r.describe() == "killed by SIGSEGV"
    with sb.box() as box, pytest.raises(SandboxError, match="exec"):
        sb.run(box, ["/no/such/program"], FAST)  # our failure, not the program's


def test_wall_clock_timeout_kills_sleeper(sb: Sandbox) -> None:
    token = secrets.token_hex(8)
    r = run_py(sb, "import time\ntime.sleep(600)\n", Limits(timeout_s=1.0), args=(token,))
    assert r.timed_out and r.exit_code is None
    assert_gone(token)


def test_cpu_limit(sb: Sandbox) -> None:
    r = run_py(sb, "while True:\n    pass\n", Limits(timeout_s=60.0, cpu_s=1))
    assert not r.timed_out
    assert r.signal in (signal.SIGXCPU, signal.SIGKILL)


def test_memory_limit(sb: Sandbox) -> None:
    r = run_py(sb, "x = bytearray(1 << 30)\n", Limits(memory_mb=256))
    assert r.exit_code == 1 and b"MemoryError" in r.stderr


def test_output_capped(sb: Sandbox) -> None:
    r = run_py(sb, "import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 10000)\n")
    assert r.truncated and len(r.stdout) == FAST.output_bytes


def test_file_size_and_open_files_limits(sb: Sandbox) -> None:
    r = run_py(sb, "open('big', 'wb').write(b'x' * (8 << 20))\n")  # FAST allows 4 MB
    assert r.exit_code == 1 and b"File too large" in r.stderr
    r = run_py(sb, "fs = [open('f%d' % i, 'w') for i in range(100)]\n")
    assert r.exit_code == 1 and b"Too many open files" in r.stderr


# --- hostile programs -------------------------------------------------------------------------


def test_fork_bomb_contained_and_cleaned_up(sb: Sandbox) -> None:
    token = secrets.token_hex(8)
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_py(sb, code, Limits(timeout_s=2.0, processes=16), args=(token,))
    assert r.timed_out
    assert_gone(token)


def test_double_fork_setsid_grandchild_is_killed(sb: Sandbox) -> None:
    token = secrets.token_hex(8)
    code = ("import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        print('grandchild started', flush=True)\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time  # {token}\\n"
            "time.sleep(600)'])\n"
            "    os._exit(0)\n"
            "time.sleep(1.0)\n")
    r = run_py(sb, code, Limits(timeout_s=10.0))
    assert r.ok and b"grandchild started" in r.stdout
    assert_gone(token)


def test_cannot_kill_the_parent(sb: Sandbox) -> None:
    needs_isolation(sb)
    bystander = subprocess.Popen(["sleep", "60"])  # a process of ours the run must not reach
    try:
        code = ("import os, sys\n"
                "for pid in [os.getppid(), int(sys.argv[1]), int(sys.argv[2]), 1, -1]:\n"
                "    try:\n        os.kill(pid, 9)\n        print('killed', pid)\n"
                "    except OSError as e:\n        print('refused', pid, e.errno)\n")
        r = run_py(sb, code, args=(str(os.getpid()), str(bystander.pid)))
        assert bystander.poll() is None  # still running; so are we
        for pid in (os.getpid(), bystander.pid, 1):
            assert f"refused {pid} ".encode() in r.stdout
    finally:
        bystander.kill()
        bystander.wait()


def test_environment_canary_never_leaks(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_isolation(sb)
    canary = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv("MLX_RLAIF_TEST_SECRET_KEY", canary)
    code = ("import os, sys\n"
            "print(dict(os.environ))\n"
            "for pid in ['self', str(os.getppid()), sys.argv[1], '1'] + os.listdir('/proc'):\n"
            "    for what in ('environ', 'cmdline'):\n"
            "        try:\n"
            "            print(pid, what, open(f'/proc/{pid}/{what}', 'rb').read())\n"
            "        except Exception as e:\n"
            "            print(pid, what, 'error', e)\n")
    r = run_py(sb, code, Limits(output_bytes=1 << 22), args=(str(os.getpid()),))
    assert b"error" in r.stdout and not r.truncated
    assert canary.encode() not in r.stdout + r.stderr


def test_cannot_write_outside_the_box(sb: Sandbox, tmp_path: Path) -> None:
    needs_isolation(sb)
    token = secrets.token_hex(8)
    targets = [tmp_path / token, Path.cwd() / token, Path.home() / token,
               Path(__file__).parent / token]
    private = [Path("/tmp") / token] if sb.mode == "bwrap" else []  # its own /tmp (a tmpfs)
    code = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p, 'w').write('x')\n"
            "        print('wrote', p)\n    except OSError as e:\n        print('refused', p)\n")
    r = run_py(sb, code, args=tuple(map(str, targets + private)))
    for t in targets:
        assert f"refused {t}".encode() in r.stdout
    assert not any(t.exists() for t in targets + private)


def test_no_network(sb: Sandbox) -> None:
    if not sb.network_isolated:
        pytest.skip("process mode as non-root: network not isolated (documented)")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(64))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = ("import socket, sys\ntry:\n"
            "    s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2)\n"
            "    s.sendall(b'hello'); print('connected')\n"
            "except OSError as e:\n    print('no network', e.errno)\n")
    try:
        r = run_py(sb, code, args=(str(server.getsockname()[1]),))
    finally:
        stop.set()
        thread.join()
        server.close()
    assert b"no network" in r.stdout and accepted == []


# --- modes ------------------------------------------------------------------------------------


def test_mode_choice() -> None:
    with pytest.raises(ConfigError, match="not one of"):
        choose_mode("docker")
    assert choose_mode("process")[0] == "process"
    if sys.platform.startswith("linux"):
        with pytest.raises(ConfigError, match="seatbelt"):
            choose_mode("seatbelt")
        if bwrap_problem() is None or os.geteuid() == 0:
            expected = "bwrap" if bwrap_problem() is None else "process"
            assert choose_mode("auto")[0] == expected
        else:  # your own rights are your choice (tests/test_isolation_choice.py)
            with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
                choose_mode("auto")


def test_bad_python_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reward.exec.python"):
        Sandbox("process", python="/bin/false")


# --- clean-up of what a student builds (issue 57) ---------------------------------------------

DEEP = 1700  # past Python's recursion limit: a recursive rmtree raises RecursionError
DEEP_TREE = ("import os\n"
             "def deep():\n"
             "    top = os.getcwd()\n"
             f"    for _ in range({DEEP}):\n"
             "        os.mkdir('d')\n"
             "        os.chdir('d')\n"
             "    open('f', 'w').write('x')\n"
             "    os.chmod('.', 0o500)\n"  # a directory it cannot be emptied through as is
             "    os.chdir(top)\n")


@pytest.fixture
def own_tmp(monkeypatch: pytest.MonkeyPatch):
    """A temporary directory of this test's own for the boxes (others' tests make boxes in
    /tmp at the same time); traversable by a slot's uid."""
    import tempfile

    d = tempfile.mkdtemp(prefix="mlx-rlaif-test-")
    os.chmod(d, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", d)
    yield d
    os.rmdir(d)  # empty: nothing of the run's was left


@pytest.mark.parametrize("fmt", ["calls", "stdio"])
def test_a_tree_deeper_than_the_recursion_limit_keeps_its_failing_verdict(
        sb: Sandbox, fmt: str, own_tmp: str) -> None:
    """A wrong answer that builds a directory tree 1,700 levels deep in its box is still scored
    (0, not unscorable: an unscorable completion would escape its negative advantage), and its
    box is gone: clean-up never recurses on the student's depth (box.py, launcher.py, runs.py)."""
    from mlx_rlaif.config import ExecConfig
    from mlx_rlaif.records import Task
    from mlx_rlaif.rewards.exec import ExecReward

    if fmt == "calls":
        task = Task(id="add", prompt="add", entry_point="add",
                    tests=({"args": [1, 2], "expected": 3}, {"args": [5, 5], "expected": 10}))
        code = DEEP_TREE + "def add(a, b):\n    deep()\n    return a - b\n"
    else:
        task = Task(id="sum", prompt="sum", tests=({"stdin": "1 2\n", "stdout": "3\n"},
                                                   {"stdin": "5 5\n", "stdout": "10\n"}))
        code = DEEP_TREE + "deep()\nprint(0)\n"
    reward = ExecReward(ExecConfig(sandbox=sb.mode, workers=1, cache_size=0, timeout_s=20.0,
                                   cpu_s=20, uid_base=64100))
    try:
        [r] = reward.score([task], [code])
    finally:
        reward.close()
    assert r.value is not None, r.reason
    assert r.parts["tests"] == 0.0 and "RecursionError" not in r.reason
    assert os.listdir(own_tmp) == []
