"""Health checks every N batches, as the seed trainer printed them:

    [HealthCheck] OK | e1 b10 | reward(mean=0.712, ema=0.690, bestN=0.801) | kl=0.0123 |
    time(gen=78%, score=6%, train=16%) | gen(tok/s=5.6, div=0.83)

(one line), with `WARN` and the issues appended when something looks wrong: no gain over the
baseline, KL blow-up, all-zero-variance batches (no learning signal), low diversity, generation
bottleneck, many unscorable completions, skipped (non-finite) updates, a sampler that disagrees
with the trainer (policy/sampler_kl, uncorrected), an entropy collapse (policy/entropy below a
fraction of its first steps' mean, with the usual remedies), reward-hacking signals rising
(hack/frac above a floor and above twice its early-run rate, naming the commonest signal and a
task that raised it), and (reward type mix) a
judge that pays for failing code: it scores a failing answer above a passing one of the same task
too often (`teacher/fail_over_pass`), or its scores stop rising with the exec reward
(`teacher/exec_corr`), over the mix's agreement window.

Covered: a pure function of the last N step dicts and the run's EMA/baseline. Not covered: acting
on a warning (the run goes on; the user decides).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .stats import finite, mean


@dataclass(frozen=True)
class Thresholds:
    kl_max: float = 1.0
    """Mean per-token KL to the reference (rl.reference) above this is a blow-up (usual
    targets are ~0.01-0.1)."""
    min_diversity: float = 0.2
    """gen/diversity (distinct completions per group) below this is low."""
    max_gen_share: float = 0.9
    """Generation taking more than this share of the step time is a bottleneck."""
    max_none_frac: float = 0.5
    """More than this share of unscorable completions (reward None) is a problem."""
    gain_after_checks: int = 2
    """Warn about no gain over the baseline only from this many checks on."""
    max_fail_over_pass: float = 0.3
    """The judge scoring a failing answer above a passing one in more of the pairs than this."""
    min_exec_corr: float = 0.0
    """The judge's rank correlation with the exec reward at or below this."""
    min_judge_pairs: int = 8
    """Judge-vs-exec warnings need at least this many pass/fail pairs in the window."""
    sampler_kl_max: float = 1e-3
    """Mean KL between the sampler's and the trainer's log-probs above this, uncorrected
    (rl.is_correction none), is a mismatch worth correcting (docs/mismatch.md)."""
    entropy_floor: float = 0.2
    """policy/entropy below this fraction of its first steps' mean is a collapse."""
    entropy_first_steps: int = 3
    """The steps whose mean policy/entropy is the collapse check's reference."""
    hack_floor: float = 0.05
    """hack/frac (completions raising a reward-hacking signal) at or below this never warns."""
    hack_rise: float = 2.0
    """hack/frac warns above this many times its early-run rate (and above hack_floor)."""
    hack_first_steps: int = 3
    """The early-run rate: the mean hack/frac of the run's first steps (up to this many) before
    the window checked."""


@dataclass(frozen=True)
class HealthReport:
    step: int
    ok: bool
    line: str
    issues: tuple[str, ...] = ()
    values: Mapping[str, float | None] = field(default_factory=dict)

    def record(self) -> dict:
        return {
            "step": self.step,
            "ok": self.ok,
            "issues": list(self.issues),
            "line": self.line,
            **self.values,
        }


def _col(window: Sequence[Mapping], key: str) -> list[float]:
    return [x for r in window if (x := finite(r.get(key))) is not None]


def time_split(window: Sequence[Mapping]) -> dict[str, float]:
    """Share (0..1) of generate / score / train in the window's summed phase times."""
    sums = {k: sum(_col(window, f"time/{k}")) for k in ("generate", "score", "train")}
    total = sum(sums.values())
    return {k: v / total for k, v in sums.items()} if total > 0 else {}


def summarize(window: Sequence[Mapping], ema: float | None) -> dict[str, float | None]:
    rewards = _col(window, "reward/mean")
    return {
        "reward_mean": mean(rewards),
        "reward_ema": ema,
        "reward_best_n": max(rewards) if rewards else None,
        "kl_mean": mean(_col(window, "kl/mean")),
        "kl_max": max(_col(window, "kl/mean"), default=None),
        "gen_tokens_per_sec": mean(_col(window, "gen/tokens_per_sec")),
        "diversity": mean(_col(window, "gen/diversity")),
        "frac_none": mean(_col(window, "reward/frac_none")),
        "skipped": sum(_col(window, "optim/skipped")),
        "entropy": mean(_col(window, "policy/entropy")),
        "hack_frac": mean(_col(window, "hack/frac")),
        "sampler_kl": mean(_col(window, "policy/sampler_kl")),
        "sampler_far_frac": mean(_col(window, "policy/sampler_far_frac")),
        "is_corrected": 1.0 if _col(window, "policy/is_weight_mean") else 0.0,
        **_judge(window),
        **{f"time_{k}": v for k, v in time_split(window).items()},
    }


