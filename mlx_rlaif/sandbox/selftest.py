"""The sandbox's hostile self-test (`mlx-rlaif doctor`): what the sandbox this machine will use
contains, proved with controls.

Each hostile probe is a small Python program that attacks something this (trusted) process
sets up: a TCP and a UDP port and a Unix socket it listens on, a canary file in the home
directory, a directory outside the box (written directly, through a symlink, through a hard
link), a process of the trainer's (signalled, its environment read through /proc or
`kern.procargs2`), another run's box with a checker's task file, the later tests of the same
completion served by the same sandbox start (runs.py: the program patched, files left, a
process left writing into their output); on macOS `open`, `osascript`, `launchctl submit`,
`pbpaste`. It runs inside the sandbox, where it must be stopped, and, where
that is harmless, outside as the trainer, where it must work: a probe that cannot work here
anyway (no DNS server, say) proves nothing and reads "n.a.". Whether it worked is judged on
the trusted side where it can be (bytes received, files written, a process killed, the canary
in the output), else from the program's own report. Then the limits (wall clock, memory) and
what runs need (the interpreter's library, multiprocessing, asyncio; `doctor` adds a C++ and a
Rust hello world where those toolchains are present) must work inside.

A verdict per probe: `contained`, `escaped` or `n.a.`; `ok` or `FAILED` for what must work.

Not covered: the full battery of tests/test_faults_sandbox.py (forged verdicts, orphans,
ptrace, cleanup sabotage), timing channels; on macOS, whatever the profile denies that no probe
here tries (docs/reliability.md lists what remains uncovered).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .box import Limits, RunResult, Sandbox, SandboxError

PROBE_LIMITS = Limits(timeout_s=20.0, cpu_s=10, memory_mb=1024, processes=32)
LIMITS = Limits(timeout_s=2.0, cpu_s=5, memory_mb=256)  # the limits program's
TRIVIAL_LIMITS = Limits(timeout_s=30.0, cpu_s=10, memory_mb=256)  # a loaded machine is slow

WRAP = """import json, os, socket, subprocess, sys
T = json.loads(sys.argv[1])
try:
{body}
    print("REACHED")
except Exception as e:
    print("STOPPED", type(e).__name__, str(e)[:200])
"""


@dataclass(frozen=True)
class Probe:
    """A hostile program: `body` (indented into WRAP) raises when the attack failed. `outside`:
    harmless to run as the trainer (the control); `evidence`: the trusted side's own check."""

    name: str
    body: str
    outside: bool = True
    evidence: str = ""
    platform: str = ""  # "linux" or "darwin" when the probe exists only there


