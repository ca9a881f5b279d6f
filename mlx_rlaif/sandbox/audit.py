"""The trusted side of the audit channel: what a student's Python process tried, read without its
help (audit_hook.py is the part inside the sandbox).

`Channel()` makes two pipes per run: the key pipe (a fresh secret written here, read by the
launcher before any student code) and the event pipe (only its write end goes into the sandbox).
`spec(box, writable)` is what `Sandbox.start(audit=...)` passes to the launcher; after the run,
`read()` returns an `Observed`: each kind the hook reported (with the first detail), how many
runs started (and reached the function server's loop), how each run that reached its end ended,
and lines that are not the hook's
(a forged or garbled channel). A run that exits with `TAMPERED` (audit_hook.py) was ended by
the hook because its channel was closed or replaced. Whether a silent end (no `end` line from a run that exited by
itself) or a forged line means tampering is decided with the run's result (rewards/exec).

Not covered: anything audit_hook.py does not record (its docstring).
"""

from __future__ import annotations

import os
import secrets
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from .audit_hook import TAMPERED


def _code(path: Path) -> str:
    """The hook's source as sent to each run: without its docstring and comments (ast), so
    that each launcher compiles less of it."""
    import ast

    tree = ast.parse(path.read_text())
    if ast.get_docstring(tree) is not None:
        tree.body = tree.body[1:]
    return ast.unparse(tree)


HOOK = _code(Path(__file__).with_name("audit_hook.py"))
MAX_READ = 1 << 16  # bytes read back: the hook's summary is a few hundred
KEY_BYTES = 32  # the key as hex text: each launcher reads exactly this many bytes
__all__ = ["TAMPERED", "Channel", "Observed", "parse"]
PROTECT = ("harness.py", "task.json", "launcher.py", "audit_hook.py")


@dataclass
class Observed:
    """What the channel said: `events` kind -> first detail; `ends` each end line's (how, code);
    `counts` kind -> events seen (from the end lines); `forged` lines not written by the hook."""

    starts: int = 0
    serving: int = 0
    events: dict[str, str] = field(default_factory=dict)
    ends: list[tuple[str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    forged: int = 0


class Channel:
    """One run's audit pipes. Use: `spec(...)` to `Sandbox.start`, then `opened()` once the run
    started (closes the sandbox's ends here), `read()` after it ended, `close()` always."""

    def __init__(self, copies: int = 1) -> None:
        """`copies`: how many launchers will start with this channel (each reads one key)."""
        self.key = secrets.token_hex(KEY_BYTES // 2)
        self._key_r, key_w = os.pipe()
        try:
            os.write(key_w, self.key.encode() * max(1, copies))
        finally:
            os.close(key_w)
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._closed: set[int] = set()

    @property
    def fds(self) -> tuple[int, int]:
        """The fds the sandboxed process keeps open (the key's read end, the events' write end)."""
        return self._key_r, self._w

    def spec(self, box: str, writable: list[str], serve: bool = False,
             readable: tuple[str, ...] = ()) -> dict:
        """`readable`: directories the run is given to read (a repository task's repository,
        `Sandbox.readable`): listing and reading them is no event (the import system
        does both); a read of the harness's files there still is."""
        return {"fd": self._w, "key_fd": self._key_r, "box": box, "writable": writable,
                "readable": list(readable), "protect": list(PROTECT), "serve": serve,
                "code": HOOK}

    def opened(self) -> None:
        """The run has started: its copies of the sandbox's ends are its own now."""
        self._close(self._key_r, self._w)

    def read(self) -> Observed:
        """Everything the run (and its children) wrote, once they ended."""
        self.opened()
        chunks, size = [], 0
        while size < MAX_READ:
            try:
                chunk = os.read(self._r, MAX_READ - size)
            except BlockingIOError:
                break  # a writer is still alive (a process of the run that outlived it)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return parse(b"".join(chunks).decode(errors="replace"), self.key)

    def close(self) -> None:
        self._close(self._key_r, self._w, self._r)

    def _close(self, *fds: int) -> None:
        for fd in fds:
            if fd not in self._closed:
                self._closed.add(fd)
                with suppress(OSError):
                    os.close(fd)


def parse(text: str, key: str) -> Observed:
    """The hook's lines (`KEY SEQ WHAT ...`); a line without the key, or out of shape, is forged."""
    seen = Observed()
    for line in text.splitlines():
        words = line.split(" ")
        if len(words) < 4 or words[0] != key or not words[1].isdigit():
            seen.forged += 1
            continue
        what, rest = words[2], words[3:]
        if what == "start":
            seen.starts += 1
        elif what == "serving":
            seen.serving += 1
        elif what == "event" and len(rest) >= 2:
            seen.events.setdefault(rest[0], rest[1])
            seen.counts[rest[0]] = max(seen.counts.get(rest[0], 0), 1)
        elif what == "end" and len(rest) >= 3:
            seen.ends.append((rest[1], rest[2]))
            for pair in (rest[3].split(",") if len(rest) > 3 and rest[3] else []):
                kind, _, n = pair.partition("=")
                if n.isdigit():
                    seen.counts[kind] = max(seen.counts.get(kind, 0), int(n))
        else:
            seen.forged += 1
    return seen
