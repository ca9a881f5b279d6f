"""Calling a loaded function on argument sets (`call_units`: in a worker process, or in the
server of `mlx-rlaif serve-reward`), and the worker process's loop (`main`).

A worker loads the function itself (its spec, not a pickled object), says `ready` (or one line
why not), then answers each `call` with one message per argument set as soon as it is done:
(call id, index, "ok" | "error" | "timeout", value or the exception's last line with its file
and line). Every message is JSON text (`send_bytes`), never a pickle: the value is checked and
made plain data here (contract.plain_value: float, None, dict of str -> float; a function of
lists, a list of them), under the pool's timeout, and an exception crosses as its line; so
nothing the function made (an own class, an object whose `__reduce__` sleeps) is unpickled in
the trainer. What it prints reaches the trainer's terminal only through pool.py's relay. Sync functions run one after another (the pool knows which one hangs: the first
unanswered); `async def` functions run concurrently, at most `concurrency` at once, each under
`asyncio.wait_for(timeout)` (the pool's kill covers one that blocks the loop). SIGINT is
ignored: Ctrl-C is the trainer's to handle.

Not covered: functions that need the trainer's state (they get plain arguments only).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .contract import ValueProblem, arguments, plain_list, plain_value
from .spec import Loaded, load_function

Send = Callable[[int, str, Any], None]


def last_line(e: BaseException) -> str:
    """The traceback's last line, with the file and line where it was raised."""
    line = traceback.format_exception_only(type(e), e)[-1].strip()
    frames = traceback.extract_tb(e.__traceback__)
    return line + (f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else "")


def call_units(fn: Loaded, units: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any],
               step: int, concurrency: int, timeout_s: float, send: Send,
               trusted: bool = True) -> None:
    """`send(index, status, payload)` for each argument set, in the order they finish
    (trusted: the records may fill any parameter, contract.arguments)."""
    if fn.is_async:
        asyncio.run(_gather(fn, units, kwargs, step, concurrency, timeout_s, send, trusted))
        return
    for k, unit in enumerate(units):
        try:
            value = fn.fn(**arguments(fn, unit, kwargs, step, trusted))
        except ValueProblem as e:
            send(k, "error", str(e))
        except BaseException as e:  # noqa: BLE001 - the user's exception, reported by line
            send(k, "error", last_line(e))
        else:
            send(k, "ok", value)


async def _gather(fn: Loaded, units: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any],
                  step: int, concurrency: int, timeout_s: float, send: Send,
                  trusted: bool) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(k: int, unit: Mapping[str, Any]) -> None:
        async with gate:
            try:
                call = fn.fn(**arguments(fn, unit, kwargs, step, trusted))
                value = await asyncio.wait_for(call, timeout_s)
            except asyncio.TimeoutError:
                send(k, "timeout", None)
            except ValueProblem as e:
                send(k, "error", str(e))
            except BaseException as e:  # noqa: BLE001
                send(k, "error", last_line(e))
            else:
                send(k, "ok", value)

    await asyncio.gather(*(one(k, u) for k, u in enumerate(units)))


def sendable(value: Any, n: int | None) -> tuple[str, Any]:
    """(status, payload) of a value for the pipe: plain data (`n`: a function of lists' number
    of completions), or an error line saying what the contract refused."""
    try:
        return "ok", plain_value(value) if n is None else plain_list(value, n)
    except ValueProblem as e:
        return "error", str(e)
    except BaseException as e:  # noqa: BLE001 - a value whose own methods raise
        return "error", f"its value could not be read: {last_line(e)}"


def _message(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def main(fd: int) -> None:
    """A worker process on socket `fd`: read its arguments, load the function, then answer
    calls until told to stop or the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        serve(conn)
    except (EOFError, OSError):  # the trainer went away (closed the pool, or exited)
        return


def serve(conn: Any) -> None:
    spec, kwargs, group, concurrency, timeout_s = conn.recv()  # the trainer's own message
    try:
        fn = load_function(spec, kwargs, None, group)
    except Exception as e:  # noqa: BLE001 - a ConfigError's line, or anything the import raised
        conn.send_bytes(_message(["load_error", _text(e)]))
        return
    conn.send_bytes(_message(["ready", None]))
    while True:
        msg = conn.recv()
        if msg[0] != "call":
            return
        _, call_id, units, step = msg

        def send(k: int, status: str, payload: Any, call_id: int = call_id,
                 units: Any = units) -> None:
            if status == "ok":
                n = len(units[k].get("completions", ())) if fn.batched else None
                status, payload = sendable(payload, n)
            elif payload is not None:
                payload = _text(payload)
            conn.send_bytes(_message([call_id, k, status, payload]))

        call_units(fn, units, kwargs, step, concurrency, timeout_s, send)


def _text(x: Any) -> str:
    """An error's line as plain text (str() of it, or its type when that fails)."""
    try:
        return str.__str__(str(x))
    except BaseException:  # noqa: BLE001
        return f"{type(x).__name__} (its text could not be read)"


if __name__ == "__main__":
    main(int(sys.argv[1]))
