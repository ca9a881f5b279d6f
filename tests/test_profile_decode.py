"""tools/profile_decode.py's `--ablate`: each part removed and put back, results per setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import profile_decode  # noqa: E402


def test_each_ablation_is_put_back_and_keeps_its_own_compiled_steps():
    from mlx_rlaif.backends.mlx import compiled_decode, decode
    from mlx_rlaif.cpu import decode_kernels

    before = (decode.Sampler.draw, compiled_decode.StaticKV.update_and_fetch,
              decode_kernels.decode_attention, decode_kernels._transposed_linears)

    class Model:
        pass

    model, own = Model(), {"the model's": object()}
    model._compiled_decode_steps = own
    for name in ["whole", *profile_decode.ABLATIONS]:
        steps = {"traced for " + name: object()}
        with profile_decode._without(model, name, steps):
            assert model._compiled_decode_steps is steps  # the variant's, kept across reps
            now = (decode.Sampler.draw, compiled_decode.StaticKV.update_and_fetch,
                   decode_kernels.decode_attention, decode_kernels._transposed_linears)
            assert sum(a is not b for a, b in zip(now, before, strict=True)) == (name != "whole")
        assert model._compiled_decode_steps is own
    assert (decode.Sampler.draw, compiled_decode.StaticKV.update_and_fetch,
            decode_kernels.decode_attention, decode_kernels._transposed_linears) == before


@pytest.mark.slow
def test_ablate_writes_paired_ratios_per_part(tmp_path):
    out = tmp_path / "ablate.json"
    cmd = [sys.executable, str(ROOT / "tools" / "profile_decode.py"), "--shape", "micro",
           "--widths", "4", "--tokens", "4", "--reps", "1", "--ablate", "sampler,kv_write",
           "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())["profile_decode"]["ablate/micro/float32/w4/T4"]
    assert set(result["paired"]) == {"sampler", "kv_write"}
    assert all(v["median"] > 0 for v in result["paired"].values())
    assert "without sampler" in proc.stdout


def test_an_unknown_part_is_refused_with_the_choices():
    with pytest.raises(SystemExit, match="unknown part.*choose from attention, sampler"):
        profile_decode.ablate(None, ["sampler", "mlp"], 1)


@pytest.mark.slow
def test_rollouts_runs_only_the_compiled_loop_and_records_its_rate(tmp_path):
    out = tmp_path / "rollouts.json"
    cmd = [sys.executable, str(ROOT / "tools" / "profile_decode.py"), "--shape", "micro",
           "--widths", "4", "--tokens", "4", "--rollouts", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())["profile_decode"]["rollouts/micro/float32/w4/T4"]
    assert result["rollouts"] == 2 and result["tokens_per_s"] > 0
    assert "over 2 rollouts" in proc.stdout and "eager" not in proc.stdout
