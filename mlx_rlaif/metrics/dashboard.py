"""What the user watches: a live rich dashboard on a terminal, or one plain line per step.

`Dashboard` keeps plain state under a lock; rich.live's own refresh thread renders it twice a
second, so `step()` on the training thread only stores numbers (rendering stays off the hot path).
It shows progress, elapsed time and ETA (metrics/eta.py; toward the run's last step, or for a time-limited run,
`training.max_minutes`, toward its time budget whenever that is projected to end the run
first: `ends_by`); the ranks of a data-parallel run; reward mean, best, baseline and a sparkline trend; KL, loss, clip
fraction, entropy; generation and training tokens/s and the step time split; memory (MLX's
peak against the memory plan's budget, RSS); teacher calls, cost and cache hits (when a teacher
runs); the judge against the exec reward (reward type mix: rank correlation, best-answer
disagreement, failing-over-passing pairs); the periodic held-out evaluation (latest, best,
trend); the latest completion with its scores, reason and rationale; the last health check.
Messages and health lines print above the live panel, so they stay in the terminal's
scrollback. `PlainPrinter` writes one line per
`log_every` steps (step, elapsed, ETA, reward, KL, loss, clip fraction, tokens/s; the thermal
pressure while there is any) for pipes, CI and
`logging.dashboard: false`.

Not covered: keyboard input, scrolling through past completions, alternate-screen mode.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..terminal import text as plain_text
from ..terminal import visible
from .eta import short
from .health import HealthReport
from .stats import components, finite

BARS = "▁▂▃▄▅▆▇█"
HISTORY = 60
COMPLETION_LINES = 8


def sparkline(values: Sequence[float], width: int = HISTORY) -> str:
    """Unicode bars scaled between the min and max of the last `width` values."""
    vals = list(values)[-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-12:
        return BARS[len(BARS) // 2] * len(vals)
    top = len(BARS) - 1
    return "".join(BARS[round((v - lo) / (hi - lo) * top)] for v in vals)


def fmt(x: Any, spec: str = ".3f", none: str = "-") -> str:
    v = finite(x)
    return none if v is None else format(v, spec)


def hms(seconds: float | None) -> str:
    return "-" if seconds is None else str(timedelta(seconds=int(seconds)))


@dataclass
class DashboardState:
    """Everything the dashboard shows; mutated only under `Dashboard._lock`."""

    total_steps: int  # 0: no step bound (a run only time-limited)
    time_budget_s: float = 0.0  # training.max_minutes in seconds (0: none)
    started: float = field(default_factory=time.time)
    first_step: int | None = None
    step: int = 0
    updated: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    rewards: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    best: float | None = None
    baseline: float | None = None
    ema: float | None = None
    sample: dict[str, Any] | None = None
    health: HealthReport | None = None
    evals: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (step, eval row)

    def eta(self, now: float) -> float | None:
        """Seconds left: the loop's estimate at the last step (`time/eta_s`: metrics/eta.py,
        the run's ending rule and the median step with its periodic work), less the time since
        that step; without it, the mean time per step so far times the steps left, less the time
        since the last step."""
        at_step = finite(self.metrics.get("time/eta_s"))
        if at_step is not None:
            return max(0.0, at_step - max(0.0, now - self.updated))
        if self.first_step is None or self.total_steps <= 0:
            return None
        per_step = (self.updated - self.started) / (self.step - self.first_step + 1)
        return max(0.0, per_step * max(0, self.total_steps - self.step) - (now - self.updated))


def ends_by(step: int, total: int, used_s: float, budget_s: float) -> str:
    """What is projected to end the run: "steps" (its last step) or "time" (the time budget),
    from the steps done in `used_s` seconds of training."""
    if not budget_s:
        return "steps"
    if total <= 0:
        return "time"
    if step <= 0 or used_s <= 0:
        return "steps"
    return "steps" if total <= step * budget_s / used_s else "time"


def training_seconds(s: DashboardState, now: float) -> float:
    """The seconds the time budget has counted: at the last step (its `time/training_s`) plus
    the time since, at most the budget."""
    at_step = finite(s.metrics.get("time/training_s"))
    if at_step is None:
        return 0.0
    return min(s.time_budget_s, at_step + max(0.0, now - s.updated))


def _progress(s: DashboardState) -> RenderableType:
    now = time.time()
    grid = Table.grid(expand=True, padding=(0, 1))
    grid.add_column(ratio=1)
    grid.add_column(no_wrap=True)
    used = training_seconds(s, now)
    if ends_by(s.step, s.total_steps, used, s.time_budget_s) == "time":
        budget = s.time_budget_s
        grid.add_row(ProgressBar(total=budget, completed=used),
                     f"step {s.step}  {hms(used)} of {hms(budget)} training time "
                     f"(training.max_minutes)  {used / budget:.0%}  elapsed "
                     f"{hms(now - s.started)}  ETA {hms(s.eta(now))}")
        return grid
    total = max(s.total_steps, 1)
    grid.add_row(
        ProgressBar(total=total, completed=min(s.step, total)),
        f"step {s.step}/{s.total_steps}  {s.step / total:.0%}  elapsed "
        f"{hms(now - s.started)}  ETA {hms(s.eta(now))}",
    )
    return grid


def _rows(s: DashboardState) -> list[tuple[str, str]]:
    m = s.metrics
    rows = [
        (
            "Reward",
            f"mean [bold]{fmt(m.get('reward/mean'))}[/] ± {fmt(m.get('reward/std'))}  "
            f"best {fmt(s.best)}  ema {fmt(s.ema)}  baseline {fmt(s.baseline)}",
        ),
        ("Trend", f"[cyan]{sparkline(list(s.rewards))}[/]"),
        (
            "KL",
            f"{fmt(m.get('kl/mean'), '.4g')} (penalty {fmt(m.get('kl/penalty'), '.3g')}, "
            f"sampler-trainer {fmt(m.get('kl/sample_train'), '.2g')})",
        ),
        (
            "Loss",
            f"{fmt(m.get('loss/total'), '.4g')} (policy {fmt(m.get('loss/policy'), '.4g')}, "
            f"kl {fmt(m.get('loss/kl'), '.4g')})",
        ),
        (
            "Policy",
            f"clip frac {fmt(m.get('policy/clipfrac'))}  entropy "
            f"{fmt(m.get('policy/entropy'))}  approx KL {fmt(m.get('policy/approx_kl'), '.3g')}"
            f"  grad norm {fmt(m.get('optim/grad_norm'), '.3g')}",
        ),
        (
            "Sampler",
            f"kl {fmt(m.get('policy/sampler_kl'), '.2g')}  max |dlogp| "
            f"{fmt(m.get('policy/sampler_logp_absdiff_max'), '.3g')}  past cap "
            f"{fmt(m.get('policy/sampler_far_frac'), '.2%')}  IS weight "
            f"{fmt(m.get('policy/is_weight_mean'), '.3f')}",
        ),
        (
            "Groups",
            f"zero-std {fmt(m.get('reward/frac_zero_std'), '.0%')}  unscorable "
            f"{fmt(m.get('reward/frac_none'), '.0%')}  truncated "
            f"{fmt(m.get('gen/truncated_frac'), '.0%')}  length "
            f"{fmt(m.get('gen/completion_len_mean'), '.0f')}  diversity "
            f"{fmt(m.get('gen/diversity'), '.2f')}",
        ),
        (
            "Throughput",
            f"gen {fmt(m.get('gen/tokens_per_sec'), ',.1f')} tok/s  train "
            f"{fmt(m.get('train/tokens_per_sec'), ',.1f')} tok/s  decode width "
            f"{fmt(m.get('gen/decode_width'), '.0f')}"
            + (f"  drafts {fmt(m.get('gen/tokens_per_pass'), '.2f')} tok/pass, "
               f"{fmt(m.get('gen/draft_accept'), '.0%')} kept"
               if finite(m.get("gen/tokens_per_pass")) is not None else ""),
        ),
        ("Step time", _time_split(m) + thermal_text(m)),
        (
            "Memory",
            f"MLX peak {fmt(m.get('memory/mlx_peak_gb'), '.2f')} GB"
            + (f" of {fmt(m.get('memory/budget_gb'), '.2f')} GB budget"
               if finite(m.get("memory/budget_gb")) is not None else "")
            + f"  RSS {fmt(m.get('memory/rss_gb'), '.2f')} GB",
        ),
    ]
    if s.evals:
        rows.append(("Held-out", eval_text(s.evals)))
    if any(k.startswith("teacher/") for k in m):
        rows.append(
            (
                "Teacher",
                f"calls {fmt(m.get('teacher/calls'), ',.0f')}  cache hits "
                f"{fmt(m.get('teacher/cache_hits'), ',.0f')}  cost "
                f"${fmt(m.get('teacher/cost_usd'), ',.4f')}  tokens in/out "
                f"{fmt(m.get('teacher/input_tokens'), ',.0f')}/"
                f"{fmt(m.get('teacher/output_tokens'), ',.0f')}  unscorable "
                f"{fmt(m.get('teacher/unscorable'), ',.0f')}",
            )
        )
    if "teacher/exec_pairs" in m:
        rows.append(
            (
                "Judge vs exec",
                f"rank corr {fmt(m.get('teacher/exec_corr'), '.2f')}  best disagree "
                f"{fmt(m.get('teacher/best_disagree'), '.0%')}  fail>pass "
                f"{fmt(m.get('teacher/fail_over_pass'), '.0%')} of "
                f"{fmt(m.get('teacher/exec_pairs'), ',.0f')} pairs",
            )
        )
    if names := components([m]):
        rows.append(("Components", "  ".join(component_cell(m, n) for n in names)))
    if "hack/frac" in m:
        rows.append(("Hacking", hack_text(m)))
    if "turns/mean" in m:
        passes = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in m.items()
                        if k.startswith("turns/pass_at_"))
        rows.append(("Turns", f"mean {fmt(m.get('turns/mean'), '.2f')} answers  pass "
                     + "  ".join(f"after {k}: {fmt(v, '.0%')}" for k, v in passes)))
    if "distill/seconds" in m:
        rows.append(("Distill", distill_text(m)))
    return rows


def distill_text(m: Mapping[str, Any]) -> str:
    """`kl 0.412 (p90 1.23)  context 75%  0.8 s` (distill/* metrics: distill.kind teacher or
    self)."""
    context = (f"  context {fmt(m.get('distill/frac_context'), '.0%')}"
               if "distill/frac_context" in m else "")
    return (f"kl {fmt(m.get('distill/kl'), '.4g')} (p90 {fmt(m.get('distill/kl_p90'), '.3g')})"
            f"{context}  {fmt(m.get('distill/seconds'), '.2f')} s")


def hack_text(m: Mapping[str, Any]) -> str:
    """`12% of completions flagged: special_casing 3, exit_call 1` (hack/* metrics)."""
    counts = sorted(((k[5:], v) for k, v in m.items()
                     if k.startswith("hack/") and k != "hack/frac" and finite(v)),
                    key=lambda kv: (-kv[1], kv[0]))
    top = ", ".join(f"{escape(visible(k, lines=False))} {v:.0f}" for k, v in counts[:4])
    return f"{fmt(m.get('hack/frac'), '.0%')} of completions flagged" + (f": {top}" if top else "")


def eval_text(evals: Sequence[tuple[int, Mapping[str, Any]]]) -> str:
    """The latest periodic evaluation, the best so far and the pass@1 trend."""
    step, row = evals[-1]
    best_step, best = max(evals, key=lambda e: finite(e[1].get("eval/pass@1")) or -1.0)
    trend = sparkline([finite(r.get("eval/pass@1")) or 0.0 for _, r in evals])
    return (f"pass@1 [bold]{fmt(row.get('eval/pass@1'))}[/] mean reward "
            f"{fmt(row.get('eval/reward_mean'))} at step {step}  best "
            f"{fmt(best.get('eval/pass@1'))} (step {best_step})  [cyan]{trend}[/]")


def eval_line(step: int, row: Mapping[str, Any]) -> str:
    """`held-out eval at step 20 (10 tasks x 2): pass@1 0.350, mean reward 0.512 [best]`"""
    size = (f" ({fmt(row.get('eval/tasks'), '.0f')} tasks x "
            f"{fmt(row.get('eval/samples_per_task'), '.0f')})")
    mark = " [new best]" if row.get("new_best") else ""
    return (f"held-out eval at step {step}{size}: pass@1 {fmt(row.get('eval/pass@1'))}, mean "
            f"reward {fmt(row.get('eval/reward_mean'))}{mark}")


def component_cell(m: Mapping[str, Any], name: str) -> str:
    """`format 0.62±0.31` with the None fraction, errors and timeouts where there are any."""
    key = f"reward/{name}/"
    text = f"{escape(visible(name, lines=False))} {fmt(m.get(key + 'mean'), '.2f')}±{fmt(m.get(key + 'std'), '.2f')}"
    for label, k, spec in (("none", "frac_none", ".0%"), ("err", "errors", ".0f"),
                           ("timeouts", "timeouts", ".0f")):
        if finite(m.get(key + k)):
            text += f" {label} {fmt(m.get(key + k), spec)}"
    return text


THERMAL = ("nominal", "fair", "serious", "critical")  # system/thermal 0..3 (train/laptop.py)


def thermal_text(m: Mapping[str, Any]) -> str:
    """`  thermal pressure: serious` while macOS reports any (system/thermal above 0)."""
    level = finite(m.get("system/thermal"))
    if not level or not 0 < level < len(THERMAL):
        return ""
    return f"  thermal pressure: {THERMAL[int(level)]}"


def _time_split(m: Mapping[str, Any]) -> str:
    step = finite(m.get("time/step"))
    parts = [
        (n, finite(m.get(f"time/{k}")))
        for n, k in (("gen", "generate"), ("score", "score"), ("train", "train"))
    ]
    total = step or sum(v for _, v in parts if v is not None)
    split = "  ".join(f"{n} {v / total:.0%}" for n, v in parts if v is not None and total)
    return f"{fmt(step, '.2f')} s  {split}"


def _metrics_table(s: DashboardState) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold blue", no_wrap=True)
    grid.add_column()
    for label, value in _rows(s):  # our markup, read whatever options a print passes
        grid.add_row(label, Text.from_markup(value, emoji=False))
    return grid


def _completion(sample: Mapping[str, Any]) -> RenderableType:
    """The latest completion's panel: every text of it untrusted (the task's id, the student's
    completion, the sandbox's reason, the judge's rationale), its control characters escaped."""
    parts = sample.get("parts") or {}
    scores = visible("  ".join(f"{k}={fmt(v, '.2f')}" for k, v in parts.items()), lines=False)
    title = (
        f"latest completion: {visible(sample.get('task_id', '?'), lines=False)} "
        f"({visible(sample.get('language', '?'), lines=False)})"
        f"  reward {fmt(sample.get('reward'), none='None')}  adv "
        f"{fmt(sample.get('advantage'), '+.2f')}"
        + ("  [truncated]" if sample.get("truncated") else "")
    )
    lines = visible(sample.get("completion") or "").strip("\n").split("\n")
    body = Text(
        "\n".join(lines[:COMPLETION_LINES]) + ("\n..." if len(lines) > COMPLETION_LINES else "")
    )
    extra = [Text(scores, style="cyan")] if scores else []
    if sample.get("reason"):
        extra.append(Text(f"reason: {visible(sample['reason'])}", style="dim"))
    if sample.get("rationale"):
        extra.append(Text(f"rationale: {visible(sample['rationale'])}", style="italic"))
    if sample.get("signals"):  # reward-hacking signals (docs/hacking.md)
        extra.append(Text("hacking signals: " + visible(", ".join(map(str, sample["signals"])),
                                                         lines=False), style="bold red"))
    return Panel(Group(body, *extra), title=Text(title), title_align="left", border_style="dim")


def render(s: DashboardState) -> RenderableType:
    """The whole dashboard for one state (pure: no I/O)."""
    items: list[RenderableType] = [_progress(s), _metrics_table(s)]
    if s.sample is not None:
        items.append(_completion(s.sample))
    if s.health is not None:
        items.append(plain_text(s.health.line, style="green" if s.health.ok else "bold yellow"))
    ranks = finite(s.metrics.get("dist/world_size")) or 1
    title = "mlx-rlaif" + (f" (data parallel: {ranks:.0f} ranks)" if ranks > 1 else "")
    return Panel(Group(*items), title=title, title_align="left", border_style="blue")


class Dashboard:
    """rich.live dashboard; all methods are cheap state updates except start/close."""

    def __init__(self, total_steps: int, console: Console | None = None,
                 time_budget_s: float = 0.0) -> None:
        self._state = DashboardState(total_steps, time_budget_s)
        self._lock = threading.Lock()
        self.console = console or Console()
        self._live = Live(
            console=self.console,
            get_renderable=self._render,
            refresh_per_second=2,
            redirect_stdout=True,
            redirect_stderr=True,
        )

    def start(self) -> None:
        self._live.start()

    def _render(self) -> RenderableType:
        with self._lock:  # copy under the lock, render outside it: step() never waits on rich
            snapshot = replace(self._state, rewards=deque(self._state.rewards),
                               evals=list(self._state.evals))
        return render(snapshot)

    def restore(self, records: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._state.rewards.extend(
                x for r in records if (x := finite(r.get("reward/mean"))) is not None
            )

    def step(
        self,
        step: int,
        metrics: Mapping[str, Any],
        best: float | None,
        ema: float | None,
        baseline: float | None,
    ) -> None:
        with self._lock:
            s = self._state
            s.first_step = step if s.first_step is None else s.first_step
            s.updated = time.time()
            s.step, s.metrics, s.best, s.ema, s.baseline = step, dict(metrics), best, ema, baseline
            if (r := finite(metrics.get("reward/mean"))) is not None:
                s.rewards.append(r)

    def samples(self, samples: Sequence[Mapping[str, Any]]) -> None:
        if samples:
            with self._lock:
                self._state.sample = dict(samples[-1])

    def health(self, report: HealthReport) -> None:
        with self._lock:
            self._state.health = report
        self.console.print(plain_text(report.line), highlight=False)

    def evaluation(self, step: int, row: Mapping[str, Any]) -> None:
        with self._lock:
            self._state.evals.append((step, dict(row)))
        self.console.print(plain_text(eval_line(step, row)), highlight=False)

    def message(self, text: str) -> None:  # one line: a path's newline shows as \n
        self.console.print(plain_text(text), highlight=False)

    def close(self, summary: str) -> None:
        if self._live.is_started:
            self._live.stop()
            self.console.print(plain_text(summary, lines=True), highlight=False)


class PlainPrinter:
    """One line per `log_every` steps, plus messages and health lines, to a text stream."""

    def __init__(self, total_steps: int, log_every: int, stream: TextIO | None = None,
                 time_budget_s: float = 0.0) -> None:
        self.total_steps, self.log_every = total_steps, log_every
        self.time_budget_s = time_budget_s
        self.stream = stream or sys.stdout

    def _print(self, text: str) -> None:
        print(visible(text), file=self.stream, flush=True)

    def start(self) -> None:
        pass

    def restore(self, records: Sequence[Mapping[str, Any]]) -> None:
        pass

    def step(
        self,
        step: int,
        metrics: Mapping[str, Any],
        best: float | None,
        ema: float | None,
        baseline: float | None,
    ) -> None:
        if step % self.log_every == 0 or step == 1:
            self._print(plain_line(step, self.total_steps, metrics, self.time_budget_s))

    def samples(self, samples: Sequence[Mapping[str, Any]]) -> None:
        pass

    def health(self, report: HealthReport) -> None:
        self._print(report.line)

    def evaluation(self, step: int, row: Mapping[str, Any]) -> None:
        self._print(eval_line(step, row))

    def message(self, text: str) -> None:  # one line: a path's newline shows as \n
        self._print(visible(text, lines=False))

    def close(self, summary: str) -> None:
        self._print(summary)


PLAIN_FIELDS = (
    ("reward", "reward/mean", ".4f"),
    ("kl", "kl/mean", ".4g"),
    ("distill kl", "distill/kl", ".4g"),
    ("loss", "loss/total", ".4g"),
    ("clip", "policy/clipfrac", ".3f"),
    ("hacking", "hack/frac", ".0%"),
    ("gen tok/s", "gen/tokens_per_sec", ".1f"),
    ("train tok/s", "train/tokens_per_sec", ".1f"),
    ("step s", "time/step", ".2f"),
)


def plain_line(step: int, total: int, metrics: Mapping[str, Any], budget_s: float = 0.0) -> str:
    """`step 3/10 | elapsed 1m02s | eta 2m05s | reward 0.5000 | kl 0.0012 | ...`, leaving out
    keys the step did not send; `step 3 (1.2 of 5 min) | ...` where the time budget is projected
    to end the run first; `thermal serious` while macOS reports thermal pressure."""
    used = finite(metrics.get("time/training_s")) or 0.0
    if ends_by(step, total, used, budget_s) == "time":
        head = f"step {step} ({used / 60:.1f} of {budget_s / 60:g} min)"
    else:
        head = f"step {step}/{total}" if total > 0 else f"step {step}"
    clock = [f"{name} {short(x)}" for name, key in (("elapsed", "elapsed_s"), ("eta", "time/eta_s"))
             if (x := finite(metrics.get(key))) is not None]
    parts = [
        f"{name} {fmt(metrics.get(key), spec)}"
        for name, key, spec in PLAIN_FIELDS
        if finite(metrics.get(key)) is not None
    ]
    if hot := thermal_text(metrics):
        parts.append("thermal " + hot.rsplit(" ", 1)[1])
    return " | ".join([head, *clock, *parts])
