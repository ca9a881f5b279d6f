"""What a reward function prints, on the operator's terminal only through the sanitizer.

A function's own prints (a debugging `print(completion)`, a library's warnings) carry whatever
the completion or a request holds: OSC 52 (the clipboard), clear screen, a line that passes for
the command's own (`scored 9/9 ...`). `relay(stream, name)` reads them line by line (a line cut
at MAX_LINE bytes) and writes each as one line `[name] text` to stderr, the text through
`terminal.visible(lines=False)`: control characters, newlines included, shown as their escapes,
and the prefix says whose line it is. One lock (`WRITE_LOCK`) serializes every line written
this way, so lines written from several threads never interleave.

`capture_fds(name)` does the same for a whole process (serve-reward, where the function runs
in-process): fds 1 and 2 become a pipe relayed this way (Python's prints, C code's writes, a
child's), and it returns a stream on the real stderr for the command's own lines.

Not covered: a function that opens /dev/tty itself.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, BinaryIO

from ...terminal import visible

MAX_LINE = 4096  # bytes of one printed line shown; the rest of it is cut
WRITE_LOCK = threading.Lock()


def write_line(line: str, out: IO[str] | None = None) -> None:
    """One line to `out` (stderr) under WRITE_LOCK."""
    out = out or sys.stderr
    with WRITE_LOCK:
        out.write(line.rstrip("\n") + "\n")
        out.flush()


def relay(stream: BinaryIO, name: str, out: IO[str] | None = None) -> threading.Thread:
    """A daemon thread writing each line of `stream` as `[name] visible text` until EOF."""

    def run() -> None:
        prefix = f"[{visible(name, lines=False)}] "
        with stream:
            while True:
                try:
                    raw = stream.readline(MAX_LINE)
                except (OSError, ValueError):
                    return
                if not raw:
                    return
                text = raw.decode(errors="replace").removesuffix("\n")
                try:
                    write_line(prefix + visible(text, lines=False), out)
                except (OSError, ValueError):
                    return

    t = threading.Thread(target=run, daemon=True, name=f"relay {name}")
    t.start()
    return t


def capture_fds(name: str) -> IO[str]:
    """Relay this process's fds 1 and 2 (see the module's docstring); returns a text stream on
    the real stderr for the command's own lines (write them with `write_line`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    real = os.fdopen(os.dup(2), "w", buffering=1, errors="replace")
    r, w = os.pipe()
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)
    relay(os.fdopen(r, "rb"), name, real)
    return real


__all__ = ["MAX_LINE", "WRITE_LOCK", "capture_fds", "relay", "write_line"]
