"""No silent combination: every pair of the options that change a step (tests/combos.py's
factors: estimator, ratio level, aggregation, loss, KL placement and estimator, reference (the
initial one from adapters made for the test), adaptive KL, dynamic sampling, guidance,
curriculum, turns, PPO epochs, truncation mask, scale, backend, gradient accumulation, group
size, model dtype, the reward as components with a user's function) either trains two steps on
the shipped tiny model with the metrics' invariants holding, or is refused by `config.check` with
one line naming both options, and every refused pair is listed in docs/combinations.md.

A pairwise covering array (combos.covering_array), not the full product; the refusals are read
from `check`, so the array follows whatever it refuses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from adapters import write_adapters
from combos import (
    FACTORS,
    covering_array,
    label,
    overrides,
    pairs_of,
    violations,
    with_adapters,
)
from recording_hub import RecordingHub

from mlx_rlaif.assets import resolve_model
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.train import train

DOC = Path(__file__).resolve().parent.parent / "docs" / "combinations.md"


@pytest.fixture(scope="module")
def array():
    return covering_array()


def test_every_pair_is_in_a_row_or_refused(array):
    rows, refused = array
    covered = {p for row in rows for p in pairs_of(row)}
    levels = [(f, x) for f in FACTORS for x in FACTORS[f]]
    for i, a in enumerate(levels):
        for b in levels[i + 1:]:
            if a[0] != b[0]:
                assert (a, b) in covered or (a, b) in refused, (a, b)
    assert not covered & set(refused)


def test_refused_pairs_are_listed_in_the_docs(array):
    """Each refused pair appears on one line of docs/combinations.md as `factor: level` twice."""
    lines = DOC.read_text().splitlines()
    missing = [label(p) for p in array[1]
               if not any(all(x in line for x in label(p)) for line in lines)]
    assert not missing, f"refused pairs missing from {DOC.name}: {missing}"


@pytest.mark.parametrize("sets, keys", [
    (("rl.kl_penalty=0", "rl.adaptive_kl=true"), ("rl.adaptive_kl", "rl.kl_penalty")),
    (("rl.kl_penalty=0", "rl.reference=ema"), ("rl.reference", "rl.kl_penalty")),
    (("model.backend=torch", "generation.num_samples_per_prompt=1", "rl.advantage=gae"),
     ("model.backend", "generation.num_samples_per_prompt")),
    (("model.backend=torch", "rl.advantage=gae"), ("model.backend", "rl.advantage")),
    (("model.backend=torch", "rl.reference=periodic"), ("model.backend", "rl.reference")),
    (("model.backend=torch", "rl.reference=initial", "lora.init_adapter=runs/sft"),
     ("model.backend", "rl.reference")),
    (("rl.reference=initial",), ("rl.reference", "lora.init_adapter")),
    (("model.backend=torch", "generation.max_turns=2"), ("model.backend", "generation.max_turns")),
    (("rl.advantage=gae", "generation.num_samples_per_prompt=1", "rl.guidance=true"),
     ("rl.guidance", "generation.num_samples_per_prompt")),
])
def test_a_refusal_names_both_options(sets, keys):
    """A KL reference or controller without a KL does nothing (refused, not ignored); guidance
    in a group of one would replace its only sampled answer; the torch backend's refusals name
    model.backend, not "the torch backend"."""
    with pytest.raises(ConfigError) as e:
        check(load(None, list(sets)))
    assert all(k in str(e.value) for k in keys) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory) -> Path:
    """The shipped tiny model with its weights in bfloat16."""
    src = Path(resolve_model("builtin:tiny-coder"))
    dst = tmp_path_factory.mktemp("bf16") / "tiny-coder-bf16"
    shutil.copytree(src, dst)
    weights = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"),
                        {k: v.astype(mx.bfloat16) for k, v in weights.items()},
                        metadata={"format": "mlx"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    return dst


@pytest.fixture(scope="module")
def init_adapter(tmp_path_factory) -> Path:
    """Adapters on the shipped tiny model for rl.reference initial's rows (lora.init_adapter)."""
    return write_adapters(resolve_model("builtin:tiny-coder"),
                          tmp_path_factory.mktemp("init") / "run", seed=0, size=0.02, rank=8)


