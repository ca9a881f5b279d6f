"""A finished (or running) run's JSONL as a table, a CSV file and PNG curves, for
`mlx-rlaif summary`.

Covered: batch, epoch and periodic held-out evaluation records (and the ranks a
data-parallel run ran on) (steps a resumed run did again
appear once, the later record winning), a table of the last N records with the columns that
exist, a CSV of every key, and a 2x2 figure (reward with min/max band and baseline, KL, loss,
throughput; for evaluations one panel of pass@1 and mean reward). matplotlib is imported
only for the plot. Keys and values from the records (task ids, component names) go into the
tables as rich Text through terminal.visible: no control characters, no markup read from them.
Not covered: comparing several runs in one figure.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..terminal import text, visible
from .jsonl import atomic_write, last_per_key, read_jsonl
from .stats import components, finite, mean

FILES = {"batch": ("batches.jsonl", "step"), "epoch": ("epochs.jsonl", "epoch"),
         "eval": ("eval.jsonl", "step")}

COLUMNS = {
    "batch": (
        "step",
        "epoch",
        "batch",
        "reward/mean",
        "reward/std",
        "reward/frac_zero_std",
        "kl/mean",
        "distill/kl",
        "loss/total",
        "policy/clipfrac",
        "policy/entropy",
        "gen/tokens_per_sec",
        "gen/tokens_per_pass",
        "train/tokens_per_sec",
        "time/step",
        "elapsed_s",
        "time/eta_s",
        "system/thermal",
        "memory/mlx_peak_gb",
        "teacher/cost_usd",
    ),
    "epoch": (
        "epoch",
        "steps",
        "reward/mean",
        "reward/variance",
        "reward/trend",
        "loss/total",
        "loss/trend",
        "kl/mean",
        "policy/clipfrac",
        "gen/tokens_per_sec",
        "train/tokens_per_sec",
        "num_samples",
        "teacher/tokens",
        "teacher/cost_usd",
        "duration_s",
    ),
    "eval": ("step", "eval/pass@1", "eval/reward_mean", "eval/tasks", "eval/samples_per_task",
             "new_best"),
}


def load(run_dir: Path, kind: str) -> list[dict]:
    """The run's batch or epoch records, one per step/epoch (the last written wins)."""
    name, key = FILES[kind]
    path = Path(run_dir) / name
    if not path.is_file():
        raise UsageError(
            f"{path} not found: pass a run directory (training.output_dir) that "
            f"has {name}" + {"epoch": " (epochs are written at each epoch end)",
                             "eval": " (written with data.eval_every)"}.get(kind, "")
        )
    return last_per_key(read_jsonl(path), key)


def ranks(records: Sequence[Mapping]) -> int:
    """The most ranks any record ran on (`dist/world_size`; runs from before it: 1)."""
    return int(max((finite(r.get("dist/world_size")) or 1 for r in records), default=1))


def tail(records: Sequence[dict], n: int) -> list[dict]:
    """The last n records (n <= 0: all)."""
    return list(records[-n:]) if n > 0 else list(records)


def columns(records: Sequence[Mapping], kind: str) -> list[str]:
    present = {k for r in records for k in r}
    return [c for c in COLUMNS[kind] if c in present]


def cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    x = finite(value)
    if x is None:
        return visible(value, lines=False)  # a task id, a reason: control characters escaped
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:,.0f}"


def table(records: Sequence[Mapping], kind: str, title: str = "") -> Table:
    """The records as a rich table; every cell and header a Text (no markup read from a key or
    a value: a task id's `[link=...]` stays text)."""
    cols = columns(records, kind)
    t = Table(title=text(title) if title else None, header_style="bold")
    for c in cols:
        t.add_column(Text(visible(c, lines=False).replace("/", "/\n")), justify="right",
                     no_wrap=True)
    for r in records:
        t.add_row(*(Text(cell(r.get(c))) for c in cols))
    return t


def component_table(records: Sequence[Mapping]) -> Table | None:
    """Per reward component over the records (None without components): the mean of its
    per-step mean and std, the mean None fraction, the errors and timeouts summed, and the
    mean seconds per step."""
    names = components(records)
    if not names:
        return None
    t = Table(title="reward components", header_style="bold")
    for c in ("component", "mean", "std", "frac None", "errors", "timeouts", "s/step"):
        t.add_column(c, justify="left" if c == "component" else "right", no_wrap=True)
    for name in names:
        def col(stat: str, how: Any = mean, name: str = name) -> str:
            vals = [finite(r.get(f"reward/{name}/{stat}")) for r in records]
            vals = [v for v in vals if v is not None]
            return cell(how(vals)) if vals else "-"
        t.add_row(text(name), col("mean"), col("std"), col("frac_none"), col("errors", sum),
                  col("timeouts", sum), col("seconds"))
    return t


def csv_text(records: Sequence[Mapping]) -> str:
    """Every key of every record as a column (first-seen order); missing cells are empty."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(keys), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


def write_csv(records: Sequence[Mapping], path: Path) -> None:
    atomic_write(Path(path), csv_text(records))


def series(records: Sequence[Mapping], x_key: str, key: str) -> tuple[list[float], list[float]]:
    pts = [
        (x, y)
        for r in records
        if (x := finite(r.get(x_key))) is not None and (y := finite(r.get(key))) is not None
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


PANELS = (
    ("Reward", ("reward/mean", "reward/baseline")),
    ("KL per token (to the reference; distill/kl: to the distillation target)",
     ("kl/mean", "kl/sample_train", "distill/kl")),
    ("Loss", ("loss/total", "loss/policy", "loss/kl")),
    ("Throughput (tokens/s)", ("gen/tokens_per_sec", "train/tokens_per_sec")),
)
EVAL_PANELS = (("Held-out evaluation", ("eval/pass@1", "eval/reward_mean")),)


def plot(records: Sequence[Mapping], kind: str, path: Path, title: str = "") -> None:
    """PNG curves of reward, KL, loss and throughput against step (or epoch)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib: pip install matplotlib (or mlx-rlaif[dev])"
        ) from None
    x_key = FILES[kind][1]
    panels = EVAL_PANELS if kind == "eval" else PANELS
    shape, size = ((1, 1), (7, 4.5)) if kind == "eval" else ((2, 2), (11, 7))
    fig, axes = plt.subplots(*shape, figsize=size, constrained_layout=True, squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels, strict=True):
        for key in keys:
            xs, ys = series(records, x_key, key)
            if xs:
                ax.plot(xs, ys, label=key, linestyle="--" if key.endswith("baseline") else "-")
        if name == "Reward":
            _band(ax, records, x_key)
        ax.set_title(name)
        ax.set_xlabel(x_key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(Path(path), buf.getvalue())


def _band(ax: Any, records: Sequence[Mapping], x_key: str) -> None:
    pts = [
        (x, lo, hi)
        for r in records
        if (x := finite(r.get(x_key))) is not None
        and (lo := finite(r.get("reward/min"))) is not None
        and (hi := finite(r.get("reward/max"))) is not None
    ]
    if pts:
        ax.fill_between(
            [p[0] for p in pts],
            [p[1] for p in pts],
            [p[2] for p in pts],
            alpha=0.2,
            label="min-max",
        )
