"""Rolling run statistics: throughput (average and P99), token totals, teacher usage per epoch,
baseline and best reward, epoch aggregates, and the end-of-run summary text.

Covered: everything is computed from the plain step dicts the loop logs, so a resumed run rebuilds
it by replaying `batches.jsonl`. `teacher/*` values are running totals (what a reward's
`metrics()` reports); a total that goes down (the counters restarted) counts from zero again.
Not covered: writing files (the hub and sinks do that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# Per-step amounts that add up over an epoch (everything else numeric is averaged).
SUM_KEYS = (
    "gen/tokens",
    "train/tokens",
    "time/generate",
    "time/score",
    "time/train",
    "time/step",
    "optim/skipped",
)
TEACHER_KEYS = (
    "teacher/calls",
    "teacher/cache_hits",
    "teacher/input_tokens",
    "teacher/output_tokens",
    "teacher/cost_usd",
    "teacher/unscorable",
)
NOT_AVERAGED = {"epoch", "batch", "step", "elapsed_s", "reward/baseline", "time/training_s"}
EMA_DECAY = 0.9


def finite(value: object) -> float | None:
    """`value` as a finite float, or None (missing, None, NaN, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


COMPONENT_STATS = ("mean", "std", "frac_none", "errors", "timeouts", "seconds")


def components(records: Iterable[Mapping[str, object]]) -> list[str]:
    """The reward components whose metrics the records hold (`reward/<name>/seconds`, written
    for each component of reward.components), in first-seen order."""
    names: dict[str, None] = {}
    for r in records:
        for k in r:
            if k.startswith("reward/") and k.endswith("/seconds"):
                names[k[len("reward/"):-len("/seconds")]] = None
    return list(names)


def mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def p99(values: Sequence[float]) -> float | None:
    """99th percentile with linear interpolation (numpy's default), None when empty."""
    return float(np.percentile(values, 99)) if values else None


def pooled_variance(means: Sequence[float], stds: Sequence[float]) -> float:
    """Variance of all rewards of equally sized batches from each batch's mean and (population)
    std, by the law of total variance: E[std^2 + mean^2] - E[mean]^2."""
    m = sum(means) / len(means)
    second = sum(s * s + u * u for u, s in zip(means, stds, strict=True)) / len(means)
    return max(0.0, second - m * m)


@dataclass
class Counter:
    """A running total fed with readings of a counter that may restart from zero."""

    total: float = 0.0
    last: float | None = None

    def update(self, reading: float) -> None:
        grew = self.last is not None and reading >= self.last
        self.total += reading - self.last if grew else reading
        self.last = reading


def aggregate(records: Sequence[Mapping[str, object]]) -> dict[str, float]:
    """Means of every numeric key over `records` (sums for SUM_KEYS; teacher counters left out)."""
    values: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.items():
            x = finite(v)
            if x is not None and k not in NOT_AVERAGED and not k.startswith("teacher/"):
                values.setdefault(k, []).append(x)
    return {k: (sum(xs) if k in SUM_KEYS else sum(xs) / len(xs)) for k, xs in values.items()}


def epoch_reward_variance(records: Sequence[Mapping[str, object]]) -> float | None:
    pairs = [(finite(r.get("reward/mean")), finite(r.get("reward/std"))) for r in records]
    full = [(m, s) for m, s in pairs if m is not None and s is not None]
    if full:
        return pooled_variance([m for m, _ in full], [s for _, s in full])
    means = [m for m, _ in pairs if m is not None]
    return float(np.var(means)) if means else None


@dataclass
class RunStats:
    """Everything the hub keeps across steps; `observe` is the only way in."""

    elapsed_before: float = 0.0
    started: float = field(default_factory=time.time)
    steps: int = 0
    last_step: int = 0
    world_size: int = 1  # ranks of the run (`dist/world_size`; data parallel when above 1)
    gen_tps: list[float] = field(default_factory=list)
    train_tps: list[float] = field(default_factory=list)
    gen_tokens: float = 0.0
    train_tokens: float = 0.0
    teacher: dict[str, Counter] = field(default_factory=dict)
    baseline: float | None = None
    baseline_from: str = ""
    best_reward: float | None = None
    best_step: int | None = None
    last_reward: float | None = None
    _ema: float = 0.0
    _ema_n: int = 0
    window: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    _epoch_teacher_start: dict[str, float] = field(default_factory=dict)
    _epoch_started: float = field(default_factory=time.time)

    @classmethod
    def replay(
        cls, batches: Sequence[Mapping], epochs: Sequence[Mapping], before_step: int
    ) -> RunStats:
        """Rebuild the stats of a resumed run from its records, up to (not including)
        `before_step`, the first step the resumed run does again."""
        stats = cls()
        done = max(
            (int(e["epoch"]) for e in epochs if finite(e.get("epoch")) is not None), default=None
        )
        for r in batches:
            step = r.get("step")
            if not isinstance(step, int) or step >= before_step:
                continue
            if finite(r.get("reward/baseline")) is not None:
                stats.set_baseline(r["reward/baseline"], "from batches.jsonl")
            stats.observe(step, {k: v for k, v in r.items() if k != "step"})
            stats.elapsed_before = finite(r.get("elapsed_s")) or stats.elapsed_before
            if done is not None and (finite(r.get("epoch")) or 0) <= done:
                stats.window, stats._epoch_teacher_start = [], stats.teacher_totals()
        stats.epochs = [dict(e) for e in epochs]
        for counter in stats.teacher.values():
            counter.last = None  # the new process's counters start from zero
        return stats

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.started

    @property
    def reward_ema(self) -> float | None:
        """Bias-corrected EMA of the batch mean reward (decay EMA_DECAY)."""
        return self._ema / (1 - EMA_DECAY**self._ema_n) if self._ema_n else None

    def set_baseline(self, reward: float, source: str) -> None:
        self.baseline, self.baseline_from = float(reward), source

    def observe(self, step: int, metrics: Mapping[str, object]) -> None:
        self.steps += 1
        self.last_step = step
        self.window.append({"step": step, **metrics})
        self.world_size = int(finite(metrics.get("dist/world_size")) or self.world_size)
        self._throughput(metrics)
        for key in TEACHER_KEYS:
            x = finite(metrics.get(key))
            if x is not None:
                self.teacher.setdefault(key, Counter()).update(x)
        self._reward(step, finite(metrics.get("reward/mean")))

    def _throughput(self, m: Mapping[str, object]) -> None:
        for key, series in (
            ("gen/tokens_per_sec", self.gen_tps),
            ("train/tokens_per_sec", self.train_tps),
        ):
            x = finite(m.get(key))
            if x is not None and x > 0:
                series.append(x)
        self.gen_tokens += finite(m.get("gen/tokens")) or 0.0
        self.train_tokens += finite(m.get("train/tokens")) or 0.0

    def _reward(self, step: int, r: float | None) -> None:
        if r is None:
            return
        self.last_reward = r
        self._ema = EMA_DECAY * self._ema + (1 - EMA_DECAY) * r
        self._ema_n += 1
        if self.best_reward is None or r > self.best_reward:
            self.best_reward, self.best_step = r, step
        if self.baseline is None:
            self.set_baseline(r, f"first step ({step})")

    def teacher_totals(self) -> dict[str, float]:
        return {k: c.total for k, c in self.teacher.items()}

    def end_epoch(self, epoch: int, num_samples: int) -> dict[str, float]:
        """Aggregate the steps since the previous epoch end and start a new window."""
        recs, prev = self.window, (self.epochs[-1] if self.epochs else {})
        out: dict[str, float] = {"epoch": epoch, "steps": len(recs)}
        if recs:
            out.update(first_step=recs[0]["step"], last_step=recs[-1]["step"])
        out.update(aggregate(recs))
        var = epoch_reward_variance(recs)
        if var is not None:
            out["reward/variance"] = var
        totals = self.teacher_totals()
        for k, total in totals.items():
            out[k] = total - self._epoch_teacher_start.get(k, 0.0)
        if totals:
            out["teacher/tokens"] = out.get("teacher/input_tokens", 0.0) + out.get(
                "teacher/output_tokens", 0.0
            )
        if "reward/mean" in out and "reward/mean" in prev:
            out["reward/trend"] = out["reward/mean"] - prev["reward/mean"]
        if "loss/total" in out and "loss/total" in prev:
            out["loss/trend"] = prev["loss/total"] - out["loss/total"]  # > 0: loss went down
        out["num_samples"] = num_samples
        out["duration_s"] = time.time() - self._epoch_started
        self.epochs.append(out)
        self.window, self._epoch_teacher_start = [], totals
        self._epoch_started = time.time()
        return out

    def as_dict(self) -> dict:
        """Rolling stats for `training_stats.json` / `checkpoint_summary.json`."""
        gain = (
            self.reward_ema - self.baseline
            if self.reward_ema is not None and self.baseline is not None
            else None
        )
        return {
            "steps": self.steps,
            "last_step": self.last_step,
            "world_size": self.world_size,
            "duration_s": self.elapsed,
            "baseline_reward": self.baseline,
            "baseline_source": self.baseline_from,
            "reward_ema": self.reward_ema,
            "last_reward": self.last_reward,
            "best_reward": self.best_reward,
            "best_step": self.best_step,
            "reward_gain_from_baseline": gain,
            "generation": _perf(self.gen_tps, self.gen_tokens),
            "backprop": _perf(self.train_tps, self.train_tokens),
            "teacher": {
                **{k.split("/", 1)[1]: v for k, v in self.teacher_totals().items()},
                "per_epoch": [_teacher_epoch(e) for e in self.epochs if "teacher/tokens" in e],
            },
        }

    def summary_text(self) -> str:
        return format_summary(self.as_dict())


def _perf(series: Sequence[float], total: float) -> dict:
    return {
        "avg_tokens_per_sec": mean(series),
        "p99_tokens_per_sec": p99(series),
        "samples": len(series),
        "total_tokens": total,
    }


def _teacher_epoch(e: Mapping[str, float]) -> dict:
    keys = ("input_tokens", "output_tokens", "tokens", "cost_usd", "calls", "cache_hits")
    return {"epoch": e["epoch"], **{k: e[f"teacher/{k}"] for k in keys if f"teacher/{k}" in e}}


def _num(x: float | None, fmt: str = ",.2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def format_duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60}m {s % 60}s ({seconds:.1f} seconds)"


def format_summary(stats: Mapping) -> str:
    """The end-of-run summary, in the seed trainer's layout."""
    gen, bp, t = stats["generation"], stats["backprop"], stats["teacher"]
    lines = ["Training summary", ""]
    if stats.get("world_size", 1) > 1:  # totals and throughputs are every rank's together
        lines += [f"Data parallel: {stats['world_size']} ranks", ""]
    lines += [
        "Generation Performance:",
        f"  Average: {_num(gen['avg_tokens_per_sec'])} tokens/sec",
        f"  P99:     {_num(gen['p99_tokens_per_sec'])} tokens/sec",
        f"  Samples: {gen['samples']}",
        f"  Total Tokens Generated: {gen['total_tokens']:,.0f}",
        "",
        "Backpropagation Performance:",
        f"  Average: {_num(bp['avg_tokens_per_sec'])} tokens/sec",
        f"  P99:     {_num(bp['p99_tokens_per_sec'])} tokens/sec",
        f"  Samples: {bp['samples']}",
        f"  Total Tokens Consumed: {bp['total_tokens']:,.0f}",
        "",
    ]
    if "input_tokens" in t or "output_tokens" in t:
        lines += _teacher_lines(t, stats["duration_s"]) + [""]
    lines += [
        "Reward:",
        f"  Baseline: {_num(stats['baseline_reward'], '.4f')} ({stats['baseline_source']})",
        f"  Final EMA: {_num(stats['reward_ema'], '.4f')}  "
        f"(gain {_num(stats['reward_gain_from_baseline'], '+.4f')})",
        f"  Best batch: {_num(stats['best_reward'], '.4f')} at step {stats['best_step']}",
        "",
        "Training Duration:",
        f"  Total Time: {format_duration(stats['duration_s'])}",
    ]
    return "\n".join(lines)


def _teacher_lines(t: Mapping, duration: float) -> list[str]:
    sent, got = t.get("input_tokens", 0.0), t.get("output_tokens", 0.0)
    per_epoch = t.get("per_epoch", [])
    lines = [
        "Teacher API Usage:",
        f"  Total Tokens Sent: {sent:,.0f}",
        f"  Total Tokens Received: {got:,.0f}",
        f"  Input Tokens/sec: {sent / max(duration, 1e-9):,.2f}",
        f"  Output Tokens/sec: {got / max(duration, 1e-9):,.2f}",
    ]
    if "cost_usd" in t:
        lines.append(f"  Estimated Cost: ${t['cost_usd']:,.4f}")
    if "calls" in t:
        lines.append(f"  Calls: {t['calls']:,.0f} (cache hits {t.get('cache_hits', 0):,.0f})")
    if per_epoch:
        avg = sum(e.get("tokens", 0.0) for e in per_epoch) / len(per_epoch)
        lines += [f"  Average per Epoch: {avg:,.0f}", "  Breakdown by Epoch:"]
        lines += [
            f"    Epoch {e['epoch']}: {e.get('tokens', 0):,.0f} tokens"
            + (f" (${e['cost_usd']:,.4f})" if "cost_usd" in e else "")
            for e in per_epoch
        ]
    return lines
