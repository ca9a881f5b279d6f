"""The resident-memory watchdog: it kills a sandboxed run whose processes together hold more
resident memory than the run's limit, on every platform.

macOS refuses the address-space limit (RLIMIT_AS), so there the rlimits alone let a student's
memory bomb take unified memory from the trainer; on Linux RLIMIT_AS bounds each process but not
their sum. One daemon thread, alive only while some run is watched, sums the resident set size
(RSS) of each run's process tree (psutil: the run's first process and all its descendants) every
`every` seconds and calls the run's `over` callback (which kills its process group) past the
limit. A scan costs about 1.5 ms per run here (70 processes on the machine).

Not covered: memory touched faster than one poll interval (a process can grow by its allocation
rate x 0.1 s before it is seen; on Linux RLIMIT_AS stops a single process first); processes that
left the tree (on macOS a double-forked orphan is reparented to launchd; on Linux the launcher
is a subreaper and bwrap's pid namespace keeps them); pages shared between forked processes are
counted once per process (the sum overstates, never understates).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress

import psutil

log = logging.getLogger(__name__)


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with suppress(psutil.Error):
            total += p.memory_info().rss
    return total


class Watchdog:
    """Watches process trees; `watch` returns the function that stops watching one."""

    def __init__(self, every: float = 0.1) -> None:
        self.every = every
        self._runs: dict[int, tuple[int, int, Callable[[int], None]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0

    def watch(self, pid: int, limit_bytes: int, over: Callable[[int], None]) -> Callable[[], None]:
        """Call `over(rss)` once if the tree of `pid` holds more than `limit_bytes`."""
        with self._lock:
            key = self._next
            self._next += 1
            self._runs[key] = (pid, limit_bytes, over)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="sandbox-rss-watchdog",
                                                daemon=True)
                self._thread.start()
        return lambda: self._drop(key)

    def _drop(self, key: int) -> None:
        with self._lock:
            self._runs.pop(key, None)

    def _loop(self) -> None:
        while True:
            time.sleep(self.every)
            with self._lock:
                if not self._runs:
                    self._thread = None
                    return
                runs = list(self._runs.items())
            for key, (pid, limit, over) in runs:
                rss = tree_rss(pid)
                if rss > limit:
                    self._drop(key)
                    try:
                        over(rss)
                    except Exception:  # the watchdog must outlive one run's failure
                        log.exception("sandbox watchdog: stopping pid %d failed", pid)


WATCHDOG = Watchdog()
