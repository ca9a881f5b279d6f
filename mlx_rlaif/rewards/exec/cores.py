"""How many completions the exec reward scores at once (`Cores`): every core it was given, but
while decoding runs beside scoring (generation.score_while_decoding) only the cores decoding
leaves free, so a group's sandboxes do not slow the rows still decoding; once decoding ends, the
step's last groups are scored on every core again.

Measured here (BENCHMARKS.md, issue 49): on 2 cores a pool of 1 (the free core) left the last
group's scoring to one worker after decoding ended (score wait 0.25 s a step), a pool of 2 ran
it on both (0.13 s); a limit that follows decoding keeps both.

Not covered: what else runs on the machine; the cores decoding really uses (the caller says how
many threads it keeps busy: train/trainer.py `decode_threads`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


def free_cores(total: int, decode_threads: int) -> int:
    """The cores decoding leaves to scoring, at least 1."""
    return max(1, total - decode_threads)


class Cores:
    """A limit on scoring at once: `total`, or `free_cores(total, decode)` while `decoding()`."""

    def __init__(self, total: int, decode: int = 0):
        self.total, self.decode = max(1, total), decode
        self._cond = threading.Condition()
        self._busy = 0
        self._decoding = 0

    @property
    def limit(self) -> int:
        return free_cores(self.total, self.decode) if self._decoding else self.total

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Decoding runs beside scoring for the duration."""
        with self._cond:
            self._decoding += 1
        try:
            yield
        finally:
            with self._cond:
                self._decoding -= 1
                self._cond.notify_all()

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One completion scored: waits while `limit` are."""
        with self._cond:
            self._cond.wait_for(lambda: self._busy < self.limit)
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()
