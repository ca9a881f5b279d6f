"""The trusted first code inside every sandboxed run (see box.py). Standard library only.

The parent runs it as `python -I -S -c <box.BOOT> <spec literal> <this file compiled by that
python, marshal as hex>` (or `-c <this file's text> <spec literal>` where it could not be
compiled ahead), so it needs no file access, compiles nothing at each start and imports nothing
from mlx_rlaif. It
1. (process and seatbelt modes) becomes a supervisor: on Linux a child subreaper, so processes
   that double-fork and `setsid` away still end up as its children; it forks the program, waits
   for it, then kills every process left (all processes of the sandbox uid when it runs as root,
   else every descendant), reaps them and reports how the program ended;
2. in the child: enters a new network namespace (root on Linux, process mode), sets the rlimits,
   drops to the sandbox uid/gid with no supplementary groups, sets no_new_privs, writes "R" (ready)
   to the status fd, closes every other fd, and runs the program: `exec` of an argv, or a Python
   file run in this very interpreter (one interpreter start per Python run).

Status fd protocol (one line each): `R` ready; `E <why>` the sandbox itself failed (never the
program); from the supervisor `X <code>` exit, `S <signal>` killed by a signal, `K` killed on
request (the parent's SIGTERM: its deadline, or it no longer needs the run).
Not covered here: mounts and namespaces other than the network (bwrap does those).
"""

import _signal  # the C module: `signal` would import enum, which costs milliseconds per run
import os
import resource
import sys

_LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "memory": resource.RLIMIT_AS,
    "file_size": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": getattr(resource, "RLIMIT_NPROC", None),
}
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_CLONE_NEWNET = 0x40000000
_SIGKILL, _SIGTERM = 9, 15


class _Timeout(Exception):
    pass


def _try(fn, *args, **kw):
    """Call fn(*args), ignoring OSError (a process already gone, an fd already closed)."""
    try:
        return fn(*args, **kw)
    except OSError:
        return None


def _say(fd, text):
    _try(os.write, fd, (text + "\n").encode())


_LIBC = []


def _libc():
    """The C library (loaded once: a forked run reuses the launcher's handle)."""
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _own_processes(uid):
    """How many processes `uid` already runs (RLIMIT_NPROC counts them all)."""
    if os.path.isdir("/proc/self"):
        return sum(1 for pid in os.listdir("/proc") if pid.isdigit() and _uid_of(pid) == uid)
    import subprocess

    out = subprocess.run(["ps", "-A", "-o", "uid="], capture_output=True, text=True).stdout
    return sum(1 for line in out.split() if line.strip() == str(uid))


def _uid_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _set_limits(limits, uid, running=None):
    for name, value in limits.items():
        which = _LIMITS[name]
        if which is None:
            continue
        if name == "processes" and uid is None:
            # no uid of our own: the count includes every process of the user running us
            # (`running`: counted by the trusted side, where a profile forbids `ps` here)
            value += running if running is not None else _own_processes(os.getuid())
        hard = value + 1 if name == "cpu_s" else value
        try:
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            if sys.platform.startswith("linux"):
                raise
            # macOS refuses some limits (RLIMIT_AS): documented as not covered there
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop(uid, gid):
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("setuid did not take")


