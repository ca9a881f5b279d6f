"""Run one untrusted command in isolation: the sandbox under the exec reward.

Every run gets a fresh temporary directory (its "box", the only place it may write), an
environment built from scratch (PATH, HOME, TMPDIR, LANG: nothing of the trainer's), stdin closed
(or a test's input file), rlimits on CPU time, address space, file size, open files and processes,
a wall-clock limit after which every process of the run is killed, a resident-memory watchdog that
kills it when its processes together hold more than `rss_mb` (watchdog.py; every platform: macOS
refuses RLIMIT_AS), and output capped (stdout and stderr go to unnamed temp files bounded by the
file-size limit; the first `output_bytes` are kept).
The first code to run inside is our launcher (launcher.py): it sets the limits, drops
privileges and only then runs the program, reporting "ready" on a status fd so that a sandbox
that failed to start (our fault: SandboxError) is never mistaken for a program that failed.

Modes (`auto` picks the first that works and says which, and why, once):
- `bwrap` (Linux, bubblewrap): new pid, net, ipc, uts (and cgroup) namespaces, so no network and
  no view of the host's processes; a new root with /usr, the toolchains and a few /etc files bound
  read-only, a private size-limited /tmp, the box bound read-write at /box, nosuid everywhere.
  Killing bwrap (`--die-with-parent`) ends the pid namespace, double-forked daemons included.
- `seatbelt` (macOS `sandbox-exec`): a default-deny profile (seatbelt.py): no network, no
  Mach services but one, reads only of the system, the interpreter, the toolchains and the box,
  writes only in the box, no signals to or inspection of processes outside the sandbox. Our CI
  holds its text and rules; `mlx-rlaif doctor` on a Mac runs the hostile self-test against it.
- `process`: limits and a supervisor only. On Linux the supervisor is a child subreaper, so
  orphans (double fork + setsid) are still its children and are killed and reaped at the end.
When mlx-rlaif runs as root, each parallel slot runs its code as its own unprivileged uid
(`uid_base + slot`, no supplementary groups): it cannot signal or ptrace the trainer or another
run, cannot read /proc/<pid>/environ of others, and all its processes can be killed with one
`kill(-1)` from that uid. As root in process mode the run also gets a new network namespace
(and no_new_privs: setuid binaries do not elevate it; bwrap mounts everything nosuid).
Host-specific parts (mode choice, bwrap layout, uid pool) are in modes.py, the macOS profile in
seatbelt.py; the in-sandbox launcher is launcher.py. The tests of a stdin/stdout program run
in one sandbox, a fresh process each, in every mode (runs.py: how nothing of one test reaches
the next one's input, output or verdict, per mode, and what seatbelt cannot promise).

Where the trainer's own files live: one run's files (the checker's task and tests, the
student's code and results) are in its box, or in unnamed temporary files (output, verdicts,
a test's input), and are readable by that run's sandboxes only: not by a concurrent run, not
by the next one (a box is removed when its runs end). Under bwrap a run sees only its own box
(a private /tmp; the host's temporary directory is not mounted); under seatbelt the profile
reads only its own box; in process mode as root each box is 0700 and owned by its slot's
uid. In process mode as non-root it does not hold (every run has your uid), which is why
`auto` never picks it there (tests/test_run_files.py, tests/test_isolation_choice.py).

Not covered: memory touched faster than the watchdog polls (0.1 s; on Linux RLIMIT_AS still
bounds each process), disk quotas (the box is bounded only by the file-size limit per file and
the CPU time to write), GPU isolation. In process mode, even as root: writes to world-writable
dirs (/tmp, /dev/shm) are not blocked (as root what a run leaves there, owned by its uid, is
removed after it; as non-root it stays), world-readable files anywhere can be read (a compiler's
`#include` too; the command line of every process in /proc: no pid namespace), and world-writable Unix sockets on the host's filesystem (X11's, a docker.sock
made 0666) can be connected to; as non-root the run has your uid, so it can also signal or
ptrace your processes, read your files and use the network: use bwrap or seatbelt where
untrusted code runs. docs/reliability.md counts what each mode contained of the hostile
programs tried (tests/test_faults_sandbox.py).
"""

from __future__ import annotations