def _judge(window: Sequence[Mapping]) -> dict[str, float]:
    """The latest judge-vs-exec agreement (already a window of its own), when reported."""
    last = next((r for r in reversed(window) if "teacher/exec_pairs" in r), None)
    if last is None:
        return {}
    keys = {"judge_exec_corr": "teacher/exec_corr", "judge_fail_over_pass": "teacher/fail_over_pass",
            "judge_pairs": "teacher/exec_pairs"}
    return {k: v for k, key in keys.items() if (v := finite(last.get(key))) is not None}


def judge_issue(v: Mapping[str, float | None], th: Thresholds) -> str | None:
    if (v.get("judge_pairs") or 0) < th.min_judge_pairs:
        return None
    worse, corr = v.get("judge_fail_over_pass"), v.get("judge_exec_corr")
    if (worse is not None and worse > th.max_fail_over_pass) or (
            corr is not None and corr <= th.min_exec_corr):
        return (f"judge pays for failing code (scores a failing answer above a passing one in "
                f"{_fmt(worse, '.0%')} of {v['judge_pairs']:.0f} pairs; judge-exec rank "
                f"correlation {_fmt(corr, '.2f')})")
    return None


def sampler_issue(v: Mapping[str, float | None], th: Thresholds) -> str | None:
    """The sampler and the trainer disagree past th.sampler_kl_max, with no correction on."""
    kl = v.get("sampler_kl")
    if kl is None or kl <= th.sampler_kl_max or v.get("is_corrected"):
        return None
    return (f"sampler and trainer disagree (policy/sampler_kl {kl:.2g} > {th.sampler_kl_max:g}, "
            f"{_fmt(v.get('sampler_far_frac'), '.2%')} of tokens past rl.is_cap): set "
            "rl.is_correction tis, or decode unfused (generation.fuse_lora_max_mb 0)")


def first_entropy(records: Sequence[Mapping], n: int) -> list[float]:
    """policy/entropy of the first `n` records that report it, in step order."""
    ordered = sorted(records, key=lambda r: r.get("step") or 0)
    return _col(ordered, "policy/entropy")[:n]


def entropy_issue(v: Mapping[str, float | None], start: float | None, th: Thresholds
                  ) -> str | None:
    """policy/entropy fell below th.entropy_floor of its first steps' mean (`start`)."""
    now = v.get("entropy")
    if now is None or start is None or start <= 0 or now >= th.entropy_floor * start:
        return None
    return (f"entropy collapse (policy/entropy {now:.3g} < {th.entropy_floor:.0%} of its first "
            f"steps' {start:.3g}: the policy stopped exploring): raise rl.clip_high "
            "(clip-higher) or rl.entropy_coef, sample at a higher generation.temperature, lower "
            "training.learning_rate, or hold it nearer the base with rl.kl_penalty")


def commonest_signal(window: Sequence[Mapping]) -> str | None:
    """The hacking signal raised by the most completions over the window (`hack/<name>`)."""
    totals: dict[str, float] = {}
    for r in window:
        for k, x in r.items():
            if k.startswith("hack/") and k != "hack/frac" and finite(x) is not None:
                totals[k[5:]] = totals.get(k[5:], 0.0) + float(x)
    return max(sorted(totals), key=lambda k: totals[k]) if totals else None


def hack_issue(window: Sequence[Mapping], v: Mapping[str, float | None], early: float | None,
               th: Thresholds, examples: Mapping[str, str] | None = None) -> str | None:
    """hack/frac rose: above th.hack_floor and th.hack_rise times its early-run rate `early`
    (None: no steps before the window yet, no warning); names the commonest signal and one task
    that raised it (`examples`: signal -> task id)."""
    now = v.get("hack_frac")
    if now is None or early is None or now <= max(th.hack_floor, th.hack_rise * early):
        return None
    name = commonest_signal(window) or "?"
    task = (examples or {}).get(name)
    return (f"reward hacking signals rising ({now:.0%} of completions, {early:.0%} early in the "
            f"run): commonest {name}" + (f", e.g. task {task}" if task else "")
            + ": read samples.jsonl's signals; the reward, not the model, may be what is "
            "optimized (docs/hacking.md)")