def _has_torch() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", [
    "mlx", pytest.param("torch", marks=pytest.mark.skipif(
        not _has_torch(), reason="the torch backend's rows need torch, transformers and peft "
        "(pip install -e '.[torch]')"))])
def test_every_row_trains_two_steps_with_its_invariants(array, bf16_model, init_adapter,
                                                        tmp_path, backend):
    """Each row of the covering array on `backend`: two steps in this process, then the
    invariants of combos.violations on both steps' metrics (finite, sequences trained, rewards
    in range, the loss's parts adding up, the metrics each option promises). The torch rows
    run where torch is installed (CI installs it after the README's command)."""
    failures = []
    for i, row in enumerate(array[0]):
        if row["model.backend"] != backend:
            continue
        sets = with_adapters(overrides(row), str(init_adapter)) + [
            f"training.output_dir={tmp_path / str(i)}"]
        if row["model dtype"] == "bfloat16":
            sets.append(f"model.path={bf16_model}")
        cfg = load(None, sets)
        hub = RecordingHub()
        try:
            train(cfg, hub=hub)
        except Exception as e:  # noqa: BLE001 - a row that crashes is reported with the rest
            failures.append(f"row {i} {_short(row)}: {type(e).__name__}: {e}")
            continue
        steps = [m for _, m in hub.steps]
        found = violations(row, cfg, steps, 4096)
        if len(steps) != 2:
            found.append(f"{len(steps)} steps")
        failures += [f"row {i} {_short(row)}: {v}" for v in found]
    assert not failures, "\n".join(failures)


def _short(row: dict[str, str]) -> str:
    return " ".join(f"{re.sub(r'^.*[.]', '', f)}={v}" for f, v in row.items())


def test_the_entropy_bound_counts_the_weights_of_multi_turn_tokens():
    """Failing first (row 11 on a fresh machine: "the entropy term 0.1245 is outside [0,
    entropy_coef log V]"): with Dr. GRPO's constant divisor (max_new_tokens x P x G) and two
    turns, a sequence trains more than max_new_tokens tokens, so the weights sum past 1 and the
    entropy term may reach entropy_coef log V times their sum. The numbers are that run's."""
    from combos import weight_sum

    row = {**array_row_11(), "model dtype": "float32"}
    cfg = load(None, overrides(row))
    assert weight_sum(cfg, {"train/tokens": 332.0}) == pytest.approx(332 / (16 * 8))
    m = {"loss/total": 1802.999, "loss/policy": 0.5483, "loss/kl": 1803.124 - 0.5483,
         "policy/entropy": 6.0, "policy/clipfrac": 0.3, "train/tokens": 332.0,
         "train/sequences": 8.0, "reward/min": 0.0, "reward/mean": 0.1, "reward/max": 1.0,
         "kl/mean": -1.6, "kl/penalty": 0.5}
    assert not [v for v in violations(row, cfg, [m], 4096) if "entropy" in v]


def array_row_11() -> dict[str, str]:
    """Row 11 of the covering array as the issue reported it (bfloat16, rloo, ppo, KL in the
    loss with k3, ema reference, adaptive KL, 2 turns, 2 PPO epochs, batch scale, constant
    aggregation, 2 x 2 prompts x 2 samples)."""
    return {"rl.advantage": "rloo", "rl.ratio_level": "token", "rl.loss_agg": "constant",
            "rl.loss": "ppo", "KL": "loss", "rl.kl_estimator": "k3", "rl.reference": "ema",
            "rl.adaptive_kl": "true", "rl.dynamic_sampling": "false", "rl.guidance": "false",
            "rl.carry_max_age": "4", "data.curriculum": "false", "generation.max_turns": "2",
            "rl.num_iterations": "2", "rl.mask_truncated": "false", "rl.scale": "batch",
            "model.backend": "mlx", "training.gradient_accumulation_steps": "2",
            "generation.num_samples_per_prompt": "2", "model dtype": "bfloat16"}