def _enter(spec, status):
    """Child side: isolate, limit, drop, run. Never returns."""
    try:
        if spec.get("supervise"):
            os.setpgid(0, 0)
        libc = _libc() if spec.get("netns") or spec.get("no_new_privs") else None
        if spec.get("netns") and libc.unshare(_CLONE_NEWNET) != 0:
            raise OSError(f"unshare(CLONE_NEWNET) failed: {os.strerror(_errno())}")
        _set_limits(spec["limits"], spec.get("uid"), spec.get("processes_now"))
        _drop(spec.get("uid"), spec.get("gid"))
        if spec.get("no_new_privs") and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(_errno())}")
        os.umask(0o077)
        keep = {0, 1, 2, status, *spec.get("keep_fds", ())}
        if spec.get("audit"):  # the audit channel's write end (audit_hook.py)
            keep.add(spec["audit"]["fd"])
        for fd in _open_fds():
            if fd not in keep:
                _try(os.close, fd)
    except Exception as e:  # the sandbox failed, not the program
        _say(status, f"E setup: {e.__class__.__name__}: {e}")
        os._exit(121)
    _say(status, "R")
    if spec.get("python_file"):
        os.close(status)
        _run_python(spec["python_file"], spec["argv"], spec.get("audit"))
    os.set_inheritable(status, False)
    try:
        os.execv(spec["argv"][0], spec["argv"])
    except OSError as e:
        _say(status, f"E exec {spec['argv'][0]}: {e}")
        os._exit(122)


def _errno():
    import ctypes

    return ctypes.get_errno()


def _open_fds():
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return [int(x) for x in os.listdir(where) if x.isdigit()]
        except OSError:
            continue
    return list(range(3, 256))


def _run_python(path, argv, audit=None):
    """Run a Python file as __main__ in this interpreter (saves a second interpreter start).
    With `audit` (audit_hook.py), its hook is installed first and told how the program ended."""
    import builtins

    sys.argv = list(argv)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    main = _fresh_main(path, builtins)
    end = _audit(audit) if audit else None
    try:
        exec(code, main.__dict__)
    except SystemExit as e:
        if end:
            end("exit", e.code)
        raise
    except BaseException as e:
        if end:
            end("raise", type(e).__name__)
        raise
    if end:
        end("return", 0)
    sys.exit(0)


