"""What each sandbox mode needs from the host (see box.py for the modes and guarantees).

Choosing a mode (auto never falls back to running the student with the user's own rights)
and probing bubblewrap and sandbox-exec; bubblewrap's mount layout (the seatbelt profile is
seatbelt.py);
which interpreter and toolchain paths an unprivileged uid can reach; the pool of sandbox uids
used when running as root, killing every process of one of them and removing what it left in
the world-writable directories.

Not covered: cgroups (no memory or pid accounting across processes beyond rlimits).
"""

from __future__ import annotations

import fcntl
import functools
import os
import pwd
import queue
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError
from .launcher import remove_tree

MODES = ("auto", "bwrap", "seatbelt", "process")
BOX = "/box"  # the box's path inside bwrap
_ETC = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
        "/etc/localtime")
_TOP = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


# --- choosing a mode -------------------------------------------------------------------------


NO_ISOLATION_FIX = ("install bubblewrap (apt-get install bubblewrap) and allow user namespaces, "
                    "or set reward.exec.sandbox: process to accept running student code with your "
                    "own rights (it can read your files, use the network and signal your "
                    "processes)")


def host_platform() -> str:
    """sys.platform (a function, so that tests can stand in another platform)."""
    return sys.platform


def is_root() -> bool:
    """Whether we run as root (then process mode gives each slot its own uid)."""
    return os.geteuid() == 0


def choose_mode(mode: str) -> tuple[str, str]:
    """(mode, why) for a requested mode; raises ConfigError when it cannot work here.

    `auto` takes an isolating sandbox (bwrap on Linux, seatbelt on macOS) or, as root, process
    mode with a uid per slot; as anyone else, process mode runs the student with the user's own
    rights, which only the user may choose (`reward.exec.sandbox: process`): auto refuses."""
    if mode not in MODES:
        raise ConfigError(f"sandbox = {mode!r} is not one of {', '.join(MODES)}")
    if mode == "process":
        return "process", "process limits only (requested)"
    plat = host_platform()
    if mode == "bwrap" or (mode == "auto" and plat.startswith("linux")):
        problem = bwrap_problem() if plat.startswith("linux") else "bwrap needs Linux"
        if problem is None:
            return "bwrap", "bubblewrap namespaces"
        if mode == "bwrap":
            raise ConfigError(f"sandbox = bwrap does not work here ({problem}): install "
                              "bubblewrap (apt-get install bubblewrap) and allow user namespaces, "
                              "or set reward.exec.sandbox=process")
        return _unisolated(f"bwrap unavailable ({problem})")
    if mode == "seatbelt" or (mode == "auto" and plat == "darwin"):
        problem = seatbelt_problem() if plat == "darwin" else "needs macOS"
        if problem is None:
            return "seatbelt", "macOS sandbox-exec, default-deny profile"
        if mode == "seatbelt":
            raise ConfigError(f"sandbox = seatbelt does not work here ({problem}): set "
                              "reward.exec.sandbox=auto")
        raise ConfigError(f"sandbox-exec does not work here ({problem}): run mlx-rlaif outside "
                          "other sandboxes, or set reward.exec.sandbox: process to accept running "
                          "student code with your own rights")
    return _unisolated("no bwrap or seatbelt on this platform")


def _unisolated(why: str) -> tuple[str, str]:
    """auto where no isolating sandbox works: process mode as root (a uid per slot), else a
    ConfigError naming the fix."""
    if is_root():
        return "process", f"process limits only, own uid per slot: {why}"
    raise ConfigError(f"no isolating sandbox works here ({why}): {NO_ISOLATION_FIX}")


