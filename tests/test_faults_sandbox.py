"""Fault injection, hostile student code, widened (beyond tests/test_sandbox.py and the battery of
tests/test_exec_reward.py): libc through ctypes, the parent's /proc and open files, writes to a
working tree, home and /tmp, UDP / Unix / abstract sockets, ptrace and signals to other
processes, raising its own limits, thread storms, unbounded recursion, memory spread over
processes (the resident-memory watchdog), sabotage of the cleanup, and, for C++ and Rust,
compile-time bombs and `#include` of files outside.

Each program runs in every sandbox mode that works here; the test process stands for the
trainer. What counts as contained is checked on the trusted side (the victim files, processes
and sockets of this process), and the program's own report where only it can tell. Each mode
must contain exactly what sandbox/box.py says it covers: `gaps()` lists what it does not, and
a program contained that is listed there fails too (the documentation would be wrong). The counts
go to docs/reliability.md (`pytest -s` prints them).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mlx_rlaif.config import ExecConfig
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.exec import ExecReward
from mlx_rlaif.sandbox import Limits, Sandbox
from mlx_rlaif.sandbox.modes import bwrap_problem

BWRAP_SKIP = None if sys.platform.startswith("linux") and bwrap_problem() is None else (
    "bubblewrap does not work here")
LIMITS = Limits(timeout_s=4.0, cpu_s=4, memory_mb=512, file_size_mb=4, open_files=64,
                processes=16, output_bytes=1 << 16)

LIBC = "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
PROGRAMS = {
    # name: code; argv: [trainer pid, bystander pid, token, udp port, tcp port, secret path,
    # world-readable path, world-writable dir, unix socket path, victim path]
    "ctypes: setuid(0), mount, sethostname": LIBC + (
        "print('setuid', libc.setuid(0), os.geteuid())\n"
        "print('mount', libc.mount(b'none', b'/mnt', b'tmpfs', 0, None))\n"
        "print('sethostname', libc.sethostname(b'pwned', 5))\n"
        "os.makedirs(sys.argv[8] + '/x', exist_ok=True)\n"),
    "ctypes: kill the trainer and a bystander": LIBC + (
        "for pid in (int(sys.argv[1]), int(sys.argv[2]), -1):\n"
        "    print('kill', pid, libc.kill(pid, 9), ctypes.get_errno())\n"),
    "ctypes: unshare a user namespace, then write outside": LIBC + (
        "print('unshare', libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())\n"
        "for p in (sys.argv[8] + '/from-userns', os.path.expanduser('~root') + '/pwned'):\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('refused', p, e.errno)\n"),
    "ptrace the bystander": LIBC + (
        "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
        "r = libc.ptrace(16, int(sys.argv[2]), None, None)\n"
        "if r == 0:\n    os.waitpid(int(sys.argv[2]), 0x40000000)\n"
        "    libc.ptrace(17, int(sys.argv[2]), None, None); print('ATTACHED')\n"
        "print('ptrace', r, ctypes.get_errno())\n"),
    "signal other processes (kill -1, the bystander)": (
        "import os, signal, sys\n"
        "for pid in (int(sys.argv[2]), int(sys.argv[1]), -1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid)\n"
        "    except OSError as e:\n        print('refused', pid, e.errno)\n"),
    "read the parent's /proc (environ, cmdline, maps, mem)": (
        "import os, sys\nout = []\n"
        "for pid in {str(os.getppid()), sys.argv[1], sys.argv[2], '1'}:\n"
        "    for what in ('environ', 'cmdline', 'maps', 'mem', 'status'):\n"
        "        try:\n            out.append(open(f'/proc/{pid}/{what}', 'rb').read(1 << 16))\n"
        "        except Exception as e:\n            out.append(repr(e).encode())\n"
        "sys.stdout.buffer.write(b'|'.join(out))\n"),
    "read the parent's open files (/proc/<pid>/fd, inherited fds)": (
        "import os, sys\nout = []\n"
        "d = f'/proc/{sys.argv[1]}/fd'\n"
        "try:\n    fds = os.listdir(d)\nexcept OSError as e:\n    fds = []; out.append(repr(e))\n"
        "for fd in fds:\n    try:\n        out.append(open(f'{d}/{fd}', 'rb').read(4096).decode("
        "errors='replace'))\n    except Exception as e:\n        out.append(repr(e))\n"
        "for fd in range(3, 256):\n    try:\n        out.append(os.read(fd, 4096).decode("
        "errors='replace'))\n    except OSError:\n        pass\n"
        "print('|'.join(out))\n"),
    "read a secret file of the trainer's (0600)": (
        "import sys\ntry:\n    print(open(sys.argv[6]).read())\nexcept OSError as e:\n"
        "    print('refused', e.errno)\n"),
    "read a world-readable file outside the box": (
        "import sys\ntry:\n    print(open(sys.argv[7]).read())\nexcept OSError as e:\n"
        "    print('refused', e.errno)\n"),
    "write into a working tree and home": (
        "import os, sys\nfor p in (sys.argv[8] + '/worktree-file', os.path.expanduser('~root') + "
        "'/' + sys.argv[3], '/root/' + sys.argv[3]):\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('refused', p, e.errno)\n"),
    "fill /tmp and /dev/shm": (
        "import sys\nfor d in ('/tmp', '/dev/shm'):\n    for i in range(40):\n"
        "        try:\n            open(f'{d}/fill-{sys.argv[3]}-{i}', 'wb').write(b'x' * (1 << 20))\n"
        "        except OSError as e:\n            print('stopped', d, i, e.errno); break\n"),
    "UDP datagram to the trainer's port": (
        "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n    s.sendto(b'hello', ('127.0.0.1', int(sys.argv[4]))); print('sent')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"),
    "TCP connection to the trainer's port": (
        "import socket, sys\ntry:\n"
        "    socket.create_connection(('127.0.0.1', int(sys.argv[5])), timeout=1).sendall(b'hi')\n"
        "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n"),
    "Unix socket of the host (world-writable, like X11's)": (
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
        "    s.connect(sys.argv[9]); s.sendall(b'hi'); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"),
    "abstract Unix socket": (
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
        "    s.connect('\\0mlx-rlaif-' + sys.argv[3]); s.sendall(b'hi'); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"),
    "raise its own limits": (
        "import resource\nfor n in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_NOFILE',"
        " 'RLIMIT_FSIZE'):\n    r = getattr(resource, n)\n    try:\n"
        "        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print('RAISED', n)\n    except (ValueError, OSError):\n        print('refused', n)\n"),
    "thread storm": (
        "import threading, time\nn = 0\ntry:\n    while True:\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n    print('stopped at', n)\n"),
    "unbounded recursion": (
        "import sys\nsys.setrecursionlimit(1 << 30)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n"),
    "memory spread over 6 processes (RSS watchdog)": (
        "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
        "        b = bytearray(120 << 20)\n        b[::4096] = b'x' * len(b[::4096])\n"
        "        time.sleep(60)\n        os._exit(0)\ntime.sleep(60)\n"),
    "delete its own box": (
        "import os, shutil\nbox = os.getcwd()\nos.chdir('/')\nshutil.rmtree(box, "
        "ignore_errors=True)\nprint('removed', box, os.path.exists(box))\n"),
    "swap its box for a symlink to a directory of the trainer's": (
        "import os, sys\nbox = os.getcwd()\nos.chdir('/')\n"
        "try:\n    os.rename(box, box + '-moved'); os.symlink(sys.argv[8], box); print('swapped')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"),
    "sabotage the cleanup (read-only dirs, chmod 000, symlink out)": (
        "import os, sys\nos.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\n"
        "os.symlink(sys.argv[10], 'a/b/link')\nos.chmod('a/b/c', 0o500)\nos.chmod('a/b', 0o500)\n"
        "os.chmod('a', 0)\nos.chmod('.', 0o500)\n"),
}


# not run where documented as not contained: as our own uid they would kill or stop this process
# and every other one of ours (they count as not contained there)
HARMFUL = {"ctypes: kill the trainer and a bystander", "ptrace the bystander",
           "signal other processes (kill -1, the bystander)"}


def gaps(sb: Sandbox) -> set[str]:
    """What a mode does not contain here (sandbox/box.py's "Not covered", for this user)."""
    out: set[str] = set()
    if sb.mode != "process":
        return out
    out.add("Unix socket of the host (world-writable, like X11's)")  # not a network namespace thing
    out.add("read a world-readable file outside the box")  # the system's files must be readable
    if not sb.uid_isolated:  # non-root: the run has our uid
        out |= {"ctypes: kill the trainer and a bystander", "ptrace the bystander",
                "signal other processes (kill -1, the bystander)", "fill /tmp and /dev/shm",
                "read the parent's /proc (environ, cmdline, maps, mem)",
                "read the parent's open files (/proc/<pid>/fd, inherited fds)",
                "write into a working tree and home", "ctypes: setuid(0), mount, sethostname",
                "read a secret file of the trainer's (0600)",
                "ctypes: unshare a user namespace, then write outside"}
    if not sb.network_isolated:
        out |= {"UDP datagram to the trainer's port", "TCP connection to the trainer's port",
                "abstract Unix socket"}
    return out


class Victims:
    """What the programs attack, on this (trusted) side."""

    def __init__(self, tmp: Path) -> None:
        self.token = secrets.token_hex(6)
        self.canary = "canary-" + secrets.token_hex(10)
        os.environ["MLX_RLAIF_TEST_SECRET_KEY"] = self.canary
        self.secret = tmp / "secret.txt"  # 0600, root's (or ours)
        self.secret.write_text(self.canary)
        self.secret.chmod(0o600)
        self.held = open(self.secret)  # noqa: SIM115 - an open file of the trainer's
        self.shared = Path(f"/tmp/mlx-rlaif-faults-{self.token}")  # like a working tree: 0755
        self.shared.mkdir(mode=0o755)
        self.shared.chmod(0o755)
        self.world = self.shared / "world.txt"
        self.world.write_text(self.canary)
        self.world.chmod(0o644)
        self.victim = self.shared / "victim.txt"  # target of the cleanup-sabotage symlink
        self.victim.write_text("v")
        self.victim.chmod(0o644)
        # a process of the trainer's whose environment holds the secret (a process's environ
        # in /proc is the one it started with)
        self.bystander = subprocess.Popen(["sleep", "300"],
                                          env={**os.environ, "MLX_RLAIF_TEST_SECRET_KEY":
                                               self.canary})
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tcp = socket.socket()
        for s in (self.udp, self.tcp):
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
        self.tcp.listen(4)
        self.unix_path = str(self.shared / "host.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind(f"\0mlx-rlaif-{self.token}")
        for s in (self.unix, self.abstract):
            s.listen(4)
            s.setblocking(False)
        self.hostname = socket.gethostname()
        self.tmp_mode = os.stat("/tmp").st_mode

    def argv(self) -> list[str]:
        return [str(os.getpid()), str(self.bystander.pid), self.token,
                str(self.udp.getsockname()[1]), str(self.tcp.getsockname()[1]), str(self.secret),
                str(self.world), str(self.shared), self.unix_path, str(self.victim)]

    def received(self, s: socket.socket) -> bool:
        try:
            if s.type == socket.SOCK_DGRAM:
                return bool(s.recv(64))
            conn, _ = s.accept()
            conn.close()
            return True
        except (BlockingIOError, OSError):
            return False

    def close(self) -> None:
        del os.environ["MLX_RLAIF_TEST_SECRET_KEY"]
        self.bystander.kill()
        self.bystander.wait()
        self.held.close()
        for s in (self.udp, self.tcp, self.unix, self.abstract):
            s.close()
        shutil.rmtree(self.shared, ignore_errors=True)
        for d in ("/tmp", "/dev/shm"):
            for p in Path(d).glob(f"fill-{self.token}-*"):
                p.unlink()
        for p in (Path.home() / self.token, Path("/root") / self.token):
            if p.exists():
                p.unlink()


def contained(name: str, r, v: Victims, box_gone: bool) -> bool:
    """The trusted side's verdict for one program."""
    out = (r.stdout + r.stderr).decode(errors="replace")
    alive = v.bystander.poll() is None
    if v.canary in out:
        return False
    checks = {
        "ctypes: setuid(0), mount, sethostname": socket.gethostname() == v.hostname
        and not (v.shared / "x").exists() and "setuid 0 0" not in out,
        "ctypes: kill the trainer and a bystander": alive,
        "ctypes: unshare a user namespace, then write outside": "wrote" not in out
        and not (v.shared / "from-userns").exists(),
        "ptrace the bystander": alive and "ATTACHED" not in out,
        "signal other processes (kill -1, the bystander)": alive,
        "read the parent's /proc (environ, cmdline, maps, mem)": True,  # the canary check above
        "read the parent's open files (/proc/<pid>/fd, inherited fds)": True,
        "read a secret file of the trainer's (0600)": True,
        "read a world-readable file outside the box": True,
        "write into a working tree and home": "wrote" not in out
        and not (v.shared / "worktree-file").exists() and not (Path("/root") / v.token).exists(),
        "fill /tmp and /dev/shm": not [*Path("/tmp").glob(f"fill-{v.token}-*"),
                                       *Path("/dev/shm").glob(f"fill-{v.token}-*")],
        "UDP datagram to the trainer's port": not v.received(v.udp),
        "TCP connection to the trainer's port": not v.received(v.tcp),
        "Unix socket of the host (world-writable, like X11's)": not v.received(v.unix),
        "abstract Unix socket": not v.received(v.abstract),
        "raise its own limits": "RAISED" not in out,
        "thread storm": r.duration_s < LIMITS.timeout_s + 2,
        "unbounded recursion": r.exit_code != 0,
        "memory spread over 6 processes (RSS watchdog)": r.over_memory,
        "delete its own box": os.stat("/tmp").st_mode == v.tmp_mode,
        "swap its box for a symlink to a directory of the trainer's": box_gone
        and os.stat("/tmp").st_mode == v.tmp_mode
        and stat.S_IMODE(v.shared.stat().st_mode) == 0o755 and not _moved_boxes(),
        "sabotage the cleanup (read-only dirs, chmod 000, symlink out)": box_gone
        and stat.S_IMODE(v.victim.stat().st_mode) == 0o644
        and os.stat("/tmp").st_mode == v.tmp_mode,
    }
    return checks[name] and alive_self()


def _moved_boxes() -> list[Path]:
    return [p for d in {Path("/tmp"), Path(tempfile.gettempdir())}
            for p in d.glob("mlx-rlaif-box-*-moved")]


def alive_self() -> bool:
    return True  # this process, the trainer, runs this line


@pytest.fixture(scope="module", params=["process", "bwrap"])
def battery(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    mode = request.param
    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    sb = Sandbox(mode, slots=2, uid_base=64200)
    v = Victims(tmp_path_factory.mktemp(f"victims-{mode}"))
    results: dict[str, bool] = {}
    try:
        for name, code in PROGRAMS.items():
            if name in HARMFUL and name in gaps(sb):
                results[name] = False
                continue
            with sb.box() as box:
                host = box.host
                r = sb.run(box, [box.write("main.py", code), *v.argv()], LIMITS,
                           python_file=True)
            results[name] = contained(name, r, v, not os.path.lexists(host))
        left = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
        nothing_left = not [ln for ln in left.splitlines()
                            if v.token in ln and not ln.startswith("Z")]
    finally:
        v.close()
    reward = ExecReward(ExecConfig(sandbox=mode, timeout_s=4.0, cpu_s=4), {"python"})
    try:  # after all that, the reward still scores a plain completion
        task = Task(id="add", prompt="Write add(a, b).", entry_point="add",
                    tests=({"args": [1, 2], "expected": 3},))
        still = reward.score([task], ["def add(a, b):\n    return a + b\n"])[0].value
    finally:
        reward.close()
    return {"sandbox": sb, "results": results, "nothing_left": nothing_left, "still": still}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hostile_program_contained_as_documented(battery: dict, name: str) -> None:
    expected = name not in gaps(battery["sandbox"])
    assert battery["results"][name] == expected, (
        f"{battery['sandbox'].mode}: {name} contained={battery['results'][name]}, "
        f"documented {'contained' if expected else 'not contained'}")


def test_battery_leaves_nothing_and_the_trainer_scores_on(battery: dict) -> None:
    r = battery["results"]
    print(f"\n{battery['sandbox'].mode} (uid {os.geteuid()}): {sum(r.values())} of {len(r)} "
          f"contained; not: {sorted(n for n, ok in r.items() if not ok)}")
    assert battery["nothing_left"]
    assert battery["still"] == 1.0


# --- the resident-memory watchdog ---------------------------------------------------------------


@pytest.fixture(scope="module", params=["process", "bwrap"])
def sb(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    return Sandbox(request.param, slots=2, uid_base=64210)


def test_watchdog_kills_a_memory_bomb_no_rlimit_stops(sb: Sandbox) -> None:
    """As on macOS, where RLIMIT_AS is refused: an address-space limit far above the bomb, and
    the watchdog at 150 MB resident stops it within a fraction of a second."""
    code = ("import time\nb = bytearray(600 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
            "time.sleep(30)\n")
    with sb.box() as box:
        t0 = time.monotonic()
        r = sb.run(box, [box.write("main.py", code)],
                   Limits(timeout_s=30, cpu_s=30, memory_mb=8192, rss_mb=150), python_file=True)
    assert r.over_memory and not r.ok and not r.timed_out
    assert r.describe() == "killed: its processes held more resident memory than the limit"
    assert time.monotonic() - t0 < 10


def test_watchdog_leaves_a_program_under_its_limit_alone(sb: Sandbox) -> None:
    code = "b = bytearray(40 << 20)\nb[::4096] = b'x' * len(b[::4096])\nprint('done')\n"
    with sb.box() as box:
        r = sb.run(box, [box.write("main.py", code)], Limits(rss_mb=150), python_file=True)
    assert r.ok and not r.over_memory and r.stdout == b"done\n"


# --- compile-time bombs and toolchain abuse (C++ and Rust) --------------------------------------

BOMBS = {
    "cpp": {
        "template explosion (2^30 types)": (
            "template<long N, long M> struct A { static const long v = A<N-1, 2*M>::v + "
            "A<N-1, 2*M+1>::v; };\ntemplate<long M> struct A<0, M> { static const long v = 1; };\n"
            "int main() { return A<30, 0>::v; }\n"),
        "constexpr evaluation bomb": (
            "constexpr long f() { long s = 0; for (long i = 0; i < 200000; ++i)"
            " for (long j = 0; j < 200000; ++j) s += i ^ j; return s; }\n"
            "static_assert(f() != 1);\nint main() {}\n"),
        "#include </dev/zero>": "#include </dev/zero>\nint main() {}\n",
        "huge initialised array (16 GiB object file)": (
            "char a[1L << 34] = {1};\nint main(int argc, char**) { return a[argc << 20]; }\n"),
        "#include of a secret file (0600)": "#include \"SECRET\"\nint main() {}\n",
        "#include of a world-readable file outside": "#include \"WORLD\"\nint main() {}\n",
    },
    "rust": {
        "const-evaluation loop": (
            "const X: u64 = { let mut i: u64 = 0; while i < u64::MAX { i += 1; } i };\n"
            "fn main() { println!(\"{}\", X); }\n"),
        "include_bytes!(\"/dev/zero\")": (
            "static Z: &[u8] = include_bytes!(\"/dev/zero\");\nfn main() { println!(\"{}\", Z.len()); }\n"),
        "include_str! of a secret file (0600)": (
            "fn main() { print!(\"{}\", include_str!(\"SECRET\")); }\n"),
    },
}


def bomb_gaps(mode: str) -> set[str]:
    """Process mode lets the toolchain read what a dropped uid may: world-readable files."""
    return {"#include of a world-readable file outside"} if mode == "process" else set()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_compile_time_bombs_and_includes_outside(mode: str, tmp_path: Path) -> None:
    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    v = Victims(tmp_path)
    results = {}
    try:
        for lang, bombs in BOMBS.items():
            try:
                reward = ExecReward(ExecConfig(sandbox=mode, build_timeout_s=4.0,
                                               build_memory_mb=1024, workers=4), {lang})
            except ConfigError as e:  # e.g. rustup's rustc under /root in process mode
                print(f"\n{mode}: no {lang} here ({e})")
                continue
            task = Task(id=lang, prompt="Print 7.", language=lang,
                        tests=({"stdin": "", "stdout": "7"},))
            codes = [c.replace("SECRET", str(v.secret)).replace("WORLD", str(v.world))
                     for c in bombs.values()]
            t0 = time.monotonic()
            try:
                out = reward.score([task] * len(codes), codes)
            finally:
                reward.close()
            took = time.monotonic() - t0
            for name, r in zip(bombs, out, strict=True):
                text = json.dumps(r.details) + r.reason
                results[f"{lang}: {name}"] = (r.value is not None and r.parts["tests"] == 0.0
                                              and v.canary not in text)
            assert took < 4.0 * len(codes) + 30, took  # every build was bounded
        ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
        assert not [ln for ln in ps.splitlines() if ("cc1plus" in ln or "rustc" in ln)
                    and "/box/" in ln and not ln.startswith("Z")]
    finally:
        v.close()
    print(f"\n{mode} compile bombs: {sum(results.values())} of {len(results)} contained; not: "
          f"{sorted(n for n, ok in results.items() if not ok)}")
    for name, ok in results.items():
        assert ok == (name.split(": ", 1)[1] not in bomb_gaps(mode)), (mode, name)