def issues(
    window: Sequence[Mapping],
    v: Mapping[str, float | None],
    baseline: float | None,
    checks_done: int,
    th: Thresholds,
    entropy_start: float | None = None,
    hack_early: float | None = None,
    hack_examples: Mapping[str, str] | None = None,
) -> list[str]:
    out = []
    ema = v["reward_ema"]
    if (
        baseline is not None
        and ema is not None
        and checks_done >= th.gain_after_checks
        and ema <= baseline
    ):
        out.append(f"no gain over baseline (ema {ema:.3f} <= baseline {baseline:.3f})")
    if v["kl_max"] is not None and v["kl_max"] > th.kl_max:
        out.append(f"KL blow-up (kl {v['kl_max']:.3g} > {th.kl_max:g})")
    zero = _col(window, "reward/frac_zero_std")
    if zero and len(zero) == len(window) and min(zero) >= 1.0:
        out.append(f"all groups zero-variance for {len(zero)} batches (no learning signal)")
    if v["diversity"] is not None and v["diversity"] < th.min_diversity:
        out.append(f"low diversity ({v['diversity']:.2f} < {th.min_diversity:g})")
    gen_share = v.get("time_generate")
    if gen_share is not None and gen_share > th.max_gen_share:
        out.append(f"generation bottleneck ({gen_share:.0%} of step time)")
    if v["frac_none"] is not None and v["frac_none"] > th.max_none_frac:
        out.append(f"many unscorable completions ({v['frac_none']:.0%})")
    if v["skipped"]:
        out.append(f"{v['skipped']:.0f} updates skipped (non-finite loss or gradient)")
    if (judged := judge_issue(v, th)) is not None:
        out.append(judged)
    for found in (sampler_issue(v, th), entropy_issue(v, entropy_start, th),
                  hack_issue(window, v, hack_early, th, hack_examples)):
        if found is not None:
            out.append(found)
    return out


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def format_line(v: Mapping[str, float | None], where: str, problems: Sequence[str]) -> str:
    parts = [
        "[HealthCheck] " + ("WARN" if problems else "OK"),
        where,
        f"reward(mean={_fmt(v['reward_mean'])}, ema={_fmt(v['reward_ema'])}, "
        f"bestN={_fmt(v['reward_best_n'])})",
    ]
    if v["kl_mean"] is not None:
        parts.append(f"kl={v['kl_mean']:.4g}")
    if "time_generate" in v:
        parts.append(
            f"time(gen={v['time_generate']:.0%}, score={v['time_score']:.0%}, "
            f"train={v['time_train']:.0%})"
        )
    parts.append(
        f"gen(tok/s={_fmt(v['gen_tokens_per_sec'], '.1f')}, div={_fmt(v['diversity'], '.2f')})"
    )
    if v.get("sampler_kl") is not None:
        parts.append(f"sampler_kl={v['sampler_kl']:.2g}")
    if v.get("hack_frac"):
        parts.append(f"hacking={v['hack_frac']:.0%}")
    if "judge_pairs" in v:
        parts.append(f"judge(corr={_fmt(v.get('judge_exec_corr'), '.2f')}, "
                     f"fail>pass={_fmt(v.get('judge_fail_over_pass'), '.2f')})")
    if problems:
        parts.append("; ".join(problems))
    return " | ".join(parts)


def check(
    window: Sequence[Mapping],
    step: int,
    ema: float | None,
    baseline: float | None,
    checks_done: int = 0,
    th: Thresholds = Thresholds(),
    entropy_start: float | None = None,
    hack_early: float | None = None,
    hack_examples: Mapping[str, str] | None = None,
) -> HealthReport:
    """The health of the last N steps (`window`, each a step's metrics dict); `entropy_start`:
    the mean policy/entropy of the run's first th.entropy_first_steps steps (None: not yet);
    `hack_early`: hack/frac early in the run (`hack_issue`), `hack_examples` a task per signal."""
    v = summarize(window, ema)
    problems = issues(window, v, baseline, checks_done, th, entropy_start, hack_early,
                      hack_examples)
    where = _where(window[-1] if window else {}, step)
    return HealthReport(step, not problems, format_line(v, where, problems), tuple(problems), v)


def _where(last: Mapping, step: int) -> str:
    e, b = finite(last.get("epoch")), finite(last.get("batch"))
    return f"e{int(e)} b{int(b)}" if e is not None and b is not None else f"step {step}"