PROBES = (
    Probe("TCP to a port the test listens on", "socket.create_connection(('127.0.0.1', "
          "T['tcp']), timeout=2).sendall(b'x')", evidence="tcp"),
    Probe("UDP to a port the test listens on", "socket.socket(socket.AF_INET, "
          "socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', T['udp']))", evidence="udp"),
    Probe("DNS lookup", "socket.getaddrinfo('example.com', 443)"),
    Probe("Unix socket the test listens on", "s = socket.socket(socket.AF_UNIX)\n"
          "s.connect(T['unix'])\ns.sendall(b'x')", evidence="unix"),
    Probe("read a canary file in the home directory", "assert T['canary'] in "
          "open(T['home_canary']).read()"),
    Probe("write outside the box", "open(T['outside'] + '/direct', 'w').write('x')",
          evidence="direct"),
    Probe("write outside via a symlink", "os.symlink(T['outside'], 'link')\n"
          "open('link/via-symlink', 'w').write('x')", evidence="via-symlink"),
    Probe("write outside via a hard link", "os.link(T['victim'], 'hard')\n"
          "open('hard', 'a').write('x')", evidence="victim"),
    Probe("signal a process of the trainer's", "os.kill(T['bystander'], 15)",
          evidence="bystander"),
    Probe("inspect a trainer process (its command line, its path)", "pid = T['bystander']\n"
          "if sys.platform == 'darwin':\n"
          "    import ctypes\n"
          "    buf = ctypes.create_string_buffer(4096)\n"
          "    if ctypes.CDLL('/usr/lib/libproc.dylib').proc_pidpath(pid, buf, 4096) <= 0:\n"
          "        raise OSError('proc_pidpath refused')\n"
          "else:\n"
          "    assert T['canary'].encode() in open(f'/proc/{pid}/cmdline', 'rb').read()"),
    Probe("read a trainer process's environment", "pid = T['bystander']\n"
          "if sys.platform == 'darwin':\n"
          "    import ctypes\n"
          "    libc = ctypes.CDLL(None, use_errno=True)\n"
          "    mib = (ctypes.c_int * 3)(1, 49, pid)  # CTL_KERN, KERN_PROCARGS2\n"
          "    size = ctypes.c_size_t(1 << 16)\n"
          "    buf = ctypes.create_string_buffer(size.value)\n"
          "    if libc.sysctl(mib, 3, buf, ctypes.byref(size), None, 0) != 0:\n"
          "        raise OSError(ctypes.get_errno(), 'sysctl kern.procargs2')\n"
          "    data = buf.raw[:size.value]\n"
          "else:\n"
          "    data = open(f'/proc/{pid}/environ', 'rb').read()\n"
          "assert T['canary'].encode() in data\n"
          "print(T['canary'])"),
    Probe("read another run's box", "assert T['canary'] in "
          "open(T['other_box'] + '/task.json').read()"),
    Probe("open (Launch Services)", "subprocess.run(['/usr/bin/open', '-g', '-j', "
          "T['outside']], check=True, capture_output=True, timeout=10)", outside=False,
          platform="darwin"),
    Probe("osascript (AppleEvents)", "subprocess.run(['/usr/bin/osascript', '-e', "
          "'tell application \"Finder\" to get name'], check=True, capture_output=True, "
          "timeout=10)", outside=False, platform="darwin"),
    Probe("launchctl submit", "subprocess.run(['/bin/launchctl', 'submit', '-l', T['label'], "
          "'--', '/usr/bin/true'], check=True, capture_output=True, timeout=10)",
          outside=False, platform="darwin"),
    Probe("pbpaste (the pasteboard)", "subprocess.run(['/usr/bin/pbpaste'], check=True, "
          "capture_output=True, timeout=10)", platform="darwin"),
)

NEEDED = (  # what runs need: must work inside
    ("the interpreter's library (json, decimal, hashlib, ctypes)",
     "import json, decimal, hashlib, ctypes\nprint('OK' if json.dumps(str(decimal.Decimal(1)"
     " / 4)) == '\"0.25\"' else 'NO')"),
    ("multiprocessing (a pool of 2)",
     "import multiprocessing as mp\nif __name__ == '__main__':\n"
     "    with mp.Pool(2) as pool:\n        print('OK' if pool.map(abs, [-1, -2]) == [1, 2]"
     " else 'NO')"),
    ("asyncio", "import asyncio\nasync def f(x):\n    await asyncio.sleep(0.01)\n    return x\n"
     "async def main():\n    return await asyncio.gather(f(1), f(2))\n"
     "print('OK' if asyncio.run(main()) == [1, 2] else 'NO')"),
)
TRIVIAL = "print(sum(range(10)))\n"
LIMITS_PROGRAM = """import sys
try:
    hog = bytearray(1 << 30)
    print("memory: allocated")
except MemoryError:
    print("memory: blocked")
sys.stdout.flush()
while True:
    pass
"""


@dataclass(frozen=True)
class Row:
    """One line of the table: `verdict` is contained / escaped / n.a. for a probe, ok / FAILED
    for what must work or hold."""

    name: str
    inside: str
    outside: str
    verdict: str
    detail: str = ""  # what went wrong, shown when the row is bad

    @property
    def bad(self) -> bool:
        return self.verdict in ("escaped", "FAILED")


def run_program(sandbox: Sandbox, source: str, *args: str, limits: Limits | None = None
                ) -> RunResult:
    """`source` run as a Python file in a fresh box (LIMITS unless `limits` is given)."""
    with sandbox.box() as box:
        return sandbox.run(box, [box.write("main.py", source), *args], limits or LIMITS,
                           python_file=True)


# --- what the probes attack ----------------------------------------------------------------