import functools
import marshal
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..errors import ConfigError, RlaifError
from . import seatbelt
from .launcher import remove_tree
from .modes import (
    BOX,
    UidPool,
    bwrap_args,
    choose_mode,
    default_python,
    kill_uid,
    prefix_of,
    python_ok,
    remove_owned,
    world_reachable,
)
from .watchdog import WATCHDOG

LAUNCHER = Path(__file__).with_name("launcher.py").read_text()
# runs the launcher from its code object (`launcher_code`, the argument after the spec): a
# sandbox start then compiles nothing (compiling the launcher's text took 4 ms of each start)
MAX_ARG = 120_000  # Linux refuses a single argument over 128 KiB (MAX_ARG_STRLEN)
BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv.pop())))"


@functools.lru_cache(maxsize=16)
def precompiled(python: str, text: str, name: str) -> str | None:
    """`text` compiled by the interpreter `python` (marshal's format and the bytecode are that
    interpreter's own), as hex; None where it cannot be made (then the text itself is sent)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return marshal.dumps(compile(text, name, "exec", optimize=2)).hex()
    make = ("import marshal,sys;sys.stdout.write(marshal.dumps(compile(sys.stdin.read(),"
            f"{name!r},'exec',optimize=2)).hex())")
    try:
        r = subprocess.run([python, "-I", "-S", "-c", make], input=text, text=True,
                           capture_output=True, timeout=60, env={}, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 and r.stdout else None


def launcher_argv(python: str, spec: dict) -> list[str]:
    """The command line of the launcher under `python`, given its spec."""
    code = precompiled(python, LAUNCHER, "launcher.py")
    if code is None or len(code) > MAX_ARG:
        return [python, "-I", "-S", "-c", LAUNCHER, repr(spec)]
    return [python, "-I", "-S", "-c", BOOT, repr(spec), code]


class SandboxError(RlaifError):
    """Our sandbox failed (not the program under test): the run cannot be scored."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_size_mb: int = 16
    open_files: int = 64
    processes: int = 16
    output_bytes: int = 64 * 1024
    rss_mb: int = 0  # resident memory of all the run's processes together (0: memory_mb)

    @property
    def rss_bytes(self) -> int:
        return (self.rss_mb or self.memory_mb) << 20

    def rlimits(self) -> dict[str, int]:
        return {"cpu_s": self.cpu_s, "memory": self.memory_mb << 20,
                "file_size": self.file_size_mb << 20, "open_files": self.open_files,
                "processes": self.processes}


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when killed by a signal or timed out
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    truncated: bool  # stdout or stderr was longer than Limits.output_bytes
    duration_s: float
    over_memory: bool = False  # killed by the watchdog: resident memory over Limits.rss_mb
    stdin_read: int | None = None  # bytes of its stdin file read (runs.py; None: not known)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.over_memory

    def describe(self) -> str:
        if self.over_memory:
            return "killed: its processes held more resident memory than the limit"
        if self.timed_out:
            return f"timed out after {self.duration_s:.1f} s"
        if self.signal is not None:
            return f"killed by {_signame(self.signal)}"
        return f"exit code {self.exit_code}"


@dataclass(frozen=True)
class Box:
    """A run's private directory: `host` on our side, `inside` as the program sees it."""

    host: Path
    inside: str
    uid: int | None
    gid: int | None

    def write(self, name: str, data: str | bytes, mode: int = 0o644) -> str:
        """Write a file into the box; returns its path as seen inside."""
        path = self.host / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        path.chmod(mode)
        return f"{self.inside}/{name}"


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# --- the sandbox ---------------------------------------------------------------------------


_RO_LOCK = threading.Lock()  # Sandbox.also_read


