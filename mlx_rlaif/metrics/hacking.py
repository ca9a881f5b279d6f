"""A run's reward-hacking signals for `mlx-rlaif summary`: the steps where completions raised
them (batches.jsonl's `hack/frac` and `hack/<signal>`) and examples (samples.jsonl's `signals`
and `signal_reasons`: the task, the step and the reason of the first completions of each signal).

Covered: plain lines, any text from the records (task ids, reasons) with its control characters
escaped. Not covered: completions not written to samples.jsonl (logging.samples_per_step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..terminal import visible
from .jsonl import read_jsonl
from .stats import finite

EXAMPLES = 2  # per signal


def _plain(text: object) -> str:
    """One visible line (terminal.visible): control characters, newlines and bidirectional
    overrides of a record's text as escapes."""
    return visible(text, lines=False)


def step_lines(records: Sequence[Mapping]) -> list[str]:
    """`step 4: 25% of completions (special_casing 2, exit_call 1)` per step that raised any."""
    out = []
    for r in records:
        frac = finite(r.get("hack/frac"))
        if not frac:
            continue
        counts = sorted(((k[5:], finite(v) or 0.0) for k, v in r.items()
                         if k.startswith("hack/") and k != "hack/frac"),
                        key=lambda kv: (-kv[1], kv[0]))
        what = ", ".join(f"{_plain(k)} {v:.0f}" for k, v in counts if v)
        out.append(f"step {_plain(r.get('step'))}: {frac:.0%} of completions ({what})")
    return out


def example_lines(samples: Sequence[Mapping], per_signal: int = EXAMPLES) -> list[str]:
    """Up to `per_signal` completions of each signal: `special_casing: step 4, task t1: why`."""
    shown: dict[str, int] = {}
    out = []
    for s in samples:
        reasons = s.get("signal_reasons") or {}
        for name in s.get("signals") or ():
            if shown.get(name, 0) >= per_signal:
                continue
            shown[name] = shown.get(name, 0) + 1
            out.append(f"{_plain(name)}: step {_plain(s.get('step'))}, "
                       f"task {_plain(s.get('task_id'))}: "
                       f"{_plain(reasons.get(name, ''))}")
    return sorted(out)


def report(run_dir: Path, records: Sequence[Mapping]) -> list[str]:
    """The summary's hacking section (empty where the run's records carry no hack/frac)."""
    if not any("hack/frac" in r for r in records):
        return []
    steps = step_lines(records)
    if not steps:
        return [f"hacking signals: none in {len(records)} steps"]
    samples = read_jsonl(Path(run_dir) / "samples.jsonl") \
        if (Path(run_dir) / "samples.jsonl").is_file() else []
    return ["hacking signals (docs/hacking.md):", *(f"  {s}" for s in steps),
            "examples (samples.jsonl):", *(f"  {e}" for e in example_lines(samples))]