class Targets:
    """What the probes attack, on this side; `check(evidence)` says whether one was hit."""

    def __init__(self, stack: ExitStack, sandbox: Sandbox) -> None:
        self.canary = "mlx-rlaif-canary-" + secrets.token_hex(8)
        self.outside = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="mlx-rlaif-doctor-")))
        self.victim = self.outside / "victim"
        self.victim.write_text(self.canary)
        shared = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlx-rlaif-doctor-")))
        shared.chmod(0o755)  # a world-writable socket in a world-readable place, like X11's
        self.home_canary = Path.home() / f".mlx-rlaif-doctor-{secrets.token_hex(6)}"
        stack.callback(self.home_canary.unlink, missing_ok=True)
        try:  # a home directory we cannot write: the control fails too, the probe reads n.a.
            self.home_canary.write_text(self.canary)
            self.home_canary.chmod(0o600)
        except OSError:
            pass
        self.bystanders = [self._bystander() for _ in range(2)]
        stack.callback(self._end_bystanders)
        self.sockets = {"tcp": socket.socket(), "udp": socket.socket(type=socket.SOCK_DGRAM),
                        "unix": socket.socket(socket.AF_UNIX)}
        for s in self.sockets.values():
            stack.callback(s.close)
            s.setblocking(False)
        self.sockets["tcp"].bind(("127.0.0.1", 0))
        self.sockets["udp"].bind(("127.0.0.1", 0))
        self.unix_path = str(shared / "s")
        self.sockets["unix"].bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        for kind in ("tcp", "unix"):
            self.sockets[kind].listen(4)
        self.other = stack.enter_context(sandbox.box())  # a concurrent run's box
        self.other.write("task.json", json.dumps({"expected": self.canary}), mode=0o600)
        self.label = "com.mlx-rlaif.doctor." + secrets.token_hex(4)

    def _bystander(self) -> subprocess.Popen:
        """A process of the trainer's with the canary in its command line and environment."""
        env = {**os.environ, "MLX_RLAIF_DOCTOR_CANARY": self.canary}
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(600)",
                                 self.canary], env=env, stdin=subprocess.DEVNULL)

    def _end_bystanders(self) -> None:
        for p in self.bystanders:
            p.kill()
            p.wait()

    def argv(self, bystander: int) -> str:
        return json.dumps({
            "tcp": self.sockets["tcp"].getsockname()[1],
            "udp": self.sockets["udp"].getsockname()[1], "unix": self.unix_path,
            "canary": self.canary, "home_canary": str(self.home_canary),
            "outside": str(self.outside), "victim": str(self.victim),
            "bystander": self.bystanders[bystander].pid, "other_box": str(self.other.host),
            "label": self.label})

    def hit(self, evidence: str, bystander: int) -> bool:
        """Whether the attack `evidence` names reached its target (and reset it for the next)."""
        if evidence in self.sockets:
            return _received(self.sockets[evidence])
        if evidence in ("direct", "via-symlink"):
            path = self.outside / evidence
            found = path.exists()
            path.unlink(missing_ok=True)
            return found
        if evidence == "victim":
            changed = self.victim.read_text() != self.canary
            self.victim.write_text(self.canary)
            return changed
        raise ValueError(evidence)

    def signalled(self, bystander: int, said: bool) -> bool:
        """Whether the bystander was signalled: the program says so (then its death is awaited)
        or it is dead; a dead one is replaced for the next probe."""
        p = self.bystanders[bystander]
        try:
            p.wait(timeout=10 if said else 0.2)
        except subprocess.TimeoutExpired:
            return said
        self.bystanders[bystander] = self._bystander()
        return True


def _received(s: socket.socket) -> bool:
    try:
        if s.type == socket.SOCK_DGRAM:
            return bool(s.recv(64))
        conn, _ = s.accept()
        conn.close()
        return True
    except OSError:
        return False


# --- running them --------------------------------------------------------------------------


def _inside(sandbox: Sandbox, probe: Probe, targets: Targets) -> tuple[bool, str]:
    """(whether the attack worked, what the program said) inside the sandbox."""
    try:
        r = run_program(sandbox, WRAP.format(body=_indent(probe.body)), targets.argv(0),
                        limits=PROBE_LIMITS)
    except SandboxError as e:
        return False, f"sandbox failed: {e}"
    return _judge(probe, targets, 0, r.stdout + r.stderr, r.describe())


