"""No silent combination: every pair of the options that change a step (tests/combos.py's
factors: estimator, ratio level, aggregation, loss, KL placement and estimator, reference (the
initial one from adapters made for the test), adaptive KL, dynamic sampling, guidance,
curriculum, turns, PPO epochs, truncation mask, scale, backend, gradient accumulation, group
size, model dtype) either trains two steps on the
shipped tiny model with the metrics' invariants holding, or is refused by `config.check` with
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
from combos import FACTORS, covering_array, label, overrides, pairs_of, violations, with_adapters
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


@pytest.mark.slow
def test_every_row_trains_two_steps_with_its_invariants(array, bf16_model, init_adapter,
                                                        tmp_path):
    """Each row of the covering array: two steps in this process, then the invariants of
    combos.violations on both steps' metrics (finite, sequences trained, rewards in range, the
    loss's parts adding up, the metrics each option promises)."""
    failures = []
    for i, row in enumerate(array[0]):
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
