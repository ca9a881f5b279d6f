"""What the host reads of a repository and of the recorder's output, checked first.

The recorder's records (recorder.py) are written by code running inside the repository's test
process, and the repository itself is outside input, so both are hostile:

- `read_source`: a repository file the host reads (a module's source, .git's HEAD) must resolve
  (realpath) to a regular file inside the repository's realpath (no `..`, no absolute path, no
  symlink leaving it); it is opened non-blocking, re-checked on the open descriptor (a FIFO or a
  device swapped in between is refused, never waited on), read at most `MAX_SOURCE` bytes (more:
  refused), and decoded as Python decodes it (a coding cookie, a UTF-8 BOM: tokenize's rules);
- `checked_record`: one function record of the recorder, every field checked (the file as
  above, the function's name an identifier, the module a dotted name whose file under its
  import root is that file, the line a positive int, the calls a list of dicts, each repository
  test a [module, root, name, file] of the same kinds whose file is a test file of the
  repository); a record failing any check is dropped whole and counted with its reason, a bad
  test entry alone is dropped.

Not covered: a file replaced between the check and the open by something that is a regular file
again (it is read, inside the repository, as it is then).
"""

from __future__ import annotations

import io
import os
import stat
import tokenize
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

MAX_SOURCE = 2 << 20  # bytes of one repository file read


class Unreadable(Exception):
    """A repository file the host does not read: the reason, one line."""


def inside(repo: Path | str, path: str) -> str:
    """The realpath of `path` (relative to `repo`, or absolute) when it lies inside the realpath
    of `repo`; Unreadable otherwise."""
    root = os.path.realpath(repo)
    if not isinstance(path, str) or not path or "\0" in path:
        raise Unreadable("a file outside the repository")
    real = os.path.realpath(os.path.join(root, path))
    if real == root or os.path.commonpath([root, real]) != root:
        raise Unreadable("a file outside the repository")
    return real


def read_bytes(path: str, limit: int = MAX_SOURCE) -> bytes:
    """The bytes of a regular file (never a FIFO, a device, a directory), at most `limit`."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        raise Unreadable("a file that cannot be read") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable("not a regular file (a FIFO, a device or a directory)")
    if st.st_size > limit:
        raise Unreadable(f"a file larger than {limit >> 20} MB")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise Unreadable("a file that cannot be read") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped after the stat
            raise Unreadable("not a regular file (a FIFO, a device or a directory)")
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except OSError:
        raise Unreadable("a file that cannot be read") from None
    finally:
        os.close(fd)
    if n > limit:
        raise Unreadable(f"a file larger than {limit >> 20} MB")
    return b"".join(chunks)


def decode_python(data: bytes) -> str:
    """Source bytes decoded as Python does (coding cookie, BOM), newlines made `\\n`."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        raise Unreadable("a file that is not valid Python text") from None
    return io.StringIO(text, newline=None).read()  # universal newlines, as tokenize.open


def read_source(repo: Path | str, path: str) -> str:
    """A Python file of the repository, checked (see the module's docstring)."""
    return decode_python(read_bytes(inside(repo, path)))


def dotted(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and all(p.isidentifier()
                                                         for p in name.split("."))


def module_file(repo: Path | str, root: Any, module: str) -> set[str]:
    """The realpaths `module` has under the import root `root` (inside the repository)."""
    top = os.path.realpath(repo)
    real = os.path.realpath(os.path.join(top, root))
    if os.path.commonpath([top, real]) != top:
        raise Unreadable("an import root outside the repository")
    base = os.path.join(real, *module.split("."))
    return {os.path.realpath(base + ".py"), os.path.realpath(os.path.join(base, "__init__.py"))}


def checked_record(f: Any, repo: Path | str, is_test: Callable[[str], bool]) -> dict[str, Any]:
    """The recorder's record of one function when every field is what recorder.py writes about
    this repository; Unreadable with the reason otherwise. Bad repository test entries are
    left out."""
    if isinstance(f, Mapping) and f.get("root", "") is None:
        raise Unreadable("no import root recorded")
    if not isinstance(f, Mapping):
        raise Unreadable("a record that is not what the recorder writes")
    file, name, module, root, line = (f.get(k) for k in ("file", "name", "module", "root",
                                                         "line"))
    if not (isinstance(name, str) and name.isidentifier() and dotted(module)
            and isinstance(root, str) and type(line) is int and line > 0
            and isinstance(f.get("calls", []), list) and isinstance(f.get("tests", []), list)
            and type(f.get("seen", 0)) is int and isinstance(f.get("dropped", {}), Mapping)):
        raise Unreadable("a record that is not what the recorder writes")
    real = inside(repo, file)
    if real not in module_file(repo, root, module):
        raise Unreadable("a record whose module is not its file")
    if is_test(real):
        raise Unreadable("a record of a test file")
    tests = [list(t) for t in f.get("tests", []) if checked_test(t, repo, is_test)]
    calls = [c for c in f["calls"] if isinstance(c, Mapping)] if "calls" in f else []
    dropped = {str(k): n for k, n in f.get("dropped", {}).items() if type(n) is int and n >= 0}
    return {"file": os.path.relpath(real, os.path.realpath(repo)), "name": name,
            "module": module, "root": os.path.realpath(root), "line": line, "calls": calls,
            "seen": max(0, f.get("seen", 0)), "dropped": dropped, "tests": tests}


def checked_test(t: Any, repo: Path | str, is_test: Callable[[str], bool]) -> bool:
    """Whether a repository test entry is [module, root, name, file] of a test function in a
    test file of the repository, the module that file under its root."""
    if not (isinstance(t, list) and len(t) == 4 and dotted(t[0]) and isinstance(t[1], str)
            and isinstance(t[2], str) and t[2].isidentifier() and t[2].startswith("test")
            and isinstance(t[3], str)):
        return False
    try:
        real = inside(repo, t[3])
        ok = real in module_file(repo, t[1], t[0]) and is_test(real)
        return ok and stat.S_ISREG(os.stat(real).st_mode)
    except (Unreadable, OSError, ValueError):
        return False