def _outside(python: str, probe: Probe, targets: Targets) -> tuple[bool, str]:
    """The control: the same program as the trainer, in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-doctor-") as cwd:
        path = Path(cwd) / "main.py"
        path.write_text(WRAP.format(body=_indent(probe.body)))
        try:
            r = subprocess.run([python, "-I", "-S", str(path), targets.argv(1)], cwd=cwd,
                               capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                               env={"PATH": "/usr/bin:/bin", "HOME": cwd})
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, str(e)[:200]
    return _judge(probe, targets, 1, r.stdout + r.stderr, f"exit code {r.returncode}")


def _judge(probe: Probe, targets: Targets, bystander: int, out: bytes, how: str
           ) -> tuple[bool, str]:
    text = out.decode(errors="replace")
    said = text.startswith("REACHED") or targets.canary in text
    if probe.evidence == "bystander":  # a signal sent is an escape, however slow its death
        worked = targets.signalled(bystander, said)
    else:
        worked = targets.hit(probe.evidence, bystander) if probe.evidence else said
    if probe.name.startswith("launchctl") and worked:
        subprocess.run(["/bin/launchctl", "remove", targets.label], capture_output=True)
    first = (text.strip().splitlines() or [how])[-1]
    return worked, first[:120]


def _indent(body: str) -> str:
    return "\n".join("    " + line for line in body.splitlines())


def probe_rows(sandbox: Sandbox, platform: str = sys.platform) -> Iterator[Row]:
    """Each hostile probe inside (must be stopped) and, where harmless, outside (must work)."""
    with ExitStack() as stack:
        targets = Targets(stack, sandbox)
        for probe in PROBES:
            if probe.platform and not platform.startswith(probe.platform):
                yield Row(probe.name, "-", "-", "n.a.")
                continue
            control, _ = _outside(sandbox.python, probe, targets) if probe.outside else (
                True, "")
            inside, said = _inside(sandbox, probe, targets)
            outside = ("works" if control else "fails") if probe.outside else "not run"
            if inside:
                verdict = "escaped"
            else:
                verdict = "contained" if control else "n.a."
            yield Row(probe.name, "REACHED" if inside else "stopped", outside, verdict,
                      said if inside and said != "REACHED" else "")


def needed_rows(sandbox: Sandbox) -> Iterator[Row]:
    """The limits hold, and what runs need works inside."""
    trivial = run_program(sandbox, TRIVIAL, limits=TRIVIAL_LIMITS)
    yield _must("a trivial program", trivial.ok and trivial.stdout.strip() == b"45",
                trivial.describe())
    hog = run_program(sandbox, LIMITS_PROGRAM)
    yield _must("killed at its time limit", hog.timed_out, hog.describe())
    yield _must("memory limit held", b"memory: blocked" in hog.stdout, f"{LIMITS.memory_mb} MB")
    for name, code in NEEDED:
        r = run_program(sandbox, code, limits=PROBE_LIMITS)
        yield _must(name, r.ok and r.stdout.strip() == b"OK", r.describe())


SESSION = """import os, sys, tempfile, time
n = int(input())
places = [os.path.join(d, {token!r}) for d in ('.', os.path.expanduser('~'), tempfile.gettempdir())]
if n == 0:
    wrote = 0
    for p in places:
        try:
            with open(p, 'w') as f:
                f.write('left')
            wrote += 1
        except OSError:
            pass
    try:
        with open(sys.argv[0], 'a') as f:
            f.write('\\nprint("PATCHED")\\n')
    except OSError:
        pass
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the later tests' stdout: processes in this directory
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            here, end = os.getcwd(), time.time() + 3
            while time.time() < end:
                for p in os.listdir('/proc') if os.path.isdir('/proc') else []:
                    try:
                        if int(p) == os.getpid() or os.readlink(f'/proc/{{p}}/cwd') != here:
                            continue
                        fd = os.open(f'/proc/{{p}}/fd/1', os.O_WRONLY | os.O_APPEND)
                        os.write(fd, b'FORGED\\n')
                        os.close(fd)
                    except (OSError, ValueError):
                        pass
                time.sleep(0.01)
        os._exit(0)
    print('wrote', wrote)