@functools.cache
def seatbelt_problem() -> str | None:
    """None when sandbox-exec starts our Python under our profile here, else a reason (it
    refuses inside another sandbox, e.g. an app's)."""
    from . import seatbelt

    if not Path(seatbelt.SANDBOX_EXEC).exists():
        return f"{seatbelt.SANDBOX_EXEC} not found"
    exe = os.path.realpath(sys.executable)
    dirs = seatbelt.interpreter_dirs(prefix_of(exe), exe)
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-probe-") as box:
        cmd = seatbelt.command(seatbelt.profile(len(dirs)), seatbelt.params(box, dirs),
                               [exe, "-I", "-S", "-c", "pass"])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}, cwd=box)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"sandbox-exec failed to run: {str(e)[:200]}"
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:300]
    return None


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap can start a sandbox here (the layout runs use), else a reason."""
    if shutil.which("bwrap") is None:
        return "bwrap not found on PATH"
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-probe-") as box:
        probe = [*bwrap_args((), box), "/bin/sh", "-c", "exit 0"]
        try:
            # a clean environment: an inherited LD_PRELOAD (e.g. OpenBLAS, see blas.py) makes
            # bwrap hang
            r = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap failed to run: {str(e)[:200]}"
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    return None


def _bwrap_namespaces() -> list[str]:
    if os.geteuid() == 0:  # no user namespace: the launcher drops to a real unprivileged uid
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try"]
    return ["--unshare-all"]


def bwrap_args(ro_paths: Sequence[str], box_host: str) -> list[str]:
    """bwrap's options for one run: namespaces, a read-only system, private /tmp, the box."""
    a = [shutil.which("bwrap") or "bwrap", *_bwrap_namespaces(), "--die-with-parent",
         "--new-session", "--ro-bind", "/usr", "/usr"]
    for d in _TOP:
        if os.path.islink(d):
            a += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            a += ["--ro-bind", d, d]
    a += ["--perms", "0755", "--dir", "/etc"]  # parents bwrap makes itself are 0700
    for f in _ETC:
        a += ["--ro-bind-try", f, f]
    made: set[str] = {"/", "/usr", "/etc", "/tmp", "/proc", "/dev", BOX}
    # a path under /tmp or /dev (a repository in /tmp: rewards/exec/repo.py) is bound after the
    # private mounts there, which would hide it
    late = [p for p in ro_paths if Path(p).is_relative_to("/tmp") or Path(p).is_relative_to("/dev")]
    a += _ro_binds([p for p in ro_paths if p not in late], made)
    # a private /dev/shm too: multiprocessing's semaphores live there
    return [*a, "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(64 << 20),
            "--tmpfs", "/tmp", "--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm",
            *_ro_binds(late, made), "--bind", box_host, BOX, "--chdir", BOX]


def _ro_binds(paths: Sequence[str], made: set[str]) -> list[str]:
    a: list[str] = []
    for p in paths:
        if p == "/usr" or p.startswith("/usr/"):
            continue
        for parent in reversed(Path(p).parents):
            if str(parent) not in made:
                made.add(str(parent))
                a += ["--perms", "0755", "--dir", str(parent)]
        a += ["--ro-bind", p, p]
    return a


# --- interpreters and paths ------------------------------------------------------------------


def world_reachable(path: str | Path) -> bool:
    """Whether a uid that is neither owner nor group can reach (traverse to and read) `path`."""
    p = Path(os.path.realpath(path))
    try:
        for d in [*reversed(p.parents), p]:
            mode = d.stat().st_mode
            need = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
            if not mode & need:
                return False
    except OSError:
        return False
    return True


def default_python(mode: str, drops_uid: bool) -> str:
    exe = os.path.realpath(sys.executable)
    if mode == "bwrap" or not drops_uid or world_reachable(exe):
        return exe
    for cand in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if cand and world_reachable(cand) and python_ok(cand):
            return os.path.realpath(cand)
    raise ConfigError(f"no Python the sandbox user can run: {exe} is in a directory other users "
                      "cannot enter; set reward.exec.python to a system python3 (>= 3.10) or use "
                      "sandbox: bwrap")


