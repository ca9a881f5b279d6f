"""The end of a data-parallel step and of a sharded evaluation: every rank's metrics, records
and stop reason gathered (rank 0 writes them), combined into the whole batch's numbers, and the
check that every rank holds the same weights.

How a metric combines (`combine`), from each rank's value and its number of rollouts n:
- already global (the same on every rank): `loss/`, `policy/`, `kl/`, `critic/`, `optim/`
  (the update sums its aux terms over the ranks), `scoring/` (rubric weights);
- summed: counts and throughputs (`*/tokens`, `train/sequences`, the teacher's calls, tokens and
  cost, `exec/` counters, a reward component's `reward/<name>/errors` and `timeouts`,
  `*_per_sec`: the ranks run side by side);
- max: times (`time/`, `gen/seconds`, `reward/<name>/seconds`: the step waits for the slowest
  rank), `reward/max`,
  `gen/decode_width`, every `*_max` (each rank's own maximum); min: `reward/min`;
- `reward/mean` weighted by each rank's scored rollouts, `reward/std` pooled exactly from the
  ranks' means and stds; everything else the mean weighted by n (exact for fractions and
  means over rollouts; `gen/diversity` counts distinct completions per rank).

Not covered: per-rank views (rank 0's memory only; `batches.jsonl` holds the combined step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DistributedError
from .distributed import World
from .evaluate import summarize

SAME = ("loss/", "policy/", "kl/", "critic/", "optim/", "scoring/", "sample/")
SUM = {"gen/tokens", "train/tokens", "train/sequences", "teacher/calls", "teacher/cache_hits",
       "teacher/input_tokens", "teacher/output_tokens", "teacher/cost_usd", "teacher/unscorable",
       "teacher/exec_pairs"}
MAX = {"gen/seconds", "gen/decode_width", "reward/max"}
DIGEST_RTOL = 1e-5  # ranks' weights may differ in the last bits across chip generations


def combine(parts: Sequence[tuple[Mapping[str, float], int]]) -> dict[str, float]:
    """One metrics dict from every rank's (metrics, number of rollouts)."""
    keys = sorted({k for m, _ in parts for k in m})
    out: dict[str, float] = {}
    for key in keys:
        have = [(m[key], n, m) for m, n in parts if key in m and m[key] is not None]
        out[key] = _combine_key(key, have)
    if "reward/std" in out:
        out["reward/std"] = pooled_std(
            [(m["reward/mean"], m["reward/std"], _scored(m, n)) for m, n in parts
             if "reward/std" in m])
    return out


def _combine_key(key: str, have: list[tuple[float, int, Mapping[str, float]]]) -> float:
    values = [v for v, _, _ in have]
    finite = [v for v in values if math.isfinite(v)] or [float("nan")]
    if key.endswith("_max"):  # a rank's own maximum (policy/sampler_logp_absdiff_max)
        return float(max(finite))
    if key.startswith(SAME):
        return values[0]
    if key.startswith("reward/") and key.endswith(("/errors", "/timeouts")):  # a component's
        return float(sum(finite))
    if key.startswith("reward/") and key.endswith("/seconds"):  # (reward.components)
        return float(max(finite))
    if key in SUM or key.endswith("_per_sec") or key.startswith("exec/"):
        return float(sum(finite))
    if key in MAX or key.startswith("time/"):
        return float(max(finite))
    if key == "reward/min":
        return float(min(finite))
    weights = [_scored(m, n) if key == "reward/mean" else n for _, n, m in have]
    return weighted_mean(values, weights)


def _scored(m: Mapping[str, float], n: int) -> float:
    """The rank's rollouts with a reward (reward/frac_none is the share without)."""
    return n * (1.0 - m.get("reward/frac_none", 0.0))


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """Mean of the finite values with positive weight (NaN if none)."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True)
             if w > 0 and math.isfinite(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def pooled_std(parts: Sequence[tuple[float, float, float]]) -> float:
    """The population std of the union of groups given as (mean, std, count)."""
    parts = [(m, s, n) for m, s, n in parts if n > 0 and math.isfinite(m)]
    total = sum(n for _, _, n in parts)
    if not total:
        return float("nan")
    mean = sum(m * n for m, _, n in parts) / total
    var = sum(n * (s * s + (m - mean) ** 2) for m, s, n in parts) / total
    return math.sqrt(var)


def sync_step(world: World, metrics: dict[str, float], samples: list[dict], stop: str | None,
              digest: list[float] | None) -> tuple[dict[str, float], list[dict], str | None]:
    """After a step: the combined metrics, every rank's sample records (rank order) and the
    first rank's stop reason, on every rank; raises DistributedError when the ranks' weights
    differ (`digest`: the backend group's fingerprint). One process: unchanged."""
    if world.size == 1:
        return metrics, samples, stop
    parts = world.gather({"metrics": metrics, "n": len(samples), "samples": samples,
                          "stop": stop, "digest": digest}, "exchange of the step's metrics")
    check_digests([p["digest"] for p in parts])
    merged = combine([(p["metrics"], p["n"]) for p in parts])
    reasons = [f"rank {r}: {p['stop']}" if r else p["stop"] for r, p in enumerate(parts)
               if p["stop"]]
    return merged, [s for p in parts for s in p["samples"]], reasons[0] if reasons else None


def check_digests(digests: Sequence[list[float] | None]) -> None:
    """Every rank's weights fingerprint (sum, sum of squares) must match rank 0's."""
    ref = digests[0]
    for r, d in enumerate(digests[1:], start=1):
        if ref is None or d is None:
            continue
        for a, b in zip(ref, d, strict=True):
            if abs(a - b) > DIGEST_RTOL * max(abs(a), abs(b), 1e-12):
                raise DistributedError(
                    f"the ranks' weights differ (rank 0 {ref}, rank {r} {d}): they no longer "
                    "train the same model; check that every machine runs the same mlx-rlaif, "
                    "MLX and model files, then resume from the last checkpoint")


def check_same_weights(world: World, policy: Any) -> None:
    """Every rank must start from the same weights (the same LoRA init seed, or rank 0's
    checkpoint); raises DistributedError where they differ. One process: nothing to do."""
    if world.size > 1:
        check_digests(world.gather(world.digest(policy), "check of the starting weights"))


class SilentHub:
    """The metrics hub of ranks other than 0: every call does nothing (rank 0 writes)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def stats(self) -> dict:
        return {}


def merge_eval(world: World, result: dict[str, Any], records: list[dict]
               ) -> tuple[dict[str, Any], list[dict]]:
    """A held-out evaluation sharded over the ranks: every rank's per-task rows summarized
    together (pass@1, mean reward), and every rank's sample records. One process: unchanged."""
    if world.size == 1:
        return result, records
    rows = world.gather_flat(result["tasks"], "exchange of the evaluation")
    merged = summarize(rows, result["samples_per_task"], (1,))
    merged["gen_tokens_per_sec"] = sum(world.gather(result["gen_tokens_per_sec"]))
    merged.update(temperature=result["temperature"], tasks=rows)
    return merged, world.gather_flat(records, "exchange of the evaluation's records")
