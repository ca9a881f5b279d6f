"""One program, many runs, one sandbox start: the tests of a stdin/stdout program (`run_each`).

The program (a Python file, or a binary built in the box) is copied out of the box into a
program directory of its own, read-only to the runs. One sandbox starts, whose launcher serves
runs (launcher.py, `_serve_runs`): for each test the trusted side here makes three unnamed files
(stdin holding the test's input, empty stdout and stderr), sends their fds over a socket pair, and
the launcher forks the program onto them as a fresh process with its own limits (CPU time,
address space, files, processes: rlimits are per process), in its own process group, as the
sandbox uid, with nothing else open. When it ends, or at the wall limit, the launcher kills every
process the run left, empties the working directories, and only then answers with the exit
status; the output is read from our own files and compared by trusted code (the exec reward).
Every mode does this (one sandbox start per completion). Linux with pidfds waits on a pidfd per
run; seatbelt, and any platform without pidfds, takes the launcher's portable path (a stream
socket, a SIGCHLD wakeup pipe, the run's process group killed until empty: launcher.py
`_serve_runs`), which tests/test_sandbox_runs.py also runs here, in process mode.

Why nothing of one test reaches the next one's input, output or verdict, per mode:
- input and output: each run's three files are made here for it alone and exist nowhere by
  path; a later run gets new ones. Only the launcher ever holds a run's fds besides the run; it
  is not dumpable (no ptrace, no /proc/<pid>/fd of it for a process with its uid) and the
  program never holds the control socket, so it cannot send, forge or read a message of the
  protocol: there is no in-band framing, and nothing the program prints is parsed as one.
- processes: the next run starts only after every process of this one is dead. bwrap: the
  launcher kills every process of the sandbox's pid namespace but itself (`kill(-1)` there
  cannot reach outside), until none is left. process mode: as root, every process of the
  sandbox uid (a helper with that uid signals -1), else every descendant (the launcher is a
  child subreaper: a double-forked, `setsid` daemon is still its descendant). A daemon could
  otherwise write into the next run's stdout through /proc. The portable path on Linux keeps
  all of this (subreaper, uid, pid namespace) and kills the run's process group first.
- files: the program and its source live outside the box, read-only (bwrap: bound read-only
  at /prog; as root: owned by root, readable only through the run's own group, so no other
  run reads another completion's program); between runs the launcher empties the box (each run's
  working directory and HOME), in bwrap also the sandbox's private /tmp and /dev/shm, as root in
  process mode what the sandbox uid made in the host's /tmp, /var/tmp and /dev/shm during the
  run. System V IPC objects are removed (bwrap: all of its own IPC namespace; process mode as
  root: the sandbox uid's); POSIX message queues cannot be made (RLIMIT_MSGQUEUE 0).
- a run that takes the sandbox down with it (the memory watchdog, or a program that kills its
  launcher: with bwrap as non-root they share a uid) is that test's failure; the remaining
  tests run in a fresh sandbox, so the tests that run are the ones that ran one sandbox each.
- seatbelt (macOS): what the launcher can find of a run is its process group (no subreaper,
  no pid namespace, no /proc, and the profile denies `ps` and `kern.proc` sysctls); it kills
  that group until it is empty before it answers, and at the session's end its own group (a
  run's process may join it: same session). A process that leaves the group (`setpgid`,
  `setsid`) is not found: it outlives its test and the completion, as it did with a sandbox
  per test. What it can do to later tests: write into the box (emptied by the launcher after
  each run, but it may write again during the next), use CPU, and, being in the same sandbox
  now, signal the later runs and the launcher (`signal (target same-sandbox)`): a later test
  can fail, or the rest run in a fresh sandbox. What it cannot reach: a later test's stdin,
  stdout or stderr (unnamed files made per run and held only by that run and the launcher;
  macOS has no /proc to reopen them; what it may hold are the files of the run it came from,
  so at most it adds to that test's own output) and a later test's exit status (the
  launcher's waitpid); the expected output never enters the sandbox. The program lives in
  the program directory (the profile's PROG: read and run, never written), so it cannot be
  patched for the next test. The process limit (RLIMIT_NPROC counts every process of the
  user) is set from the count taken when the session started. Not verified without a Mac:
  that the profile lets the launcher receive fds over its socket (if the first run of a
  session fails as our failure but passes in a sandbox of its own, this process goes back to
  a sandbox per test, with one warning), and that a same-uid process in the sandbox cannot
  get another's task port (`task_for_pid`: macOS refuses it to processes without the
  debugger entitlement).

Not covered: process mode as non-root (the program has our uid: it can write anything we can,
/tmp included, so a later test may read what an earlier one left outside the box: documented
in box.py); Linux keyrings and other per-user kernel state.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import IO

from .box import Box, Limits, Running, RunResult, Sandbox, SandboxError, _head, _rmtree, _wait_until
from .modes import SHARED_DIRS, remove_owned

PROGRAM = "/prog"  # the program directory inside bwrap
GRACE_S = 2.0  # our own deadline past the launcher's wall limit, before we kill the sandbox
log = logging.getLogger(__name__)


_REFUSED: list[str] = []  # why the portable path failed to start here (then: a sandbox per test)


@functools.cache
def _pidfds() -> bool:
    """Whether this kernel has pidfds (Python has os.pidfd_open from 3.9; Linux from 5.3)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def portable(sb: Sandbox) -> bool:
    """Whether the launcher serves runs the portable way (launcher.py `_serve_runs`): seatbelt,
    any platform without pidfds, or a Sandbox whose `portable_runs` a test set."""
    return (sb.mode == "seatbelt" or not sys.platform.startswith("linux") or not _pidfds()
            or getattr(sb, "portable_runs", False))


