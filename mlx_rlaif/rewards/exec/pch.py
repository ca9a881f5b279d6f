"""Precompiled headers for the exec reward's C++ builds: GCC on Linux (issue 49).

Parsing the headers is most of a solution program's build: on g++ 12 with the default flags a
`#include <bits/stdc++.h>` program builds in 1.06 s, 0.23 s with that header precompiled; an
`#include <iostream>` one in 0.25 s, 0.09 s. Which headers (`HEADERS`): `<iostream>`, the first
include of every C++ reference solution in the shipped suites, and `<bits/stdc++.h>`, the usual
first line of competitive-programming C++ (CodeContests, APPS, TACO; `mlx-rlaif data convert`).
Each costs one build (about 4 s and 0.5 s here) and disk (about 100 MB and 23 MB) per compiler
and flags.

How. For each header H the trainer itself (not a sandbox: the input is ours) compiles a one-line
wrapper `#include <H>` (so H keeps its system-header status: warnings do not change) with the
build's own compiler, flags and environment into `DIR/H.gch`, and puts beside it `DIR/H`, a copy
of the header the compiler found. Builds get `-isystem DIR` (`build_args`). GCC looks for `H.gch`
in each include directory and uses it only where it is valid (the first include of the
translation unit, no macro defined before it that it depends on, same compiler and options);
otherwise it reads `DIR/H`, the header's own text, as a system header like the original, so a
build sees the same declarations either way. The copy is needed: GCC remembers where it found
`<H>`, so a second `#include <H>` (e.g. the one inside `<bits/stdc++.h>` after a precompiled
`<iostream>`) opens that path again and fails when no header is there ("No such file or
directory"). A symlink would not do: in a system directory GCC replaces a symlinked header's path
with its target's when that is shorter (-fcanonical-system-headers) and then looks for the .gch
beside the target. A build that fails with an error naming a precompiled header (`blamed`: GCC
before 12 stops with "had to relocate PCH" where it cannot map one at its address) is run again
without them.

The cache: `$XDG_CACHE_HOME/mlx-rlaif/pch` (default `~/.cache/mlx-rlaif/pch`). An entry is keyed
by the compiler's real path, its identity (size, mtime, inode of the driver and of cc1plus), its
`-v` output, the flags and the environment: `KEY` is a symlink to the entry's directory
`KEY-xxxxxxxx`, made complete (files synced) in a fresh directory and then switched to with an
atomic rename, so a reader never sees a partial entry; a lock file makes a second trainer wait
for the first one's build instead of building it again. Its manifest lists every file the
headers were built from with size and mtime: one that changed (a libc or libstdc++ update)
makes the entry stale, and it is rebuilt. A build that fails or times out means no precompiled
headers (logged once), never a failed reward; so does a cache directory we cannot trust.

Who can write it: never the sandboxed compiler or program. bwrap: the entry's include directory
is bound read-only (at runs.PROGRAM, only for the build); process mode as root: the compiler runs
as an unprivileged uid, so the cache must be reachable by other uids (when `~/.cache` is not, as
under /root: `/var/cache/mlx-rlaif/pch`) and every directory from / to it must be owned by root
and writable by no one else (a world-writable sticky parent such as /tmp aside: the entry below
it is ours), else no PCH; files are 0644, directories 0755, temporary names unpredictable
(mkdtemp).

Not covered: clang (it does not use .gch files for `#include`; macOS's g++ is an xcrun shim to
clang) and macOS at all, Rust (rustc has nothing like it), process mode as non-root (the program
has your uid: it could replace the cache as it can any file of yours, see sandbox/box.py), flags
asking for `-Winvalid-pch` (a header that is not used would warn: PCH off for them), a program
that probes the directory itself (`__has_include(<iostream.gch>)` differs), file names in build
logs (a header read from the copy is named `/prog/iostream`), headers changed while a trainer
runs (an entry is checked once per process).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from ...sandbox.modes import world_reachable

log = logging.getLogger(__name__)

HEADERS = ("bits/stdc++.h", "iostream")
FORMAT = 1  # the entry's layout: a change makes every key new
BUILD_TIMEOUT_S = 300.0  # one header's build
LOCK_WAIT_S = 600.0  # waiting for another trainer's build, then we build ourselves
LEFTOVER_S = 3600.0  # an entry directory no key points to, this old, is a crashed build's
SYSTEM_CACHE = "/var/cache/mlx-rlaif/pch"  # as root, where other uids must read the cache

_lock = threading.Lock()
_ready: dict[tuple[str, str], str | None] = {}  # (key, base) -> include dir (None: off)
_said: set[str] = set()


class Off(Exception):
    """Why there are no precompiled headers here (logged once)."""


def prepare(compiler: str, flags: Sequence[str], env: Mapping[str, str], *,
            world: bool) -> str | None:
    """The include directory of the precompiled headers for builds with `compiler`, `flags`
    and `env` (found in the cache or built now), or None where there are none. `world`: the
    builds run as another, unprivileged uid (process mode as root)."""
    if not sys.platform.startswith("linux"):
        return None
    if any("invalid-pch" in f for f in flags):
        _say(logging.INFO, "precompiled headers off: the C++ flags ask for -Winvalid-pch")
        return None
    with _lock:
        try:
            return _prepare(compiler, list(flags), dict(env), world)
        except Off as e:
            _say(logging.INFO, f"precompiled headers off: {e}")
        except Exception as e:  # never a failed reward: the build reads the headers instead
            _say(logging.WARNING, f"precompiled headers off: {type(e).__name__}: {e}")
        return None


def build_args(include_dir: str) -> list[str]:
    """The compiler options that make a build use the precompiled headers in `include_dir`."""
    return ["-isystem", include_dir]


def blamed(build_log: bytes) -> bool:
    """Whether a failed build's log has an error naming a precompiled header (GCC before 12:
    "fatal error: had to relocate PCH"): the build then runs again without them, so that a
    file of ours is never why a program does not build. (`-H`'s `! x.gch` lines are no error.)"""
    return any(b"error" in ln and (b".gch" in ln or b"PCH" in ln)
               for ln in build_log.splitlines())


def _prepare(compiler: str, flags: list[str], env: dict[str, str], world: bool) -> str | None:
    with tempfile.TemporaryDirectory(prefix="mlx-rlaif-pch-") as tmp:
        work = Path(tmp)
        ident = identity(compiler, flags, env, work)
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
        base = cache_dir(world)
        memo = (key, str(base))
        if memo not in _ready:
            found = load(base, key)
            if found is None:
                with _file_lock(base / f"{key}.lock"):
                    found = load(base, key)  # another trainer may have built it meanwhile
                    if found is None:
                        found = _build(base, key, ident, compiler, flags, env, work)
            else:
                log.info("precompiled headers: %s", found)
            _ready[memo] = found
        return _ready[memo]


def identity(compiler: str, flags: list[str], env: dict[str, str], work: Path) -> dict:
    """What a precompiled header depends on besides the headers: the compiler (GCC only:
    raises Off for clang), its options and environment."""
    real = os.path.realpath(compiler)
    macros = _run([real, "-dM", "-E", "-x", "c++", "/dev/null"], env, work).stdout
    if "__GNUC__" not in macros or "__clang__" in macros:
        raise Off(f"{compiler} is not GCC (clang does not use .gch files for #include)")
    version = _run([real, "-v"], env, work).stderr
    cc1plus = _run([real, "-print-prog-name=cc1plus"], env, work).stdout.strip()
    return {"format": FORMAT, "compiler": real, "driver": _stat(real), "version": version,
            "cc1plus": [cc1plus, _stat(cc1plus)], "flags": flags, "env": sorted(env.items()),
            "headers": list(HEADERS)}


# --- where: a directory we trust -----------------------------------------------------------


def candidates(world: bool) -> list[Path]:
    """Where the cache may live, in order of preference."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    user = (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "mlx-rlaif" / "pch"
    return [user, Path(SYSTEM_CACHE)] if world and os.geteuid() == 0 else [user]


def cache_dir(world: bool) -> Path:
    """The first candidate that can be made, that only we (or root) can write, and, with
    `world`, that other uids can read; raises Off naming why none."""
    why = []
    for base in candidates(world):
        if world and not world_reachable(_nearest(base)):
            why.append(f"{base}: other users cannot reach it")
            continue
        try:
            _makedirs(base)
        except OSError as e:
            why.append(f"{base}: {e.strerror or e}")
            continue
        real = Path(os.path.realpath(base))
        problem = untrusted(real)
        if problem is not None:
            why.append(f"{real}: {problem}")
        elif world and not world_reachable(real):
            why.append(f"{real}: other users cannot reach it")
        else:
            return real
    raise Off("no cache directory (" + "; ".join(why) + ")")


def untrusted(path: Path) -> str | None:
    """Why someone but us or root could change what `path` (a real path) holds, or None.
    A world-writable sticky directory (/tmp) may hold it: others cannot rename our entries."""
    me = os.geteuid()
    for i, d in enumerate([path, *path.parents]):
        st = os.lstat(d)
        if st.st_uid not in (0, me):
            return f"{d} belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not (i > 0 and st.st_mode & stat.S_ISVTX):
            return f"{d} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _nearest(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _makedirs(path: Path) -> None:
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        with suppress(FileExistsError):
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)  # the umask aside


# --- an entry: found, built, switched to -----------------------------------------------------


def load(base: Path, key: str) -> str | None:
    """The include directory of `key`'s entry when it is complete and none of the files its
    headers were built from changed since."""
    try:
        name = os.readlink(base / key)
    except OSError:
        return None
    if "/" in name or not name.startswith(f"{key}-"):
        return None
    entry = base / name
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
        if manifest.get("key") != key or manifest.get("format") != FORMAT:
            return None
        for path, st in manifest["deps"].items():
            if _stat(path) != st:
                log.info("precompiled headers %s are stale: %s changed", entry, path)
                return None
        for h, info in manifest["headers"].items():
            if (entry / "include" / f"{h}.gch").stat().st_size != info["bytes"]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(entry / "include")


def _build(base: Path, key: str, ident: dict, compiler: str, flags: list[str],
           env: dict[str, str], work: Path) -> str | None:
    t0 = time.monotonic()
    entry = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=base))
    include = entry / "include"
    headers: dict[str, dict] = {}
    deps: dict[str, list[int] | None] = {}
    try:
        include.mkdir()
        for h in HEADERS:
            try:
                headers[h] = _header(h, include, work, compiler, flags, env, deps)
            except Off as e:
                _say(logging.WARNING, f"no precompiled <{h}>: {e}")
        if not headers:
            raise Off("no header could be precompiled")
        seconds = round(time.monotonic() - t0, 2)
        manifest = {"key": key, "format": FORMAT, "identity": ident, "headers": headers,
                    "deps": deps, "seconds": seconds, "built": time.time()}
        (entry / "manifest.json").write_text(json.dumps(manifest, indent=1))
        _seal(entry)
    except BaseException:
        shutil.rmtree(entry, ignore_errors=True)
        raise
    found = _switch(base, key, entry)
    size = sum(h["bytes"] for h in headers.values()) / 1e6
    log.info("precompiled headers: %s built in %.1f s (%.0f MB): %s", ", ".join(headers),
             seconds, size, found)
    return found


def _header(h: str, include: Path, work: Path, compiler: str, flags: list[str],
            env: dict[str, str], deps: dict[str, list[int] | None]) -> dict:
    """Build `include/h.gch` and the copy `include/h`; check that the compiler uses it."""
    wrapper, depfile, gch = work / "pch.hpp", work / "pch.d", include / f"{h}.gch"
    wrapper.write_text(f"#include <{h}>\n")
    gch.parent.mkdir(parents=True, exist_ok=True)
    r = _run([compiler, *flags, "-x", "c++-header", str(wrapper), "-o", str(gch), "-H", "-MD",
              "-MF", str(depfile)], env, work, BUILD_TIMEOUT_S)
    if r.returncode != 0:
        raise Off(f"{compiler} failed: {_last(r.stderr)}")
    found = next((ln[2:] for ln in r.stderr.splitlines() if ln.startswith(". ")), "")
    header = os.path.realpath(os.path.join(work, found)) if found else ""
    if not os.path.isfile(header):
        raise Off(f"cannot tell where the compiler found it ({found!r})")
    shutil.copyfile(header, include / h)
    deps.update({p: _stat(p) for p in _depfile(depfile.read_text(), str(wrapper))})
    probe = work / "probe.cpp"
    probe.write_text(f"#include <{h}>\nint main() {{ return 0; }}\n")
    r = _run([compiler, *flags, *build_args(str(include)), "-fsyntax-only", "-H", str(probe)],
             env, work, BUILD_TIMEOUT_S)
    if r.returncode != 0 or not any(ln.startswith("! ") and ln.endswith(f"/{h}.gch")
                                    for ln in r.stderr.splitlines()):
        gch.unlink(missing_ok=True)
        (include / h).unlink(missing_ok=True)
        raise Off(f"built, but {compiler} does not use it: {_last(r.stderr)}")
    return {"bytes": gch.stat().st_size, "header": header}


def _depfile(text: str, skip: str) -> list[str]:
    """The prerequisites in a make rule as `-MD` writes it."""
    _, _, body = text.replace("\\\n", " ").partition(": ")
    paths = [p.replace("\\ ", " ") for p in re.split(r"(?<!\\)\s+", body) if p]
    return [p for p in dict.fromkeys(paths) if p != skip and os.path.isabs(p)]


def _seal(entry: Path) -> None:
    """Everything readable by all and written by us only, and on disk before it is used."""
    for d, _, files in os.walk(entry):
        os.chmod(d, 0o755)
        for f in files:
            p = os.path.join(d, f)
            if os.path.islink(p):  # none are made: never chmod what one points to
                continue
            os.chmod(p, 0o644)
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(d)


def _switch(base: Path, key: str, entry: Path) -> str:
    """Point `key` at `entry` (an atomic rename of a fresh link) and remove what it replaces
    and the leftovers of crashed builds."""
    try:
        old = os.readlink(base / key)
    except OSError:
        old = None
    link = base / f".{entry.name}.link"
    os.symlink(entry.name, link)
    os.replace(link, base / key)
    _fsync_dir(base)
    for e in os.scandir(base):
        if e.name == entry.name or not e.name.startswith(f"{key}-") or "/" in e.name:
            continue
        with suppress(OSError):
            if e.name == old or time.time() - e.stat(follow_symlinks=False).st_mtime > LEFTOVER_S:
                shutil.rmtree(e.path, ignore_errors=True)
    return str(entry / "include")


@contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """Hold `path` locked (0600: a sandboxed uid cannot open it), waiting up to LOCK_WAIT_S;
    yields False when it waited that long in vain (we then build anyway)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    held = False
                    break
                time.sleep(0.2)
        yield held
    finally:
        os.close(fd)  # releases the lock


# --- helpers -------------------------------------------------------------------------------


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd,
                              env={**env, "HOME": str(cwd), "TMPDIR": str(cwd)})
    except subprocess.TimeoutExpired:
        raise Off(f"{argv[0]} took over {timeout:.0f} s") from None
    except OSError as e:
        raise Off(f"{argv[0]}: {e.strerror or e}") from None


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith((".", "!", "x "))]
    return (lines or ["no output"])[-1][:300]


def _say(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.log(level, "%s", message)