class Sandbox:
    """Starts isolated runs. Thread-safe: runs from many threads at once are independent.

    `slots` bounds how many boxes exist at once (one uid each when root); `ro_paths` are extra
    directories the runs need to read (toolchains), bound read-only under bwrap.
    """

    def __init__(self, mode: str = "auto", *, slots: int = 8, uid_base: int = 64000,
                 python: str = "", ro_paths: Sequence[str] = ()):
        self.mode, self.why = choose_mode(mode)
        self.root = os.geteuid() == 0 and self.mode != "seatbelt"
        self.python = python or default_python(self.mode, self.root)
        if python and not (os.access(python, os.X_OK) and python_ok(python)):
            raise ConfigError(f"reward.exec.python = {python} is not a Python >= 3.10 that runs: "
                              "set it to a working interpreter, or leave it empty")
        self._ro = tuple(dict.fromkeys([prefix_of(self.python), *map(os.path.realpath, ro_paths)]))
        if self.mode == "seatbelt":  # seatbelt.py: the profile's directories, as parameters
            dev = seatbelt.developer_dir()  # the real compilers and the SDK
            self._exec_dirs = [*seatbelt.interpreter_dirs(self._ro[0], self.python),
                               *self._ro[1:], *([dev] if dev else [])]
            self._profile = seatbelt.profile(len(self._exec_dirs))
        self._uids = UidPool(uid_base, slots) if self.root else None
        self._sweep: set[int] = set()  # uids whose run was killed without its own cleanup
        self._slots = threading.BoundedSemaphore(max(1, slots))

    def also_read(self, paths: Sequence[str]) -> None:
        """Let later runs read (never write) `paths` too: bound read-only under bwrap, readable
        under seatbelt's profile; in process mode file permissions decide, as for any path. A
        repository task's repository and its interpreter's packages (rewards/exec/repo.py)."""
        with _RO_LOCK:
            known = list(self._ro)
            for p in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}):
                if not any(Path(p).is_relative_to(k) for k in known):  # nested binds: the outer
                    known = [known[0], *(k for k in known[1:] if not Path(k).is_relative_to(p)), p]
            if tuple(known) == self._ro:
                return
            self._ro = tuple(known)
            if self.mode == "seatbelt":  # as in __init__
                dev = seatbelt.developer_dir()
                self._exec_dirs = [*seatbelt.interpreter_dirs(self._ro[0], self.python),
                                   *self._ro[1:], *([dev] if dev else [])]
                self._profile = seatbelt.profile(len(self._exec_dirs))

    @property
    def readable(self) -> tuple[str, ...]:
        """The directories given to runs to read beyond the interpreter's (`ro_paths`,
        `also_read`), as runs see them."""
        return self._ro[1:]

    def describe(self) -> str:
        who = "own uid per slot" if self.root else f"uid {os.geteuid()}"
        return f"{self.mode} ({self.why}; {who})"

    @property
    def network_isolated(self) -> bool:
        return self.mode in ("bwrap", "seatbelt") or (self.root and sys.platform.startswith("linux"))

    @property
    def uid_isolated(self) -> bool:
        """Runs cannot signal, ptrace or read the trainer (own uid or own pid namespace)."""
        return self.root or self.mode == "bwrap"

    def reachable(self, path: str) -> bool:
        """Whether a run can read `path` (a toolchain binary)."""
        if self.mode == "bwrap":
            real = os.path.realpath(path)
            return real.startswith("/usr/") or any(Path(real).is_relative_to(p) for p in self._ro)
        return not self.root or world_reachable(path)

    @contextmanager
    def box(self) -> Iterator[Box]:
        """A fresh private directory (and uid when root) for one or more runs."""
        with self._slots, self._lease() as uid:
            born = time.time() - 1.0  # the sweep's cut-off (ctime has coarse resolution)
            try:
                host = Path(tempfile.mkdtemp(prefix="mlx-rlaif-box-"))
            except OSError as e:
                raise SandboxError(f"cannot create a sandbox directory: {e}") from e
            try:
                if uid is not None:
                    os.chown(host, uid, uid)
                inside = BOX if self.mode == "bwrap" else str(host)
                yield Box(host, inside, uid, uid)
            finally:
                if uid is not None and uid in self._sweep:
                    self._sweep.discard(uid)
                    kill_uid(uid)
                _rmtree(host)
                if host.is_symlink():  # the run swapped its box for a link: ours to remove
                    host.unlink()
                if uid is not None and self.mode == "process":
                    remove_owned(uid, born)  # what it wrote to /tmp, /var/tmp, /dev/shm

    @contextmanager
    def _lease(self) -> Iterator[int | None]:
        if self._uids is None:
            yield None
            return
        with self._uids.lease() as uid:
            yield uid

    def start(self, box: Box, argv: Sequence[str], limits: Limits, *, python_file: bool = False,
              stdin: IO[bytes] | None = None, keep_fds: Sequence[int] = (),
              env: dict[str, str] | None = None, runs: dict | None = None,
              program_dir: Path | None = None, audit: dict | None = None) -> Running:
        """Start `argv` in `box`. With `python_file`, argv[0] is a Python file run by our
        interpreter (paths as seen inside the box). `keep_fds` stay open in the program.
        `runs` (runs.py) makes the launcher serve many runs of argv; `program_dir` is bound
        read-only at runs.PROGRAM under bwrap, readable (not writable) under seatbelt. `audit`
        (audit.py's `Channel.spec`): the launcher installs the audit hook before the Python
        program; its fds are passed to the run."""
        # unnamed files (closed by Running.wait): nothing else can open them by path
        out, err, status, info = (tempfile.TemporaryFile() for _ in range(4))  # noqa: SIM115
        spec = {"status_fd": status.fileno(), "limits": limits.rlimits(), "uid": box.uid,
                "gid": box.gid, "keep_fds": list(keep_fds), "argv": list(argv),
                "python_file": argv[0] if python_file else None,
                "supervise": self.mode != "bwrap",
                "netns": self.mode == "process" and self.root and sys.platform.startswith("linux"),
                "no_new_privs": self.mode == "process" and sys.platform.startswith("linux")}
        if runs is not None:
            spec["runs"] = runs
        if audit is not None:  # its hook precompiled too, where it can be
            hook = precompiled(self.python, audit["code"], "audit_hook.py")
            spec["audit"] = audit if hook is None else {**audit, "code": None, "code_hex": hook}
            keep_fds = (*keep_fds, audit["fd"], audit["key_fd"])
        if self.mode == "seatbelt" and box.uid is None:  # the profile forbids `ps` inside
            spec["processes_now"] = seatbelt.processes_of(os.getuid())
        cmd = launcher_argv(self.python, spec)
        if self.mode == "bwrap":  # bwrap writes the pid of the namespace's init to --info-fd
            prog = ["--ro-bind", str(program_dir), "/prog"] if program_dir is not None else []
            cmd = [*bwrap_args(self._ro, str(box.host)), *prog, "--info-fd", str(info.fileno()),
                   *cmd]
        elif self.mode == "seatbelt":
            cmd = seatbelt.command(self._profile, seatbelt.params(box.host, self._exec_dirs,
                                                                  program_dir), cmd)
        try:
            proc = subprocess.Popen(
                cmd, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=out,
                stderr=err, env=self._env(box, env), cwd="/" if self.mode == "bwrap" else box.host,
                start_new_session=True, pass_fds=(status.fileno(), info.fileno(), *keep_fds),
                close_fds=True)
        except OSError as e:  # fork or exec of our own launcher failed
            for f in (out, err, status, info):
                f.close()
            raise SandboxError(f"cannot start a sandboxed process: {e}") from e
        run = Running(self, box, proc, limits, (out, err, status, info), time.monotonic())
        run.unwatch = WATCHDOG.watch(proc.pid, limits.rss_bytes, run.over_memory)
        return run

    def run(self, box: Box, argv: Sequence[str], limits: Limits, **kw) -> RunResult:
        return self.start(box, argv, limits, **kw).wait()

    def _env(self, box: Box, extra: dict[str, str] | None) -> dict[str, str]:
        tmp = "/tmp" if self.mode == "bwrap" else box.inside
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": box.inside, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        env.update(extra or {})
        return env