else:
    time.sleep(0.5)
    print('test', n, 'sees', len([p for p in places if os.path.exists(p)]))
"""
SESSION_LIMITS = Limits(timeout_s=20.0, cpu_s=10, memory_mb=512, processes=32)
SESSION_ROWS = ("a test patches the program of later tests", "a test leaves files for later tests",
                "a test's process writes into later tests' output")
ONE_START = "the tests of a completion in one sandbox"


def session_rows(sandbox: Sandbox) -> Iterator[Row]:
    """The tests of one completion in one sandbox start (runs.py), as a run scores them: test 0
    attacks the tests after it (patches the program; leaves files in its directory, HOME and
    the temporary directory; leaves a `setsid` process writing into every later test's output
    it can reach), tests 1 and 2 report what they see. The control runs the three as the
    trainer, one after the other in one scratch directory (HOME and TMPDIR there too), where
    each attack must work. On macOS this checks the portable path under the seatbelt profile,
    which no test here can run."""
    from . import runs

    code = SESSION.format(token=f"mlx-rlaif-left-{secrets.token_hex(6)}")
    try:
        with sandbox.box() as box:
            box.write("main.py", code)
            inside = [r.stdout for r in runs.run_each(
                sandbox, box, "main.py", [b"0", b"1", b"2"], SESSION_LIMITS, python_file=True)]
    except SandboxError as e:
        yield _must(ONE_START, False, str(e))
        return
    if runs.reuses_sandbox(sandbox):
        reports = [inside[0].startswith(b"wrote "),
                   *(re.search(rb"^test %d sees \d" % n, o, re.M) for n, o in enumerate(inside)
                     if n)]
        yield _must(ONE_START, all(reports), " | ".join(
            o[:60].decode(errors="replace").strip() for o in inside))
    else:  # the portable path failed to start: a sandbox per test (slower, the same isolation)
        yield Row(ONE_START, "fails", "", "n.a.",
                  f"a sandbox per test instead: {runs._REFUSED[-1]}"[:200])
    outside = _session_outside(sandbox.python, code)
    for name, hit in zip(SESSION_ROWS, (_patched, _left, _forged), strict=True):
        worked, control = hit(inside), hit(outside)
        said = " | ".join(o.decode(errors="replace").strip()[:60] for o in inside[1:])
        yield Row(name, "REACHED" if worked else "stopped", "works" if control else "fails",
                  "escaped" if worked else "contained" if control else "n.a.",
                  said if worked else "")


def _session_outside(python: str, code: str) -> list[bytes]:
    """The control: the three tests as the trainer, in one scratch directory."""
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-doctor-") as cwd:
        path = Path(cwd) / "main.py"
        path.write_text(code)
        out = []
        for n in (b"0", b"1", b"2"):
            try:
                r = subprocess.run([python, "-I", "-S", str(path)], cwd=cwd, input=n,
                                   capture_output=True, timeout=30,
                                   env={"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd})
            except (OSError, subprocess.TimeoutExpired):
                return [b"", b"", b""]
            out.append(r.stdout)
        return out


def _patched(out: list[bytes]) -> bool:
    return any(b"PATCHED" in o for o in out[1:])


def _left(out: list[bytes]) -> bool:
    return any(re.search(rb"^test \d sees [1-9]", o, re.M) for o in out[1:])


def _forged(out: list[bytes]) -> bool:
    return any(b"FORGED" in o for o in out[1:])


def _must(name: str, ok: bool, how: str) -> Row:
    return Row(name, "works" if ok else "fails", "", "ok" if ok else "FAILED", how)


def self_test(sandbox: Sandbox) -> list[Row]:
    """Every row: what must work, the tests of one completion in one sandbox, then each hostile
    probe."""
    return [*needed_rows(sandbox), *session_rows(sandbox), *probe_rows(sandbox)]


def table(rows: list[Row]) -> str:
    """The rows as one plain-text table."""
    width = max(len(r.name) for r in rows) + 2
    head = f"{'check':<{width}}{'inside':<10}{'outside':<10}verdict"
    return "\n".join([head, *(f"{r.name:<{width}}{r.inside:<10}{r.outside:<10}{r.verdict}"
                              + (f" ({r.detail})" if r.verdict != "ok" and r.detail else "")
                              for r in rows)])

