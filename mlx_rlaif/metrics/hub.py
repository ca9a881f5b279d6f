"""MetricsHub: the one object the training loop talks to. It receives plain numbers and records,
keeps the rolling stats, runs the health checks, and fans everything out to the sinks:

- JSONL (always): `batches.jsonl`, `epochs.jsonl`, `samples.jsonl`, `health.jsonl`,
  `eval.jsonl` (the periodic held-out evaluations);
- TensorBoard (`logging.tensorboard`): `tensorboard/`;
- Weights & Biases and trackio (`logging.wandb`, `logging.trackio`: trackers.py), TensorBoard's
  keys;
- the live dashboard (a terminal and `logging.dashboard`), else plain lines;
- the collected dataset (`logging.collect_dataset`): `datasets/{split}.jsonl` + `README.md`.

With `resume=True` files are appended to, and the stats (baseline, best reward, throughput,
teacher totals) are rebuilt from the records of the steps before the first step logged.
Not covered: rendering (dashboard.py), tags (tensorboard.py), the stats maths (stats.py).
"""

from __future__ import annotations

import numbers
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from . import health, system
from .dashboard import Dashboard, PlainPrinter
from .dataset import DatasetWriter
from .jsonl import JsonlWriter, last_per_key, read_jsonl
from .stats import RunStats, finite, mean
from .tensorboard import TensorBoardSink, epoch_scalars, step_scalars
from .trackers import TrackerSink, open_trackers


def _now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def plain_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics as plain Python numbers (numpy scalars become floats). Anything else, such
    as an array, is a TypeError: it would hide a host sync in the sinks."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if value is None or type(value) in (int, float):
            out[key] = value
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[key] = float(value)
        else:
            raise TypeError(
                f"metric {key!r} is a {type(value).__name__}, not a plain number: convert it "
                "with float(...) (or .item()) once per step before log_step"
            )
    return out


