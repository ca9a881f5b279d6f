"""TensorBoard sink (tensorboardX): the seed trainer's tag names where they exist, plus every
namespaced key as it is (`policy/clipfrac`, `reward/frac_zero_std`, `kl/sample_train`, ...).

Covered: step scalars (one event per step), derived seed tags (`Train/RewardVariance`,
cumulative token totals), epoch tags, the periodic held-out evaluation's `eval/*` scalars,
hyperparameters once (HParams plugin and a text table), and `purge_step` on resume so steps a
resumed run does again replace the old ones. Not covered: histograms, images, the seed's
`Scoring/*` fixed weights and GPU utilisation proxies.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .stats import RunStats, finite

# our key -> the seed trainer's tag(s)
SEED_STEP_TAGS: dict[str, tuple[str, ...]] = {
    "loss/total": ("Train/Loss",),
    "loss/policy": ("Train/PolicyLoss",),
    "loss/kl": ("Train/KLPenalty",),
    "reward/mean": ("Train/AvgReward",),
    "reward/std": ("Train/RewardStd",),
    "reward/min": ("Train/RewardMin",),
    "reward/max": ("Train/RewardMax",),
    "gen/tokens_per_sec": ("Performance/Generation_TokensPerSec",),
    "train/tokens_per_sec": ("Performance/Backprop_TokensPerSec",),
    "time/generate": ("Performance/Generation_Time",),
    "memory/rss_gb": ("System/Process_RSS_GB", "System/Process_Memory_GB"),
    "memory/footprint_gb": ("System/Process_Footprint_GB",),
    "memory/mlx_active_gb": ("System/GPU_Memory_Used_GB",),
    "memory/mlx_cache_gb": ("Batch/Metal/MLX_Cache_GB",),
    "system/cpu_percent": ("System/CPU_Percent",),
    "system/memory_percent": ("System/Memory_Percent",),
    "system/memory_used_gb": ("System/Memory_Used_GB",),
    "system/memory_available_gb": ("System/Memory_Available_GB",),
}

SEED_EPOCH_TAGS: dict[str, str] = {
    "reward/mean": "Epoch/AvgReward",
    "loss/total": "Epoch/AvgLoss",
    "reward/variance": "Epoch/RewardVariance",
    "reward/trend": "Epoch/RewardTrend",
    "loss/trend": "Epoch/LossTrend",
    "teacher/tokens": "Epoch/APITokens",
    "num_samples": "Epoch/NumSamples",
}


# record fields that are positions or clocks, not curves
NOT_SCALARS = {"epoch", "batch", "step", "elapsed_s", "first_step", "last_step"}

# scalar tags the HParams tab shows next to the hyperparameters
HPARAM_METRICS = ("reward/mean", "kl/mean", "loss/total")


def step_scalars(metrics: Mapping[str, Any], stats: RunStats) -> dict[str, float]:
    """Every tag and value to write for one step."""
    out = {
        k: x for k, v in metrics.items() if k not in NOT_SCALARS and (x := finite(v)) is not None
    }
    for key, tags in SEED_STEP_TAGS.items():
        if key in out:
            out.update(dict.fromkeys(tags, out[key]))
    if "reward/std" in out:
        out["Train/RewardVariance"] = out["reward/std"] ** 2
    for key, value in metrics.items():  # the rubric's weights: Scoring/Correctness, ...
        if key.startswith("scoring/") and (x := finite(value)) is not None:
            out["Scoring/" + key.split("/", 1)[1].title().replace("_", "")] = x
    previous = stats.window[-2] if len(stats.window) > 1 else {}
    growth = _growth(out.get("memory/mlx_cache_gb"), previous.get("memory/mlx_cache_gb"))
    if growth is not None:
        out["Batch/Metal/MLX_Cache_Growth_GB"] = growth
    out["Performance/Generation_TotalTokens_Cumulative"] = stats.gen_tokens
    out["Performance/Training_TotalTokens_Cumulative"] = stats.train_tokens
    totals = stats.teacher_totals()
    if "teacher/input_tokens" in totals:
        out["Performance/Scoring_TotalTokens_Input_Cumulative"] = totals["teacher/input_tokens"]
    if "teacher/output_tokens" in totals:
        out["Performance/Scoring_TotalTokens_Output_Cumulative"] = totals["teacher/output_tokens"]
    return out


def _growth(now: float | None, before: object) -> float | None:
    before = finite(before)
    return None if now is None or before is None else now - before


def epoch_scalars(agg: Mapping[str, Any], stats: RunStats) -> dict[str, float]:
    """Epoch tags (seed names) plus the epoch aggregates under `epoch/<key>`."""
    out = {
        f"epoch/{k}": x
        for k, v in agg.items()
        if k not in NOT_SCALARS and (x := finite(v)) is not None
    }
    out.update(
        {tag: float(agg[k]) for k, tag in SEED_EPOCH_TAGS.items() if finite(agg.get(k)) is not None}
    )
    perf = stats.as_dict()
    for name, key in (("Generation", "generation"), ("Backprop", "backprop")):
        for kind, field in (("Avg", "avg_tokens_per_sec"), ("P99", "p99_tokens_per_sec")):
            if perf[key][field] is not None:
                out[f"Performance/{name}_{kind}TokensPerSec"] = perf[key][field]
    return out


def flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> {"a.b": scalar}; lists and other values become strings."""
    out: dict[str, Any] = {}
    for k, v in hparams.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat_hparams(v, key + "."))
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = str(v)
    return out


