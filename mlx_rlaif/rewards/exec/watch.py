"""The audit channel around one sandboxed Python run of the student's code (the function server
of a HumanEval or function-call task): `watched(sandbox, box)` makes the channel and yields a
`Watch` whose `spec` goes to `Sandbox.start(audit=...)`; once the run has been stopped,
`watch.signals(answered)` reads the channel and gives the runtime signals (signals.py
`audit_signals`, `result_signals`) of what the hook reported and how the run ended.

`watched_runs(sandbox, box, n, python, found)` does the same for the runs of a stdin/stdout
program (sandbox/runs.py: one sandbox start serves them, or one per run), with one key per
possible start; a compiled program runs without the hook, and only its results are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...sandbox import Box, Running, RunResult, Sandbox, SandboxError
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

    def signals(self, answered: bool) -> list[dict[str, str]]:
        """The runtime signals, once every run has ended (`answered`: the student's process
        answered at least one call); none where our sandbox failed."""
        results = []
        for run in self.runs:
            try:
                results.append(run.wait())
            except SandboxError:
                return []  # our failure: the caller raises it or scores without this run
        if not results:
            return []
        return merge(audit_signals(self.channel.read(), results, True, answered),
                     result_signals(results))


@contextmanager
def watched(sandbox: Sandbox, box: Box) -> Iterator[Watch]:
    channel = Channel()
    writable = [box.inside, "/tmp"] if sandbox.mode == "bwrap" else [box.inside]
    try:
        yield Watch(channel.spec(box.inside, writable, serve=True, readable=sandbox.readable),
                    channel)
    finally:
        channel.close()


def answered_calls(results: list[dict]) -> bool:
    """Whether the student's server answered a call (a value or an exception of its own)."""
    return any(r["reason"] in ("passed", "wrong_answer") or "raised" in r for r in results)


def answered_units(verdict_lines: list[str]) -> bool:
    """Whether a HumanEval unit got past the student's answers (passed or compared wrong)."""
    return any('"passed": true' in ln or '"wrong_answer"' in ln for ln in verdict_lines)


@dataclass
class RunsWatch:
    spec: dict | None  # None: not Python, no hook
    inputs: list[bytes] = field(default_factory=list)  # each test's stdin
    results: list[RunResult] = field(default_factory=list)


@contextmanager
def watched_runs(sandbox: Sandbox, box: Box, n: int, python: bool,
                 found: list[dict[str, str]]) -> Iterator[RunsWatch]:
    """The audit channel (Python) around the `n` runs of a program; when the block ends, the
    runtime signals of the runs made (`RunsWatch.results`) are added to `found`."""
    channel = Channel(copies=n + 1) if python else None
    writable = [box.inside, "/tmp"] if sandbox.mode == "bwrap" else [box.inside]
    watch = RunsWatch(channel.spec(box.inside, writable, readable=sandbox.readable)
                      if channel else None)
    try:
        yield watch
        if channel is not None and watch.results:
            found.extend(audit_signals(channel.read(), watch.results, False))
        found.extend(result_signals(watch.results, watch.inputs))
    finally:
        if channel is not None:
            channel.close()