def reuses_sandbox(sb: Sandbox) -> bool:
    """Whether one sandbox serves many runs here: every mode, unless the portable path failed
    to start once in this process (then a sandbox per test, as before)."""
    return not (_REFUSED and portable(sb))


def run_each(sb: Sandbox, box: Box, program: str, stdins: Sequence[bytes], limits: Limits, *,
             python_file: bool = False, audit: dict | None = None) -> Iterator[RunResult]:
    """Run `program` (a file in the box, built or written there) once per input, yielding each
    run's result as it ends; closing the iterator early stops the runs left. `audit`: the
    audit channel's spec (audit.py; its key sent once per sandbox start) for every Python run."""
    data = read_program(box, program)
    if not reuses_sandbox(sb):
        yield from _one_sandbox_each(sb, box, program, data, stdins, limits, python_file, audit)
        return
    each = False
    with program_dir(sb, program, data, box.gid) as (host_dir, inside):
        i, since = 0, time.time() - 1.0
        while i < len(stdins) and not each:
            if i:  # the last sandbox ended during a run: what it left is ours to remove
                empty(box.host)
                if sb.mode == "process" and box.uid is not None:
                    remove_owned(box.uid, since)
            session = Session(sb, box, inside, host_dir, limits, python_file, audit)
            try:
                alive = True
                while alive and i < len(stdins):
                    try:
                        r, alive = session.test(stdins[i])
                    except SandboxError as e:
                        if session.served or not portable(sb):
                            raise
                        session.close()
                        r, each = _refused(sb, box, program, data, stdins[i], limits,
                                           python_file, audit, e), True
                    i += 1
                    yield r
                    if each:
                        break
            finally:
                session.close()
    if each:  # the portable path failed to start: every test left gets a sandbox of its own
        yield from _one_sandbox_each(sb, box, program, data, stdins[i:], limits, python_file,
                                     audit)