def card_meta(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The few config values a dataset card names (model, reward, teacher, G), from the nested
    config dict or its flattened `a.b` form."""

    def get(path: str) -> Any:
        if path in hparams:
            return hparams[path]
        node: Any = hparams
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    keys = {
        "model": "model.path",
        "reward": "reward.type",
        "teacher_provider": "reward.teacher.provider",
        "teacher_model": "reward.teacher.model",
        "samples_per_prompt": "generation.num_samples_per_prompt",
    }
    return {name: v for name, path in keys.items() if (v := get(path)) not in (None, "", "none")}


class MetricsHub:
    def __init__(
        self,
        cfg: Any,
        run_dir: Path,
        view: Dashboard | PlainPrinter,
        tensorboard: TensorBoardSink | None,
        dataset: DatasetWriter | None,
        resume: bool,
        trackers: Sequence[TrackerSink] = (),
    ) -> None:
        self.cfg, self.run_dir, self.view = cfg, run_dir, view
        self.tb, self.dataset = tensorboard, dataset
        self.trackers = list(trackers)
        self._last_step = 0
        self._prior = self._read_prior() if resume else None
        self._baseline: tuple[float, str] | None = None
        self._files = {
            name: JsonlWriter(run_dir / f"{name}.jsonl", append=resume)
            for name in ("batches", "epochs", "samples", "health", "eval")
        }
        self.run_stats = RunStats()
        self._window: deque = deque(maxlen=cfg.health_check_interval_batches)
        self._checks = 0
        self._entropy_first: list[float] = []  # the first steps' policy/entropy (health check)
        self._hack_first: list[float] = []  # the first steps' hack/frac (health check)
        self._hack_examples: dict[str, str] = {}  # signal -> the latest task that raised it
        self._steps = 0  # steps logged (resumed runs: with the earlier ones)
        self._epoch_samples = 0
        self._summary: str | None = None
        self.view.start()  # last: nothing after it can fail and leave the terminal in live mode

    @classmethod
    def create(
        cls,
        cfg: Any,
        run_dir: Path,
        interactive: bool,
        total_steps: int,
        hparams: Mapping[str, Any],
        resume: bool = False,
        time_budget_s: float = 0.0,
    ) -> MetricsHub:
        """`cfg` is the `logging` config section; `interactive`: stdout is a terminal;
        `total_steps` the step the run ends at (0: none known), `time_budget_s` its time limit
        (training.max_minutes; 0: none): the progress display's bounds."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        trackers = open_trackers(cfg, run_dir, hparams)  # first: a missing package is one line
        tb = TensorBoardSink(run_dir / "tensorboard", hparams, resume) if cfg.tensorboard else None
        ds = (
            DatasetWriter(run_dir / "datasets", resume, card_meta(hparams))
            if cfg.collect_dataset
            else None
        )
        view: Dashboard | PlainPrinter = (
            Dashboard(total_steps, time_budget_s=time_budget_s)
            if interactive and cfg.dashboard
            else PlainPrinter(total_steps, cfg.log_every, sys.stdout, time_budget_s)
        )
        return cls(cfg, run_dir, view, tb, ds, resume, trackers)

    # --- resume -----------------------------------------------------------------------------

    def _read_prior(self) -> tuple[list[dict], list[dict]]:
        return (
            last_per_key(read_jsonl(self.run_dir / "batches.jsonl"), "step"),
            last_per_key(read_jsonl(self.run_dir / "epochs.jsonl"), "epoch"),
        )

    def _replay(self, before_step: int) -> None:
        """On the first call after a resume: rebuild the stats from the earlier records."""
        if self._prior is None:
            return
        batches, epochs = self._prior
        self._prior = None
        self.run_stats = RunStats.replay(batches, epochs, before_step)
        earlier = [r for r in batches if isinstance(r.get("step"), int) and r["step"] < before_step]
        self._window.extend(earlier[-self._window.maxlen :])
        self._entropy_first = health.first_entropy(earlier, health.Thresholds.entropy_first_steps)
        self._hack_first = first_hack(earlier, health.Thresholds.hack_first_steps)
        self._steps = len(earlier)
        self.view.restore(earlier)
        if self._baseline is not None:
            self.run_stats.set_baseline(*self._baseline)

    # --- the loop's interface ---------------------------------------------------------------

    def set_baseline(self, reward: float, source: str = "baseline evaluation") -> None:
        """The reward before training (e.g. from `logging.baseline_eval_batches` batches scored
        before the first update). Without it the first step's mean reward is the baseline.
        A NaN (nothing could be scored) is ignored."""
        if finite(reward) is None:
            return
        self._baseline = (float(reward), source)
        self.run_stats.set_baseline(*self._baseline)

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's metrics (plain floats, namespaced keys). Cheap: no rendering."""
        record = plain_metrics(metrics)
        self._replay(step)
        for key, value in system.snapshot().items():
            record.setdefault(key, value)
        self.run_stats.observe(step, record)
        s = self.run_stats
        if s.baseline is not None:
            record["reward/baseline"] = s.baseline
        record["elapsed_s"] = s.elapsed
        self._files["batches"].write({"step": step, "timestamp": _now(), **record})
        if self.tb is not None and (step % self.cfg.log_every == 0 or step == 1):
            self.tb.step(step, record, s)
        if self.trackers and (step % self.cfg.log_every == 0 or step == 1):
            scalars = step_scalars(record, s)
            for t in self.trackers:
                t.log(step, scalars)
        self._last_step = max(self._last_step, step)
        self.view.step(step, record, s.best_reward, s.reward_ema, s.baseline)
        self._window.append(record)
        self._entropy_first = (self._entropy_first + health.first_entropy([record], 1))[
            : health.Thresholds.entropy_first_steps]
        self._hack_first = (self._hack_first + first_hack([record], 1))[
            : health.Thresholds.hack_first_steps]
        self._steps += 1
        if self.cfg.health_check_enabled and step % self.cfg.health_check_interval_batches == 0:
            self._health(step)

    def _health(self, step: int) -> None:
        report = health.check(
            list(self._window),
            step,
            self.run_stats.reward_ema,
            self.run_stats.baseline,
            self._checks,
            entropy_start=mean(self._entropy_first)
            if len(self._entropy_first) == health.Thresholds.entropy_first_steps else None,
            hack_early=self._hack_early(),
            hack_examples=dict(self._hack_examples),
        )
        self._checks += 1
        self._files["health"].write({"timestamp": _now(), **report.record()})
        self.view.health(report)

    def _hack_early(self) -> float | None:
        """hack/frac early in the run: the mean of its first steps (up to
        Thresholds.hack_first_steps) that came before the window the check reads."""
        k = min(len(self._hack_first), self._steps - len(self._window))
        return mean(self._hack_first[:k]) if k > 0 else None

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """Per-completion records: the first `samples_per_step` go to samples.jsonl, all of them
        to the dataset; the last one shows in the dashboard. Each signal's latest task is kept
        for the health check."""
        stamped = [{"step": step, "timestamp": _now(), **s} for s in samples]
        for s in samples:
            for name in s.get("signals") or ():
                self._hack_examples[str(name)] = str(s.get("task_id", "?"))
        self._files["samples"].write_many(stamped[: self.cfg.samples_per_step])
        for t in self.trackers:
            t.add_samples(stamped[: self.cfg.samples_per_step])
        if self.dataset is not None:
            self.dataset.add(stamped)
        self._epoch_samples += sum(1 for s in samples if s.get("split", "train") == "train")
        self.view.samples(stamped)

    def log_eval(self, step: int, row: Mapping[str, Any]) -> None:
        """One periodic held-out evaluation (`eval/*` numbers): eval.jsonl, TensorBoard and a
        line on the dashboard or the plain log."""
        record = {"step": step, "timestamp": _now(), **row}
        self._files["eval"].write(record)
        if self.tb is not None:
            self.tb.scalars(step, {k: v for k, v in row.items() if k.startswith("eval/")})
        for t in self.trackers:
            t.log(step, {k: x for k, v in row.items()
                         if k.startswith("eval/") and (x := finite(v)) is not None})
        self.view.evaluation(step, row)

    def end_epoch(self, epoch: int) -> dict[str, float]:
        """Aggregate the steps since the previous epoch end; written to epochs.jsonl and
        TensorBoard (Epoch/*). Returns the aggregate."""
        self._replay(sys.maxsize)
        agg = self.run_stats.end_epoch(epoch, self._epoch_samples)
        self._epoch_samples = 0
        self._files["epochs"].write({**agg, "timestamp": _now()})
        if self.tb is not None:
            self.tb.epoch(epoch, agg, self.run_stats)
        for t in self.trackers:  # at the epoch's last step: a tracker's steps only go forward
            t.log(self._last_step, {**epoch_scalars(agg, self.run_stats), "epoch": epoch})
        self.view.message(epoch_line(agg))
        return agg

    def message(self, text: str) -> None:
        self.view.message(text)

    def stats(self) -> dict:
        """Rolling stats for training_stats.json / checkpoint_summary.json."""
        self._replay(sys.maxsize)
        return self.run_stats.as_dict()

    def close(self) -> str:
        """Flush and close every sink, print the end-of-run summary and return its text."""
        if self._summary is not None:
            return self._summary
        self._replay(sys.maxsize)
        self._summary = self.run_stats.summary_text()
        for f in self._files.values():
            f.close()
        if self.tb is not None:
            self.tb.close()
        for t in self.trackers:
            t.close(self._last_step or None)
        if self.dataset is not None:
            self.dataset.close()
        self.view.close(self._summary)
        return self._summary

    def __enter__(self) -> MetricsHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_hack(records: Sequence[Mapping], n: int) -> list[float]:
    """hack/frac of the first `n` records that report it, in step order."""
    ordered = sorted(records, key=lambda r: r.get("step") or 0)
    return [x for r in ordered if (x := finite(r.get("hack/frac"))) is not None][:n]


def epoch_line(agg: Mapping[str, Any]) -> str:
    """`epoch 1: 10 steps | reward 0.512 (trend +0.100) | loss 0.0341 | ...`"""
    parts = [f"epoch {agg['epoch']}: {agg['steps']} steps"]
    for key, template in (
        ("reward/mean", "reward {:.4f}"),
        ("reward/trend", "trend {:+.4f}"),
        ("loss/total", "loss {:.4g}"),
        ("kl/mean", "kl {:.4g}"),
        ("num_samples", "samples {:.0f}"),
        ("teacher/tokens", "teacher tokens {:,.0f}"),
        ("teacher/cost_usd", "cost ${:.4f}"),
    ):
        x = finite(agg.get(key))
        if x is not None:
            parts.append(template.format(x))
    return " | ".join(parts)
