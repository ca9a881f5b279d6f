"""Worker processes for a reward function: killed and restarted when a call hangs.

`WorkerPool(spec, ...)` starts `workers` processes (fresh interpreters, `python -m
mlx_rlaif.rewards.custom.worker`, talking over a socket pair: nothing of the trainer's state, no
MLX, is inherited, and no `__main__` is imported again; what the function prints, stdout and
stderr, goes to stderr through relay.py: each line `[spec] text`, control characters escaped,
never into a command's output) that each load the function; `run(units, step)` spreads the argument sets
over them and returns one outcome per set (each worker message is JSON text, never a pickle:
worker.py): ("ok", plain value), ("error", the exception's last line)
or ("timeout", None). A worker silent for longer than the timeout past its last answer is
killed (SIGKILL: a thread or an asyncio timeout cannot stop a function stuck in C code or a
sleep) and a fresh one takes the rest of its sets: with a sync function the set it hung on is
the timeout, with an `async def` one every set still in flight. A worker that dies (a crash, an
`os._exit`) is an error on its set and is restarted the same way.

`run(..., give_up=f)` ends the batch early: `f(index, outcome)` sees each outcome as it comes
and, once it says True (on_error stop: the first failure; unscorable: more failures than the
batch may have), every worker still busy on the batch is killed and replaced by a fresh one
and the sets not yet answered come back ("cancelled", None). So a function that hangs on every
call costs one timeout (plus the kill), not sets x timeout / workers.

Not covered: a function that forks processes of its own and leaves them running (their parent
is killed; they are not).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ...errors import RewardError
from .relay import relay

Outcome = tuple[str, Any]  # ("ok", value) | ("error", line) | ("timeout" | "cancelled", None)
GiveUp = Callable[[int, Outcome], bool]
START_S = 120.0  # a worker's start (Python, the user's imports) on a loaded machine
ASYNC_GRACE_S = 1.0  # an async function's own wait_for answers first


@dataclass
class _Worker:
    process: Any
    conn: Any
    ready: bool = False
    call: int = 0
    sent: list[int] = field(default_factory=list)  # global index of each set of the call
    pending: list[int] = field(default_factory=list)
    deadline: float = 0.0


class WorkerPool:
    def __init__(self, spec: str, kwargs: Mapping[str, Any], group: bool, workers: int,
                 concurrency: int, timeout_s: float, is_async: bool = False) -> None:
        self.spec, self.timeout_s, self.is_async = spec, timeout_s, is_async
        self._args = (spec, dict(kwargs), group, concurrency, timeout_s)
        self._workers = [self._start() for _ in range(workers)]
        self._calls = 0
        self._arrived: list[int] = []
        self.restarts = 0

    def _start(self) -> _Worker:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            p = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.rewards.custom.worker",
                                  str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
            conn = Connection(os.dup(ours.fileno()))
        relay(p.stdout, self.spec)  # its prints: sanitized lines on stderr
        conn.send(self._args)
        return _Worker(p, conn)

    def _ready(self, w: _Worker) -> None:
        if w.ready:
            return
        if not w.conn.poll(START_S):
            _kill(w)
            raise RewardError(f"reward function {self.spec}: its worker process did not start "
                              f"within {START_S:g} s")
        try:
            status, payload = _decode(w.conn.recv_bytes(), 2)
        except (EOFError, OSError, ValueError):
            _kill(w)
            raise RewardError(f"reward function {self.spec}: its worker process exited at start "
                              f"(exit code {w.process.returncode})") from None
        if status == "load_error":
            raise RewardError(payload)
        w.ready = True

    def run(self, units: Sequence[Mapping[str, Any]], step: int,
            give_up: GiveUp | None = None) -> list[Outcome]:
        """One outcome per argument set, in order; once `give_up(index, outcome)` says True, the
        sets still out are cancelled (their workers killed and replaced)."""
        out: list[Outcome | None] = [None] * len(units)
        self._arrived = []  # indices, in the order their outcomes came
        n_workers = min(len(self._workers), len(units))
        for i in range(n_workers):
            self._send(i, list(range(i, len(units), n_workers)), units, step)
        busy, looked = set(range(n_workers)), 0
        while busy:
            soonest = min(self._workers[i].deadline for i in busy)
            conns = {self._workers[i].conn: i for i in busy}
            left: dict[int, list[int]] = {}  # a replaced worker's sets still to do
            for conn in wait(list(conns), timeout=max(0.0, soonest - time.monotonic())):
                i = conns[conn]
                if not self._receive(i, out):
                    left[i] = self._replace(i, "error", out)
            for i in busy - set(left):
                w = self._workers[i]
                if w.pending and time.monotonic() > w.deadline:
                    left[i] = self._replace(i, "timeout", out)
            new, looked = self._arrived[looked:], len(self._arrived)
            if give_up is not None and any(give_up(j, out[j]) for j in new):  # type: ignore[arg-type]
                self._cancel(busy)
                break
            for i, rest in left.items():
                if rest:
                    self._send(i, rest, units, step)
            busy = {i for i in busy if self._workers[i].pending}
        return [o or ("cancelled", None) for o in out]

    def _cancel(self, busy: set[int]) -> None:
        """Kill the workers still on a batch that was given up on; fresh ones take their place
        (started now, ready by the next batch)."""
        for i in busy:
            if self._workers[i].pending:
                _kill(self._workers[i])
                self.restarts += 1
                self._workers[i] = self._start()

    def _send(self, i: int, indices: list[int], units: Sequence[Mapping[str, Any]],
              step: int) -> None:
        w = self._workers[i]
        self._ready(w)
        self._calls += 1
        w.call, w.sent, w.pending = self._calls, indices, list(indices)
        w.conn.send(("call", w.call, [units[j] for j in indices], step))
        w.deadline = time.monotonic() + self._wait_s()

    def _wait_s(self) -> float:
        return self.timeout_s + (ASYNC_GRACE_S if self.is_async else 0.0)

    def _receive(self, i: int, out: list[Outcome | None]) -> bool:
        """Take one answer of worker i (False: it died)."""
        w = self._workers[i]
        try:
            call, k, status, payload = _decode(w.conn.recv_bytes(), 4)
        except (EOFError, OSError, ValueError):
            return False
        if call == w.call:
            j = w.sent[k]
            out[j] = (status, payload)
            self._arrived.append(j)
            w.pending.remove(j)
            w.deadline = time.monotonic() + self._wait_s()
        return True

    def _replace(self, i: int, why: str, out: list[Outcome | None]) -> list[int]:
        """Kill worker i (hung past its timeout, or dead), mark the sets it was on and start a
        fresh one; the sets it had not begun come back (to send to the fresh one)."""
        w = self._workers[i]
        _kill(w)
        lost = list(w.pending) if self.is_async else w.pending[:1]
        code = w.process.returncode
        for j in lost:
            out[j] = ("timeout", None) if why == "timeout" else (
                "error", f"its worker process exited (exit code {code})")
            self._arrived.append(j)
        self.restarts += 1
        self._workers[i] = self._start()
        return [j for j in w.pending if j not in lost]

    def close(self) -> None:
        for w in self._workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(("stop", None))
        for w in self._workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.process.wait(2)
            _kill(w)
            w.conn.close()


def _decode(data: bytes, n: int) -> list[Any]:
    """A worker's message: JSON text, a list of n items (ValueError otherwise), never a
    pickle."""
    msg = json.loads(data)
    if not isinstance(msg, list) or len(msg) != n:
        raise ValueError("not a worker message")
    return msg


def _kill(w: _Worker) -> None:
    if w.process.poll() is None:
        w.process.kill()
    w.process.wait()