def _refused(sb: Sandbox, box: Box, name: str, data: bytes, stdin: bytes, limits: Limits,
             python_file: bool, audit: dict | None, why: SandboxError) -> RunResult:
    """The first run of a portable session failed as our failure (`E ...`: the launcher could
    not serve, e.g. a profile that refuses the fds passed over its socket; unverified without
    a Mac). If that test's input runs in a sandbox of its own (its result returned), the
    session was the fault: the rest of this process uses a sandbox per test (one warning);
    else the error is the program's or the whole sandbox's, and is raised as before."""
    r = next(_one_sandbox_each(sb, box, name, data, [stdin], limits, python_file, audit))
    if not _REFUSED:
        log.warning("the %s sandbox could not serve many runs in one start (%s): every test of "
                    "a stdin/stdout program starts a sandbox of its own from now on (slower, "
                    "the same isolation)", sb.mode, why)
    _REFUSED.append(str(why))
    return r


def read_program(box: Box, name: str) -> bytes:
    """The program the build left in the box: a regular file, never a link's target."""
    try:
        fd = os.open(box.host / name, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise SandboxError(f"cannot read the program {name} from the box: {e}") from e
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SandboxError(f"the program {name} in the box is not a regular file")
        return f.read()


@contextmanager
def program_dir(sb: Sandbox, name: str, data: bytes, gid: int | None
                ) -> Iterator[tuple[Path, str]]:
    """A fresh directory holding the program, which the runs can read but not change, and no
    other run can read (as root: owned by root, group `gid`, the box's; else ours, 0700); yields
    (its host directory, the program's path as the runs see it)."""
    try:
        host = Path(tempfile.mkdtemp(prefix="mlx-rlaif-prog-"))
    except OSError as e:
        raise SandboxError(f"cannot create a program directory: {e}") from e
    try:
        path = host / name
        path.write_bytes(data)
        path.chmod(_mode(name))
        if gid is not None:  # the runs' uid reads it through its group; no other slot can
            os.chown(host, 0, gid)
        host.chmod(0o750 if gid is not None else 0o700)
        inside = f"{PROGRAM}/{name}" if sb.mode == "bwrap" else str(path)
        yield host, inside
    finally:
        _rmtree(host)


def _mode(name: str) -> int:
    return 0o444 if name.endswith(".py") else 0o555


def _one_sandbox_each(sb: Sandbox, box: Box, name: str, program: bytes, stdins: Sequence[bytes],
                      limits: Limits, python_file: bool, audit: dict | None = None
                      ) -> Iterator[RunResult]:
    """A sandbox per run (where the portable path failed to start: `_refused`): before each,
    the box emptied and the program written again (a run may have changed it: the box is
    writable)."""
    for data in stdins:
        empty(box.host)
        inside = box.write(name, program, _mode(name))
        with tempfile.TemporaryFile() as stdin:
            stdin.write(data)
            stdin.seek(0)
            r = sb.run(box, [inside], limits, python_file=python_file, stdin=stdin, audit=audit)
            r = replace(r, stdin_read=_offset(stdin))
        yield r


def run_file() -> IO[bytes]:
    """A fresh unnamed file for one run's stdin, stdout or stderr: a memfd where there is one
    (no file system round trip), else a temporary file unlinked at once."""
    if hasattr(os, "memfd_create"):
        with suppress(OSError):
            return os.fdopen(os.memfd_create("mlx-rlaif-run", os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()  # noqa: SIM115 - closed by the caller


def _offset(f) -> int | None:
    """How far the run read its stdin file: the offset of the open file description it
    shared with us (a hacking signal reads it: an exit before reading the input)."""
    try:
        return os.lseek(f.fileno(), 0, os.SEEK_CUR)
    except OSError:
        return None


def empty(d: Path) -> None:
    """Remove everything in directory `d` (links themselves, never their targets)."""
    for entry in os.scandir(d):
        if entry.is_dir(follow_symlinks=False):
            with suppress(OSError):
                os.chmod(entry.path, 0o700)  # a run may leave it unreadable; never a link
            _rmtree(Path(entry.path))
        else:
            Path(entry.path).unlink(missing_ok=True)


class Session:
    """One sandbox serving runs of one program (launcher.py `_serve_runs`)."""

    def __init__(self, sb: Sandbox, box: Box, inside: str, host_dir: Path, limits: Limits,
                 python_file: bool, audit: dict | None = None):
        self.limits = limits
        self.served = 0  # runs answered
        move = portable(sb)  # macOS has no Unix SOCK_SEQPACKET: a stream, answers end in \n
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM if move
                                         else socket.SOCK_SEQPACKET)
        root_process = sb.mode == "process" and box.uid is not None
        runs = {"ctrl_fd": theirs.fileno(), "timeout_s": limits.timeout_s, "portable": move,
                "pidns": sb.mode == "bwrap",
                "wipe": [box.inside, "/tmp", "/dev/shm"] if sb.mode == "bwrap" else [box.inside],
                "shared_dirs": list(SHARED_DIRS) if root_process else [],
                "keep": [str(box.host)]}
        # the session's own wall limit is ours to keep (per test, below): Running's is not used
        whole = replace(limits, timeout_s=1e9)
        try:
            self.run: Running = sb.start(box, [inside], whole, python_file=python_file,
                                         keep_fds=(theirs.fileno(),), runs=runs,
                                         program_dir=host_dir, audit=audit)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.dead = False

    def test(self, stdin: bytes) -> tuple[RunResult, bool]:
        """One run on `stdin`: its result, and whether the sandbox can serve another."""
        files = [run_file() for _ in range(3)]
        try:
            files[0].write(stdin)
            files[0].seek(0)
            t0 = time.monotonic()
            try:
                self._send(files)
                answer = self._answer(t0 + self.limits.timeout_s + GRACE_S)
            except OSError:
                answer = b""  # the launcher is gone
            duration = time.monotonic() - t0
            if answer is None or not answer:
                return self._lost(files, duration, timed_out=answer is None), False
            text = answer.decode(errors="replace").removesuffix("\n")
            last = text.endswith(" last")  # the launcher could not empty the box: it ended
            r = self._result(text.removesuffix(" last"), files, duration)
            self.served += 1
            return r, not last
        finally:
            for f in files:
                f.close()

    def _send(self, files: list) -> None:
        """The request: "T" with the run's three fds."""
        fds = b"".join(f.fileno().to_bytes(4, sys.byteorder) for f in files)
        self.sock.sendmsg([b"T"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])

    def _answer(self, deadline: float) -> bytes | None:
        """The launcher's answer line; b"" when it is gone, None past `deadline` (monotonic).
        One message on SOCK_SEQPACKET; on the portable path's stream, up to its newline."""
        answer = b""
        while not answer.endswith(b"\n"):
            if not select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            chunk = self.sock.recv(4096)
            if not chunk:
                return b""
            answer += chunk
        return answer

    def _result(self, answer: str, files: list, duration: float) -> RunResult:
        kind, _, n = answer.partition(" ")
        if kind == "E":
            self.close()
            raise SandboxError(n or "the sandbox failed")
        out, t1 = _head(files[1], self.limits.output_bytes)
        err, t2 = _head(files[2], self.limits.output_bytes)
        code = int(n) if kind == "X" else None
        sig = int(n) if kind == "S" else None
        return RunResult(code, sig, kind == "T", out, err, t1 or t2, duration,
                         stdin_read=_offset(files[0]))

    def _lost(self, files: list, duration: float, timed_out: bool) -> RunResult:
        """The sandbox ended or hung during a run: its watchdog, our deadline, or the program
        took it down. A sandbox that never started is our failure (SandboxError)."""
        self.close(kill=True)  # raises SandboxError when the sandbox never started
        out, t1 = _head(files[1], self.limits.output_bytes)
        err, t2 = _head(files[2], self.limits.output_bytes)
        over = self.run.killed_rss is not None
        return RunResult(None, None if timed_out else signal.SIGKILL, timed_out and not over,
                         out, err, t1 or t2, duration, over)

    def close(self, kill: bool = False) -> None:
        """End the session: the launcher sweeps and exits when the socket closes."""
        if self.dead:
            return
        self.dead = True
        self.sock.close()
        if kill or not _wait_until(self.run.proc, time.monotonic() + 5.0):
            self.run.stop()
        self.run.wait()
