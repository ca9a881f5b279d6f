"""The audit hook the launcher installs before a student's Python code runs (audit.py holds the
trusted side). Standard library only: box.py passes this file's text in the launcher's spec and
the launcher runs it with `exec` (`install(cfg)`), after its own setup and before the program.

`sys.addaudithook` hooks cannot be removed by the code that runs after them. The hook records the
events an honest solution has no reason to raise, as a bounded summary: the first occurrence of
each kind (with a short detail) is written at once, so a process that dies later still leaves
it; each later one only counts. Kinds:
  socket          any socket call (socket.*)
  subprocess      subprocess.Popen, os.system, os.exec*, os.spawn*, os.posix_spawn, os.fork, pty
  signals_others  os.kill / os.killpg of another process (of itself: early_exit)
  ctypes          any ctypes call (loading a library, foreign calls, raw memory)
  writes_outside  a file opened for writing outside the box and its TMPDIR; a file or
                  directory outside the box, or the box itself, removed, renamed, chmod'ed
                  or chown'ed; a link made to a path outside the box
  reads_harness   a read (or listing) of the harness's, the checker's or another box's files,
                  or of /proc/<pid>/{cmdline,environ,mem,maps,fd} (the launcher's spec, state)
  reads_outside   a file opened for reading outside the box, its TMPDIR, /dev and the
                  interpreter's own files
  sets_limits     resource.setrlimit / prlimit (raising or changing its own limits)
  trace           sys.settrace / sys.setprofile / sys.addaudithook
  imports_harness an import of the harness's modules (harness, mlx_rlaif, the launcher)
  introspection   gc.get_objects / get_referrers / get_referents (how one reaches the hook)
  early_exit      os.kill of its own pid; the launcher adds `exit` ends (audit.py decides)

Channel: a pipe whose only write end is inherited (`cfg["fd"]`), made non-blocking so a full pipe
never stalls the program. Each line is `KEY SEQ WHAT ...`: KEY is a per-run secret the trusted
side sent over a second pipe, read by the launcher before any student code (the process holds it
only in memory), so a line the student writes is told apart from ours. `start PID` is written at
install, `event KIND DETAIL` per new kind, `serving PID` when the harness's function server
starts answering (its audit event `mlx_rlaif.serving`, after the solution loaded), `end PID HOW
CODE` by the launcher when the program returns or raises (never after os._exit, a kill, or a
closed channel: the trusted side notices).

Not covered: events CPython does not audit (file reads through an fd the student already
holds, raw syscalls through ctypes after the first ctypes event, os._exit itself); C extensions
that bypass the audit API; a student that walks the launcher's frames to find the key.
"""

import os
import sys

MAX_DETAIL = 160

_EXACT = {
    "subprocess.Popen": "subprocess", "os.system": "subprocess", "os.exec": "subprocess",
    "os.spawn": "subprocess", "os.posix_spawn": "subprocess", "os.fork": "subprocess",
    "os.forkpty": "subprocess", "pty.spawn": "subprocess", "os.startfile": "subprocess",
    "sys.settrace": "trace", "sys.setprofile": "trace", "sys.addaudithook": "trace",
    "gc.get_objects": "introspection", "gc.get_referrers": "introspection",
    "gc.get_referents": "introspection",
}
_PREFIX = {"socket": "socket", "ctypes": "ctypes"}
_CHANGES = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "shutil.rmtree": (0,),
            "os.chmod": (0,), "os.chown": (0,), "os.symlink": (0,), "os.link": (0,),
            "os.truncate": (0,)}
_LISTS = ("os.listdir", "os.scandir")
_LIMITS = ("resource.setrlimit", "resource.prlimit")
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_HARNESS_MODULES = ("harness", "mlx_rlaif", "launcher", "audit_hook")
_PROC_SECRETS = ("cmdline", "environ", "mem", "fd", "maps")


def _text(x):
    """A short printable detail of an audit argument: only str, bytes and int are read (any
    other object is the student's: its __repr__ or __fspath__ is never called here)."""
    if type(x) is bytes:
        x = x.decode("utf-8", "replace")
    elif type(x) is int:
        x = str(x)
    elif type(x) is not str:
        return f"<{type(x).__name__}>"
    return "".join(c if c.isprintable() and c != " " else "_" for c in x[:MAX_DETAIL])