def python_ok(exe: str) -> bool:
    try:
        r = subprocess.run([exe, "-I", "-S", "-c", "import sys; print(sys.version_info >= (3, 10))"],
                           capture_output=True, text=True, timeout=20, env={}, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == "True"


def prefix_of(exe: str) -> str:
    """The installation directory to bind for an interpreter or toolchain binary."""
    real = Path(os.path.realpath(exe))
    if real.is_relative_to(os.path.realpath(sys.base_prefix)):
        return os.path.realpath(sys.base_prefix)
    return str(real.parent.parent)


UID_SPAN = 4096  # how far past uid_base a pool looks for uids no other pool on the machine holds


def uid_lock_dir() -> Path:
    """Where pools hold their uids' locks: one directory for the whole machine, root's alone."""
    base = Path("/run") if os.path.isdir("/run") else Path(tempfile.gettempdir())
    d = base / "mlx-rlaif-uids"
    d.mkdir(mode=0o700, exist_ok=True)
    if d.is_symlink() or d.stat().st_uid != os.geteuid():
        raise ConfigError(f"{d} is not this user's own directory: remove it (it holds the "
                          "sandbox uids' locks)")
    return d


class UidPool:
    """Unprivileged uids for parallel runs when we are root: `n` uids from `base` up that no
    other pool on this machine holds.

    Every process running student code as root kills a run by its uid (`kill_uid`), so two
    trainers sharing a uid killed each other's runs, and verdicts followed the other run's
    timing. Each uid taken is held by an exclusive lock on a file of `uid_lock_dir()` for the
    pool's life (the kernel drops it when the process ends, also on kill -9); a uid held by
    another pool is skipped. A uid an account uses is a config error, as before.
    """

    def __init__(self, base: int, n: int, lock_dir: Path | None = None):
        self._locks: list[int] = []
        taken = []
        where = lock_dir or uid_lock_dir()
        for uid in range(base, base + UID_SPAN):
            if len(taken) == n:
                break
            _check_unused(uid)
            fd = os.open(where / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # another pool's
                continue
            self._locks.append(fd)
            taken.append(uid)
        if len(taken) < n:
            self.close()
            raise ConfigError(f"no {n} free sandbox uids from {base} to {base + UID_SPAN - 1} "
                              "(other runs on this machine hold them): set reward.exec.uid_base "
                              "to another range")
        self.uids = tuple(taken)
        self._free: queue.Queue[int] = queue.Queue()
        for uid in taken:
            self._free.put(uid)

    def close(self) -> None:
        """Give the uids back to the machine (also done when the process ends)."""
        for fd in self._locks:
            os.close(fd)
        self._locks = []

    def __del__(self) -> None:
        self.close()

    @contextmanager
    def lease(self) -> Iterator[int]:
        uid = self._free.get()
        try:
            yield uid
        finally:
            self._free.put(uid)


def _check_unused(uid: int) -> None:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return
    raise ConfigError(f"sandbox uid {uid} belongs to user {name!r}: set "
                      "reward.exec.uid_base to a range no account uses")


def processes_of(uid: int) -> list[int]:
    """Pids of the live processes whose real uid is `uid` (Linux /proc; [] elsewhere)."""
    out = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc/self") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                text = f.read()
        except OSError:
            continue
        uid_line = next((ln for ln in text.splitlines() if ln.startswith("Uid:")), "")
        state = next((ln for ln in text.splitlines() if ln.startswith("State:")), "")
        if uid_line.split()[1:2] == [str(uid)] and "zombie" not in state:
            out.append(int(pid))
    return out


def kill_uid(uid: int) -> None:
    """Kill every process of `uid` (we must be root): a helper with that uid signals -1."""
    for _ in range(10):
        if not processes_of(uid):
            return
        helper = shutil.which("kill") or "/bin/kill"
        subprocess.run([helper, "-KILL", "-1"],
                       user=uid, group=uid, extra_groups=[], stdin=subprocess.DEVNULL,
                       capture_output=True, cwd="/", env={}, check=False)


SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: process mode cannot block them


BOX_NAME = re.compile(r"mlx-rlaif-box-[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's names for boxes


def remove_owned(uid: int, since: float, dirs: Sequence[str] = SHARED_DIRS) -> None:
    """Remove what `uid` left directly in the world-writable directories since `since` (we are
    root, its processes are gone; rmtree does not follow symlinks). Boxes are never touched:
    another trainer's runs may be using one (trainers never share a uid: `UidPool`)."""
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                if st.st_uid != uid or st.st_ctime < since or BOX_NAME.fullmatch(e.name):
                    continue
                if e.is_dir(follow_symlinks=False):
                    remove_tree(e.path)
                else:
                    os.unlink(e.path)
            except OSError:
                continue
