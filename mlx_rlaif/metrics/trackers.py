"""Experiment trackers: Weights & Biases (`logging.wandb`) and Hugging Face's local-first trackio
(`logging.trackio`), as sinks beside TensorBoard.

Each receives what TensorBoard receives, under the same keys (tensorboard.py's `step_scalars`
and `epoch_scalars`, the periodic evaluation's `eval/*`), the run's config once (flattened to
dotted keys) and, at the end, the samples as a table (step, split, task, reward, completion: the
rows samples.jsonl holds). The project is `logging.tracker_project`, the run's name
`logging.tracker_run_name` (default: the run directory's name). W&B's own settings are honoured
as it reads them (`WANDB_MODE=offline` writes the run under `<output_dir>/wandb/` and sends
nothing; `WANDB_API_KEY` from the environment); trackio writes to its local store (TRACKIO_DIR,
default ~/.cache/huggingface/trackio). Only rank 0 logs: the other ranks of a data-parallel run
have no MetricsHub (train/trainer.py gives them a silent one).

A missing package is one line naming the install (`pip install 'mlx-rlaif[wandb]'`), at the start
of the run. Not covered: resuming the same tracker run (a resumed run is a new tracker run),
histograms, media, alerts, trackio's Spaces sync.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError

SAMPLE_COLUMNS = ("step", "split", "task_id", "reward", "completion")
MAX_TABLE_ROWS = 2000
COMPLETION_CHARS = 2000


def import_tracker(name: str) -> Any:
    """The tracker's module, or one line saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise UsageError(f"logging.{name} is on but the {name} package is not installed: "
                         f"pip install 'mlx-rlaif[{name}]' (or set logging.{name}: false)") \
            from None


def sample_row(sample: Mapping[str, Any]) -> list[Any]:
    completion = str(sample.get("completion", sample.get("text", "")))[:COMPLETION_CHARS]
    reward = sample.get("reward")
    return [sample.get("step"), sample.get("split", "train"), str(sample.get("task_id", "")),
            float(reward) if isinstance(reward, (int, float)) else None, completion]


class TrackerSink:
    """One tracker run: `log(step, scalars)`, `add_samples(rows)`, `close()`."""

    def __init__(self, name: str, module: Any, run: Any) -> None:
        self.name, self.module, self.run = name, module, run
        self.rows: list[list[Any]] = []

    @classmethod
    def open(cls, name: str, project: str, run_name: str, run_dir: Path,
             config: Mapping[str, Any]) -> TrackerSink:
        mod = import_tracker(name)
        if name == "wandb":
            run = mod.init(project=project, name=run_name, dir=str(run_dir), config=dict(config),
                           reinit="finish_previous")
        else:
            run = mod.init(project=project, name=run_name, config=dict(config), embed=False)
        return cls(name, mod, run)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if scalars:
            self.run.log(dict(scalars), step=step)

    def add_samples(self, samples: Sequence[Mapping[str, Any]]) -> None:
        room = MAX_TABLE_ROWS - len(self.rows)
        self.rows.extend(sample_row(s) for s in samples[:max(room, 0)])

    def close(self, step: int | None) -> None:
        if self.rows:
            table = self.module.Table(columns=list(SAMPLE_COLUMNS), data=self.rows)
            self.run.log({"samples": table}, step=step)
        self.run.finish()


def open_trackers(cfg: Any, run_dir: Path, config: Mapping[str, Any]) -> list[TrackerSink]:
    """The trackers `cfg` (the logging section) turns on."""
    run_name = cfg.tracker_run_name or Path(run_dir).resolve().name
    return [TrackerSink.open(name, cfg.tracker_project, run_name, Path(run_dir), config)
            for name in ("wandb", "trackio") if getattr(cfg, name)]