def _under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def _full(path, cwd):
    """The absolute, normalized path of a str or bytes path; None for anything else (an fd,
    or an object of the student's that we do not look into)."""
    if type(path) is bytes:
        path = path.decode("utf-8", "replace")
    if type(path) is not str:
        return None
    return os.path.normpath(path if path.startswith("/") else os.path.join(cwd, path))


def _harness_path(full, cfg):
    name = full.rsplit("/", 1)[-1]
    if name in cfg["protect"] or ("/mlx-rlaif-box-" in full and not _under(full, [cfg["box"]])):
        return True
    parts = full.split("/")
    return len(parts) >= 4 and parts[1] == "proc" and parts[3] in _PROC_SECRETS


def _open_kind(args, cfg, cwd):
    """The kind of an `open` event (path, mode, flags), or None for a harmless one."""
    full, flags = _full(args[0], cwd), args[2] if len(args) > 2 else 0
    if full is None:
        return None
    if type(flags) is int and flags & _WRITE:
        if _under(full, cfg["writable"]) or full.startswith("/dev/"):
            return None
        return "writes_outside"
    if _under(full, cfg["system"]):
        return None  # the interpreter's own files (imports)
    if _harness_path(full, cfg):
        return "reads_harness"
    if _under(full, cfg["writable"]) or full.startswith(("/dev/", "/proc/self/")):
        return None
    return "reads_outside"


def _change_kind(event, args, cfg, cwd):
    """Removing, renaming, chmod/chown of, or linking to a path outside the box (or the box
    itself): writes_outside."""
    inside = [w.rstrip("/") + "/" for w in cfg["writable"]]
    for i in _CHANGES[event]:
        full = _full(args[i], cwd) if len(args) > i else None
        if full is not None and not full.startswith(tuple(inside)):
            return "writes_outside"
    return None


def _kind(event, args, cfg, cwd):
    kind = _EXACT.get(event)
    if kind is not None:
        return kind
    head = event.partition(".")[0]
    if head in _PREFIX and "." in event:
        return _PREFIX[head]
    if event == "open":
        return _open_kind(args, cfg, cwd)
    if event in _CHANGES:
        return _change_kind(event, args, cfg, cwd)
    if event in _LISTS:
        full = _full(args[0], cwd) if args else None
        return "reads_harness" if full is not None and _harness_path(full, cfg) else None
    if event in _LIMITS:
        return "sets_limits"
    if event in ("os.kill", "os.killpg"):
        return "early_exit" if args[0] in (0, os.getpid()) else "signals_others"
    if event == "import":
        name = args[0] if type(args[0]) is str else ""
        if name.partition(".")[0] in _HARNESS_MODULES or name == "__main__":
            return "imports_harness"
    return None


def install(cfg):
    """Install the hook; returns `end(how, code)`, for the launcher to call when the program
    returns or raises. `cfg`: fd, key, box, writable (dirs), protect (file names)."""
    fd, key = cfg.pop("fd"), cfg.pop("key")
    cfg["system"] = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    cwd = os.getcwd()
    seen = {}
    state = [0]  # lines written

    def say(*words):
        state[0] += 1
        line = " ".join([key, str(state[0]), *map(str, words)]) + "\n"
        try:  # noqa: SIM105 - contextlib would be one more import per run
            os.write(fd, line.encode())
        except OSError:
            pass  # the channel is closed or full: the trusted side sees no `end`

    def hook(event, args):
        try:
            if event == "mlx_rlaif.serving":  # the harness, once the solution has loaded
                say("serving", os.getpid())
                return
            kind = _kind(event, args, cfg, cwd)
            if kind is None:
                return
            if kind not in seen:
                seen[kind] = 0
                say("event", kind, _text(event) + ":" + _text(args[0] if args else ""))
            seen[kind] += 1
        except Exception:  # noqa: BLE001 - the hook must never change the program's behaviour
            pass

    def end(how, code):
        say("end", os.getpid(), how, _text(code if type(code) is int else str(code)[:40]),
            ",".join(f"{k}={n}" for k, n in sorted(seen.items())))

    os.set_blocking(fd, False)
    say("start", os.getpid())
    sys.addaudithook(hook)
    return end