def _fresh_main(path, builtins):
    """The program's own __main__ module: nothing of the launcher's is in it, and the C library
    handle and ctypes (with the function pointers the launcher resolved, whose calls raise no
    audit event) are dropped, so the program's `import ctypes` is its own (an audit event)."""
    _LIBC.clear()
    for name in [m for m in sys.modules if m.partition(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]
    main = type(sys)("__main__")
    main.__file__, main.__builtins__ = path, builtins
    sys.modules["__main__"] = main
    return main


def _audit_key(audit):
    """Read the audit channel's key (audit.py) before any program code runs: it is then only in
    this process's memory, never in its argv or environment. The hook comes compiled by the
    trusted side (`code_hex`, marshal; box.py `precompiled`), else it is compiled here: once
    for every run this launcher serves."""
    fd = audit.pop("key_fd")
    audit["key"] = os.read(fd, 32).decode()  # audit.py KEY_BYTES
    os.close(fd)
    hexed = audit.pop("code_hex", None)  # compiled by the trusted side (box.py `precompiled`)
    if hexed:
        import marshal

        audit["code"] = marshal.loads(bytes.fromhex(hexed))
    else:
        audit["code"] = compile(audit["code"], "audit_hook.py", "exec")


def _audit(audit):
    """Install the audit hook (audit_hook.py, compiled by `_audit_key`); its `end` reporter."""
    ns = {"__name__": "audit_hook"}
    exec(audit.pop("code"), ns)
    return ns["install"](audit)


def _kill_uid(uid, gid):
    """Kill every process of `uid` (root only): a helper drops to it and signals -1."""
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            try:
                _drop(uid, gid)
                os.kill(-1, _SIGKILL)
            except OSError:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        _reap()
        if not os.path.isdir("/proc/self") or _own_processes(uid) == 0:
            return


def _kill_descendants(child):
    """Kill the program's group and, as a subreaper, every orphan reparented to us."""
    me = str(os.getpid())
    for _ in range(50):
        _try(os.killpg, child, _SIGKILL)
        kids = _children(me)
        for pid in kids:
            _try(os.kill, pid, _SIGKILL)
        _reap()
        if not kids:
            return


def _children(me):
    if not os.path.isdir("/proc/self"):
        return []
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            out.append(int(pid))
    return out


def _reap():
    """Reap the children that have exited; True while some child is still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _on_term(signum, frame):
    raise _Timeout()


def _supervise(spec, status):
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _signal.signal(_SIGTERM, _on_term)
    child = os.fork()
    if child == 0:
        _signal.signal(_SIGTERM, _signal.SIG_DFL)
        _enter(spec, status)
    verdict = "K"
    try:
        _, st = os.waitpid(child, 0)
        verdict = f"S {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"X {os.WEXITSTATUS(st)}"
    except _Timeout:
        pass
    _signal.signal(_SIGTERM, _signal.SIG_IGN)
    # as a subreaper (Linux) every process the program left is still our descendant, so no
    # child left means nothing left; elsewhere orphans escape to init: always sweep
    if _reap() or not sys.platform.startswith("linux"):
        if spec.get("uid") is not None:
            _kill_uid(spec["uid"], spec["gid"])
        _kill_descendants(child)
    _say(status, verdict)
    os._exit(0)


# --- one sandbox, many runs: the tests of a stdin/stdout program (box.py: run_each) ---------


def _serve_runs(spec, status):
    """Run the program once per request on the control socket, each run a fresh process.

    A request is the message "T" with three fds (stdin, stdout, stderr: unnamed files the
    trusted side made for this run alone). For each: fork the program onto those fds (own
    limits, own process group, the sandbox uid), wait for it up to the wall limit, kill every
    process left (`_sweep`), empty the working directories (`_wipe`), and only then answer one
    line: `X code`, `S signal`, `T` (timed out) or `E why` (our failure). The program never
    holds the control socket or another run's fds; this process is not dumpable (Linux), so a
    program with its uid can neither ptrace it nor open its fds through /proc.

    Two ways to wait and sweep. Linux (pidfd): a pidfd per run, and the launcher a child
    subreaper, so no child left means nothing of the run left. `runs["portable"]` (macOS, any
    platform without pidfds; tests select it on Linux): the socket is a stream (macOS has no
    Unix SOCK_SEQPACKET), a SIGCHLD handler's wakeup pipe wakes the wait (`_wait_portable`),
    and the sweep kills the run's process group until it is empty, then every descendant this
    process can see (Linux: still a subreaper; macOS: none, there is no /proc, no subreaper,
    and the profile denies `ps`, so a process that left the group is not found).
    """
    import _socket
    import select

    runs = spec["runs"]
    portable = runs.get("portable")
    kind = _socket.SOCK_STREAM if portable else _socket.SOCK_SEQPACKET
    ctrl = _socket.socket(_socket.AF_UNIX, kind, 0, runs["ctrl_fd"])
    if sys.platform.startswith("linux"):
        libc = _libc()
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    if spec.get("netns"):  # one network namespace for all the runs (they never overlap)
        if _libc().unshare(_CLONE_NEWNET) != 0:
            _say(status, f"E unshare(CLONE_NEWNET) failed: {os.strerror(_errno())}")
            os._exit(121)
        spec = {**spec, "netns": False}
    if hasattr(resource, "RLIMIT_MSGQUEUE"):  # no POSIX message queue to leave behind (every
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # run inherits the limit)
    _signal.signal(_SIGTERM, _on_term)
    wake = _wakeup() if portable else None
    import gc

    # the compiler's first use costs a run 0.8 ms (it is cold in each fork): warm it here, on
    # a program of our own (never the student's: the launcher does not parse untrusted text)
    compile(b"a, b = map(int, input().split())\nprint(a + b)\n", "warm", "exec")
    gc.freeze()  # what the launcher made stays out of every run's collections (fewer page copies)
    _say(status, "R")
    try:
        while True:
            data, anc, _, _ = ctrl.recvmsg(64, _socket.CMSG_SPACE(3 * 4))
            fds = []  # C ints (the array module would import collections.abc: milliseconds)
            for level, kind, cdata in anc:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(cdata[i:i + 4], sys.byteorder)
                            for i in range(0, len(cdata) - 3, 4)]
            if data != b"T" or len(fds) != 3:
                for fd in fds:
                    _try(os.close, fd)
                if data == b"T":  # a request whose files did not arrive: our failure
                    _try(ctrl.sendmsg, [b"E the run's files did not arrive\n"])
                break  # EOF (the trusted side is done) or a request we do not understand
            since = _now()
            verdict = _one_run(spec, fds, select, wake)
            _sweep(spec)
            try:
                _wipe(spec, since)
            except Exception:  # noqa: BLE001 - the trusted side empties the box, then restarts
                ctrl.sendmsg([f"{verdict} last\n".encode()])
                break
            ctrl.sendmsg([f"{verdict}\n".encode()])
    except _Timeout:
        pass
    _signal.signal(_SIGTERM, _signal.SIG_IGN)
    _sweep(spec)
    if portable:  # a run's process may have joined our group (same session): it ends with us
        _try(os.killpg, 0, _SIGKILL)
    os._exit(0)


def _now():
    import time

    return time.time() - 1.0  # ctime has a coarse resolution: what a run made is newer


def _one_run(spec, fds, select, wake=None):
    """Fork one run of the program on `fds` (stdin, stdout, stderr); its verdict line.
    `wake`: the SIGCHLD wakeup pipe of the portable path (else a pidfd is the wait)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        _signal.signal(_SIGTERM, _signal.SIG_DFL)
        if wake is not None:  # the run gets neither our handler nor our wakeup fd's number
            _signal.set_wakeup_fd(-1)
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        os.close(r)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        try:
            _enter({**spec, "supervise": True, "keep_fds": []}, w)
        except SystemExit as e:  # the program's own end (_run_python ends with sys.exit(0))
            _finish(e.code)
        except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught error
            sys.excepthook(*sys.exc_info())
            _finish(1)
    _RUN[:] = [child]
    os.close(w)
    for fd in fds:
        os.close(fd)
    verdict = None
    if wake is not None:
        st, verdict = _wait_portable(child, spec["runs"]["timeout_s"], wake, select)
    else:
        pidfd = os.pidfd_open(child)
        try:
            if not select.select([pidfd], [], [], spec["runs"]["timeout_s"])[0]:
                _try(os.killpg, child, _SIGKILL)
                _try(os.kill, child, _SIGKILL)
                verdict = "T"
            _, st = os.waitpid(child, 0)
        finally:
            os.close(pidfd)
    with os.fdopen(r, "rb") as f:
        lines = f.read(8192).decode(errors="replace").splitlines()
    errors = [ln for ln in lines if ln.startswith("E ")]
    if errors:
        return errors[0]
    if "R" not in lines:
        return "E the run did not start"
    if verdict is None:
        verdict = f"S {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"X {os.WEXITSTATUS(st)}"
    return verdict


def _wakeup():
    """The portable path's wait: a pipe that every SIGCHLD writes a byte into (the C-level
    handler's wakeup fd), so a select on it wakes when a run ends; its read end."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    _signal.signal(_signal.SIGCHLD, _on_child)
    _signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    return r


def _on_child(signum, frame):
    pass  # the wakeup fd is what counts; a Python handler must exist for it to be written


def _wait_portable(child, timeout, wake, select):
    """Wait for the run `child` up to `timeout` s without a pidfd: waitpid(WNOHANG), then a
    select on the SIGCHLD wakeup pipe (a SIGCHLD after the waitpid leaves a byte there, so
    no end is missed). At the deadline its group and itself are killed. (status, "T"|None)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        pid, st = os.waitpid(child, os.WNOHANG)
        if pid:
            return st, None
        left = deadline - time.monotonic()
        if left <= 0:
            _try(os.killpg, child, _SIGKILL)
            _try(os.kill, child, _SIGKILL)
            return os.waitpid(child, 0)[1], "T"
        if select.select([wake], [], [], min(left, 1.0))[0]:
            while _try(os.read, wake, 512):  # drained: the next SIGCHLD writes again
                pass


def _finish(code):
    """End a forked Python run as the interpreter would (non-daemon threads joined, atexit
    handlers, streams flushed, the exit code of SystemExit) without tearing down the modules
    it inherited from us: that costs milliseconds per run."""
    if code is None:
        rc = 0
    elif isinstance(code, int):
        rc = code & 0xFF
    else:
        _try_print(code)
        rc = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        rc = rc or 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:  # noqa: BLE001 - a closed or broken stream
            rc = rc or 120
    os._exit(rc)


def _try_print(message):
    try:  # noqa: SIM105 - contextlib costs an import per run
        print(message, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass


_RUN = []  # the pid of the run in progress (its process group), once forked


def _sweep(spec):
    """Kill every process the last run left, and reap them: in bwrap's pid namespace all of
    them but us (kill -1 there reaches nothing outside); as root every process of the sandbox
    uid; else every descendant. We are a child subreaper and every process of a run descends
    from it, so when no child of ours is left, nothing of the run is (Linux, both paths).
    Portable path: the run's process group is killed until it is empty (`_kill_group`), then
    every descendant that can be seen; without a subreaper (macOS) always."""
    portable = spec["runs"].get("portable")
    if (not portable or sys.platform.startswith("linux")) and not _reap():
        _RUN.clear()
        return
    if spec["runs"]["pidns"]:
        me = os.getpid()
        for _ in range(50):
            _try(os.kill, -1, _SIGKILL)
            _reap()
            if not [p for p in _live_pids() if p not in (1, me)]:
                return
    elif spec.get("uid") is not None:
        _kill_uid(spec["uid"], spec["gid"])
    if _RUN:
        pgid = _RUN.pop()
        if portable:
            _kill_group(pgid)
        if not portable or _reap():  # a child of ours left: on Linux, an orphan of the run
            _kill_descendants(pgid)
    _reap()


def _kill_group(pgid):
    """Kill the run's process group until no process is left in it (killpg: ESRCH)."""
    import time

    for _ in range(50):
        try:
            os.killpg(pgid, _SIGKILL)
        except ProcessLookupError:
            return
        except OSError:
            pass
        _reap()
        time.sleep(0.001)  # killed members are reaped (by init on macOS) before they go


def _live_pids():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        out.append(int(pid))
            except (OSError, IndexError):
                continue
    return out


def _wipe(spec, since):
    """Empty what the next run could read of this one: the box (its working directory and
    HOME), in bwrap the sandbox's private /tmp and /dev/shm, as root what the sandbox uid left
    in the host's /tmp, /var/tmp and /dev/shm since `since`; and the System V IPC objects it
    made. Every process of the run is gone: nothing races with this."""
    runs = spec["runs"]
    for d in runs["wipe"]:
        _empty(d)
    uid = spec.get("uid")
    if runs["shared_dirs"] and uid is not None:
        for d in runs["shared_dirs"]:
            _empty(d, uid, since, runs["keep"])
    if runs["pidns"] or uid is not None:
        _remove_ipc(None if runs["pidns"] else uid)


def _empty(d, uid=None, since=None, keep=()):
    try:
        entries = list(os.scandir(d))
    except OSError:
        return
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if uid is not None and (st.st_uid != uid or st.st_ctime < since or e.path in keep):
                continue
            if e.is_dir(follow_symlinks=False):
                _rmtree(e.path)
            else:
                os.unlink(e.path)
        except OSError:
            continue


def _rmtree(path):
    remove_tree(path)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def remove_tree(path):
    """Remove `path` (a file, a link or a directory tree) without recursion and without
    following links: one directory fd open at a time (descend by openat, climb by "..",
    checked against the inode it came from), so a tree of any depth (a student's, 10,000
    levels) ends neither in RecursionError nor past the open-files limit. Directories a run
    left without permissions are opened up (chmod 0700: only what lies inside `path`, and
    `path` itself). What cannot be removed is left and counted; returns how many entries
    were left (0: all gone). Nothing may run in the tree meanwhile (its processes are gone)."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    except OSError:
        return 1
    parent, name = os.path.split(path.rstrip("/") or "/")
    if st.st_mode & 0o170000 != 0o040000:  # not a directory: a file or a link
        _try(os.unlink, path)
        return int(os.path.lexists(path))
    try:
        pfd = os.open(parent or ".", _DIR)
    except OSError:
        return 1
    try:
        try:
            left = _empty_at(pfd, name)
        except OSError:  # what cannot be opened or climbed out of is left, never raised
            left = 1
        if _try(os.rmdir, name, dir_fd=pfd) is None and _exists_at(pfd, name):
            left += 1
        return left
    finally:
        os.close(pfd)


def _exists_at(fd, name):
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def _open_dir(fd, name):
    """openat(fd, name) of a directory, opening it up once (chmod 0700) where it refuses."""
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except PermissionError:
        _try(os.chmod, name, 0o700, dir_fd=fd)
        return os.open(name, _DIR, dir_fd=fd)


def _ident(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _empty_at(pfd, name):
    """Empty the directory `name` in the directory `pfd`, depth first, iteratively; the number
    of entries that could not be removed."""
    try:
        fd = _open_dir(pfd, name)
    except OSError:
        return 1
    _try(os.fchmod, fd, 0o700)  # its entries can be unlinked and entered
    path = [(None, _ident(fd), set())]  # (name in the parent, (dev, ino), names given up on)
    left = 0
    try:
        while True:
            child = _clear_files(fd, path[-1][2])
            if child is not None:  # descend into the first directory left
                try:
                    cfd = _open_dir(fd, child)
                except OSError:
                    path[-1][2].add(child)
                    left += 1
                    continue
                _try(os.fchmod, cfd, 0o700)
                os.close(fd)
                fd = cfd
                path.append((child, _ident(fd), set()))
                continue
            if len(path) == 1:
                return left
            gone, _, _ = path.pop()
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            if _ident(fd) != path[-1][1]:  # the tree moved under us: stop here
                return left + 1
            if _try(os.rmdir, gone, dir_fd=fd) is None and _exists_at(fd, gone):
                path[-1][2].add(gone)
                left += 1
    finally:
        os.close(fd)


def _clear_files(fd, skip):
    """Unlink every non-directory entry of the directory `fd`; the name of a subdirectory not
    in `skip` (None: none left), listed after the unlinks."""
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError:
        return None
    sub = None
    for entry, is_dir in entries:
        if is_dir:
            if sub is None and entry not in skip:
                sub = entry
        elif _try(os.unlink, entry, dir_fd=fd) is None and _exists_at(fd, entry):
            skip.add(entry)
    return sub


def _remove_ipc(uid):
    """Remove the System V shared memory, message queues and semaphores (of `uid`; None: all
    of this IPC namespace, bwrap's own)."""
    found = []
    for kind, owner in (("shm", 7), ("msg", 7), ("sem", 4)):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = [ln.split() for ln in f.read().splitlines()[1:]]
        except OSError:
            continue
        found += [(kind, int(r[1])) for r in rows if uid is None or int(r[owner]) == uid]
    if found:
        libc = _libc()
        for kind, ident in found:  # IPC_RMID = 0
            getattr(libc, f"{kind}ctl")(ident, *((0, 0) if kind == "sem" else (0,)), None)


def main():
    # the spec is a Python literal that box.py wrote (repr of a dict of str, int, bool, None,
    # lists): no names are available to it, and importing json would cost milliseconds per run
    spec = eval(sys.argv[1], {"__builtins__": {}}, {})
    status = spec["status_fd"]
    if spec.get("audit"):
        _audit_key(spec["audit"])
    if spec.get("runs"):
        _serve_runs(spec, status)
    if spec.get("supervise"):
        _supervise(spec, status)
    _enter(spec, status)


if __name__ == "__main__":
    main()