def hparams_markdown(flat: Mapping[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in flat.items())
    return "| key | value |\n|---|---|\n" + rows


def import_tensorboardx() -> Any:
    """tensorboardX's writer imports torch whenever it is installed (about 1.5 s and 180 MB of
    RSS) only to accept torch tensors, which we never pass. Unless this process already uses
    torch, hide it during that one import."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` -> ImportError
    try:
        import tensorboardX
    finally:
        del sys.modules["torch"]
    return tensorboardX


class TensorBoardSink:
    """Writes scalars to `<run_dir>/tensorboard`, one event per step holding all its scalars.
    The writer opens at the first write, so that on resume it can purge the steps the resumed
    run does again."""

    def __init__(self, logdir: Path, hparams: Mapping[str, Any], resume: bool) -> None:
        self.logdir = logdir
        self._hparams = flat_hparams(hparams)
        self._resume = resume
        self._writer: Any = None

    def _open(self, step: int | None) -> Any:
        if self._writer is None:
            tbx = import_tensorboardx()
            from tensorboardX.summary import hparams as hparams_summary

            purge = step if self._resume and step is not None else None
            self._writer = tbx.SummaryWriter(str(self.logdir), purge_step=purge, flush_secs=10)
            if self._hparams:
                self._writer.add_text("hparams", hparams_markdown(self._hparams), step or 0)
                declared = dict.fromkeys(HPARAM_METRICS, 0.0)
                for summary in hparams_summary(self._hparams, declared):
                    self._writer.file_writer.add_summary(summary)
        return self._writer

    def _write(self, scalars: Mapping[str, float], step: int) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
        self._writer.file_writer.add_summary(Summary(value=values), step)

    def step(self, step: int, metrics: Mapping[str, Any], stats: RunStats) -> None:
        self._open(step)
        self._write(step_scalars(metrics, stats), step)

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Extra scalars at `step` under their own tags (the periodic `eval/*`)."""
        self._open(step + 1)  # a resumed run's first write: keep the steps before this one
        self._write({k: x for k, v in values.items() if (x := finite(v)) is not None}, step)

    def epoch(self, epoch: int, agg: Mapping[str, Any], stats: RunStats) -> None:
        self._open(None)
        self._write(epoch_scalars(agg, stats), epoch)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
