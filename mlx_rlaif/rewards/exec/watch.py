"""The audit channel around one sandboxed Python run of the student's code (the function server
of a HumanEval or function-call task): `watched(sandbox, box, found)` makes the channel, gives
its spec to `Sandbox.start(audit=...)` and, when the block ends, adds to `found` the runtime
signals (signals.py `audit_signals`, `result_signals`) of what the hook reported and how the
run ended.

Not covered: stdin/stdout programs (their runs are served by sandbox/runs.py, which passes no
audit spec yet: for them only the run results' signals and the static read count).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...sandbox import Box, Running, Sandbox, SandboxError
from ...sandbox.audit import Channel
from .signals import audit_signals, merge, result_signals


@dataclass
class Watch:
    spec: dict
    channel: Channel
    runs: list[Running] = field(default_factory=list)

    def started(self, run: Running) -> None:
        self.runs.append(run)
        self.channel.opened()


@contextmanager
def watched(sandbox: Sandbox, box: Box, found: list[dict[str, str]], serve: bool = True
            ) -> Iterator[Watch]:
    channel = Channel()
    writable = [box.inside, "/tmp"] if sandbox.mode == "bwrap" else [box.inside]
    watch = Watch(channel.spec(box.inside, writable, serve), channel)
    try:
        yield watch
        results = []
        for run in watch.runs:
            try:
                results.append(run.wait())
            except SandboxError:
                return  # our failure: the caller raises it or scores without this run
        if results:
            found.extend(merge(audit_signals(channel.read(), results, serve),
                               result_signals(results)))
    finally:
        channel.close()