class Running:
    """A started run. `wait()` returns its RunResult once it ends (killing it at its deadline);
    `stop()` kills it early (its result then reads "killed by SIGKILL")."""

    def __init__(self, sandbox: Sandbox, box: Box, proc: subprocess.Popen, limits: Limits,
                 files: tuple[IO[bytes], ...], t0: float):
        self.sandbox, self.box, self.proc, self.limits, self.t0 = sandbox, box, proc, limits, t0
        self._files = files
        self._out, self._err, self._status, self._info = files
        self.deadline = t0 + limits.timeout_s
        self.timed_out = False
        self.killed_rss: int | None = None  # the resident bytes the watchdog saw, if it killed
        self.unwatch: Callable[[], None] = lambda: None
        self._result: RunResult | SandboxError | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self) -> RunResult:
        """The run's result; raises SandboxError when the sandbox itself failed."""
        if self._result is None:
            if self.proc.poll() is None and not _wait_until(self.proc, self.deadline):
                self.timed_out = True
                self.stop()
            self.proc.wait()
            self.unwatch()
            duration = time.monotonic() - self.t0
            if self.sandbox.mode == "bwrap":
                self._await_namespace()
            try:
                self._result = self._collect(duration)
            except SandboxError as e:
                self._result = e
            finally:
                for f in self._files:
                    f.close()
        if isinstance(self._result, SandboxError):
            raise self._result
        return self._result

    def over_memory(self, rss: int) -> None:
        """The watchdog's call: its processes hold `rss` bytes, more than the limit."""
        if self.proc.poll() is None:
            self.killed_rss = rss
            self.stop()

    def stop(self) -> None:
        """Kill the run and everything it started (idempotent)."""
        if self.proc.poll() is not None:
            return
        if self.sandbox.mode != "bwrap":  # the supervisor kills and reaps its whole tree
            _try(os.kill, self.proc.pid, signal.SIGTERM)
            if _wait_until(self.proc, time.monotonic() + 5.0):
                return
        _try(os.killpg, self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.sandbox.mode != "bwrap" and self.box.uid is not None:
            self.sandbox._sweep.add(self.box.uid)  # no supervisor cleanup: sweep the uid later

    def _await_namespace(self) -> None:
        """Wait until bwrap's pid namespace is empty: its init exits only after every process
        in it, and may outlive bwrap by a moment. If it does not go, sweep the uid later."""
        import json

        self._info.seek(0)
        try:
            info = json.loads(self._info.read(4096) or b"{}")
            pid, ns = int(info["child-pid"]), int(info["pid-namespace"])
        except (ValueError, TypeError, KeyError):
            return  # bwrap never got that far
        init = _pidfd(pid)
        if init is None:
            return  # gone already
        try:  # the pid may have been reused since: only wait for the namespace's own init
            ours = os.readlink(f"/proc/{pid}/ns/pid") == f"pid:[{ns}]"
        except OSError:
            ours = False
        try:
            gone = not ours or bool(select.select([init], [], [], 10.0)[0])
        finally:
            os.close(init)
        if not gone and self.box.uid is not None:
            self.sandbox._sweep.add(self.box.uid)

    def _collect(self, duration: float) -> RunResult:
        self._status.seek(0)
        lines = self._status.read(8192).decode(errors="replace").splitlines()
        stdout, t1 = _head(self._out, self.limits.output_bytes)
        stderr, t2 = _head(self._err, self.limits.output_bytes)
        errors = [ln[2:] for ln in lines if ln.startswith("E ")]
        if errors:
            raise SandboxError(errors[0])
        if "R" not in lines:
            why = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise SandboxError(f"the sandbox did not start ({why[0][:300]})")
        code, sig = (None, None) if self.timed_out else self._exit(lines)
        return RunResult(code, sig, self.timed_out, stdout, stderr, t1 or t2, duration,
                         self.killed_rss is not None)

    def _exit(self, lines: list[str]) -> tuple[int | None, int | None]:
        final = [ln for ln in lines if ln[:1] in ("X", "S", "K")]
        if final:  # the supervisor's report
            kind, _, n = final[-1].partition(" ")
            if kind == "K":
                return None, signal.SIGKILL
            return (int(n), None) if kind == "X" else (None, int(n))
        rc = self.proc.returncode
        if rc < 0:
            return None, -rc
        if rc > 128 and self.sandbox.mode == "bwrap":
            return None, rc - 128  # bwrap reports a signal as 128 + n
        return rc, None


def _wait_until(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for `proc` to exit until `deadline` (monotonic); False when time ran out.

    A pidfd wakes us the moment it exits (Popen.wait(timeout) polls with sleeps of up to 50 ms).
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([fd], [], [], left)
        return True
    finally:
        os.close(fd)


def _pidfd(pid: int | None) -> int | None:
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _head(f: IO[bytes], limit: int) -> tuple[bytes, bool]:
    f.seek(0)
    data = f.read(limit + 1)
    return data[:limit], len(data) > limit


def _try(fn, *args) -> None:
    with suppress(OSError):
        fn(*args)


def _rmtree(path: Path) -> None:
    """Remove a box (or anything a run made) however deep and however its permissions were
    left: launcher.py's `remove_tree` (iterative, by directory fd, never follows a link)."""
    remove_tree(path)
