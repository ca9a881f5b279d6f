"""Metrics: plain numbers from the training loop, fanned out to sinks by `MetricsHub`.

Modules: hub (the loop's interface), jsonl (the source of truth), tensorboard, dashboard (rich
live view and plain lines), health (periodic checks), stats (rolling stats and the end-of-run
summary), system (memory and CPU readings), dataset (collected records and the dataset card),
summary (tables, CSV and plots of a finished run for `mlx-rlaif summary`).
"""

from __future__ import annotations

from .hub import MetricsHub

__all__ = ["MetricsHub"]
