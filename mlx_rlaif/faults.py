"""Test-only fault injection: `fault(point)` does nothing unless the environment variable
`MLX_RLAIF_FAULT` names `point`. The fault-injection tests (tests/test_faults_*.py) use it to kill
or signal a run at an exact place; never set it in a real run.

`MLX_RLAIF_FAULT=POINT[@N][:ACTION]`: the N-th time (default 1) this process reaches POINT, it
calls `prepare` (when the caller gives one), then ACTION: `kill` (SIGKILL to itself, like
`kill -9`; the default), `sigint` or `sigterm` (that signal to itself, then it goes on), `raise`
(a RuntimeError, as a bug would). Points: `generate`, `score`, `update` (train/step.py, as each
phase of a step starts; `score` as each group is scored, maybe while others still decode), `checkpoint-weights` (the adapters and optimizer are written in the
temporary directory), `checkpoint-rename` (every file written, before the rename), `jsonl`
(half of a JSONL write is on disk: a torn line).

Not covered: faults in threads other than the caller's, faults inside MLX or the SDKs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_hits: dict[str, int] = {}


def fault(point: str, prepare: Callable[[], object] | None = None) -> None:
    """Inject the fault `MLX_RLAIF_FAULT` asks for, if it names `point` (see the module doc)."""
    spec = os.environ.get("MLX_RLAIF_FAULT", "")
    where, _, action = spec.partition(":")
    name, _, nth = where.partition("@")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] != int(nth or 1):
        return
    if prepare is not None:
        prepare()
    if action == "raise":
        raise RuntimeError(f"injected fault at {point} (MLX_RLAIF_FAULT={spec})")
    name = (action or "kill").upper()
    os.kill(os.getpid(), getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))
