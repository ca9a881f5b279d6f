"""tools/gpu_check.py and tools/q4_probe.py on the CPU build (`--quick`: the tiny shape): each
stage runs in its own process and writes its part of the one JSON; a stage that fails, or that
the budget cannot hold, is recorded as such and the others still run."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpu_check(tmp_path: Path, *args: str, env: dict | None = None) -> dict:
    out = tmp_path / "check.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--quick", "--out",
                    str(out), *args], check=True, capture_output=True, text=True, timeout=600,
                   env=env)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_the_check_runs_its_stages_and_records_each(tmp_path: Path) -> None:
    res = gpu_check(tmp_path, "--only", "env,model,ours_bf16,ours_bf16_fused,decode_peer,"
                    "peer_bf16", "--budget", "400")
    assert res["env"]["status"] == "ok" and res["env"]["device"].startswith("CPU: ")
    assert res["env"]["build_problem"] is None
    assert res["model"]["status"] == "ok"
    ours = res["ours_bf16"]
    assert ours["status"] == "ok", ours
    assert len(ours["all_step_s"]) == 2 and ours["trained"] == 4  # 2 x 2 at the quick shape
    assert res["ours_bf16_fused"]["status"] == "ok" and res["ours_bf16_fused"]["trained"] == 4
    assert res["decode_peer"]["tokens_per_s"] > 0 and res["decode_peer"]["width"] == 4
    # mlx-lm-lora is not installed here: the stage fails alone, recorded with its error
    peer = res["peer_bf16"]
    assert peer["status"] != "ok" or "all_step_s" in peer
    assert list(res)[:2] == ["command", "env"]


@pytest.mark.slow
def test_the_decode_comparison_records_paired_ratios_per_width(tmp_path: Path) -> None:
    """The `decode_compare` extra: tools/profile_decode.py --compare, its result per width with
    the side-by-side ratios (rep i of ours over rep i of the peer) beside the medians."""
    res = gpu_check(tmp_path, "--only", "decode_compare", "--budget", "300")
    stage = res["decode_compare"]
    assert stage["status"] == "ok", stage
    rows = stage["result"]["profile_decode"]
    assert sorted(rows) == ["compare/tiny/bfloat16/w16/T16", "compare/tiny/bfloat16/w4/T16"]
    for r in rows.values():
        assert {len(v) for v in r["runs"].values()} == {2}
        ratios = [a / b for a, b in zip(r["runs"]["ours"], r["runs"]["mlx_lm"], strict=True)]
        p = r["paired"]["ours_over_mlx_lm"]
        assert p["min"] == min(ratios) and p["max"] == max(ratios) and p["min"] > 0


def test_a_stage_the_budget_cannot_hold_is_skipped(tmp_path: Path) -> None:
    res = gpu_check(tmp_path, "--only", "env,tests", "--budget", "1")
    assert res["env"]["status"] == "ok"
    assert res["tests"]["status"].startswith("skipped:")


def test_only_runs_the_stages_in_the_order_given(tmp_path: Path) -> None:
    """A short lease names the stages it needs first (the last GPU run's `--only` list was
    re-sorted into the default order, and its budget went on stages it did not need first)."""
    res = gpu_check(tmp_path, "--only", "tests,env", "--budget", "1")
    assert [k for k in res if k not in ("command", "seconds")] == ["tests", "env"]
    assert res["tests"]["status"].startswith("skipped:") and res["env"]["status"] == "ok"


def test_the_q4_probe_stage_reports_alone(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "q4_probe.py"), "--stage",
                           "head", "--shape", "micro", "--rows", "7"], capture_output=True,
                          text=True, timeout=120, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("Q4-RESULT "))
    res = json.loads(line[len("Q4-RESULT "):])
    assert res["logits"] == [7, 512] and res["dh_finite"] is True



def test_the_q4_probe_matrix_runs_every_stage_at_a_small_shape(tmp_path: Path) -> None:
    """Every stage of the probe's matrix reports "ok" (its `chunks` stage imported loss
    functions that had been renamed, so on a GPU it would have reported an ImportError, not
    the kernel's fault)."""
    out = tmp_path / "q4.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "q4_probe.py"), "--shape", "micro",
                    "--json", str(out)], capture_output=True, text=True, timeout=300, check=True)
    stages = json.loads(out.read_text())["stages"]
    assert {k: v["status"] for k, v in stages.items() if v["status"] != "ok"} == {}
    assert stages["chunks"]["chunks"] == 4 and stages["chunks"]["dh_finite"] is True

def test_the_kernel_cache_travels_as_one_archive(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kernel-cache FILE`: the compiled kernels of one lease unpacked in the next, so its
    first stage does not compile for minutes again; only under the MLX version and GPU
    architecture that compiled them (MLX finds a cached kernel by its name alone)."""
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    tool = importlib.import_module("gpu_check")

    src, dst, archive = tmp_path / "ptx", tmp_path / "again", tmp_path / "carry" / "k.tar.xz"
    (src / "sub").mkdir(parents=True)
    (src / "a.ptx").write_text("kernel a")
    (src / "sub" / "b.ptx").write_bytes(b"\x00\x01kernel b")
    assert tool.save_cache(archive, "0.32.4-sm_90", src)["files"] == 2
    other = tool.restore_cache(archive, "0.32.5-sm_90", tmp_path / "other")
    assert other["restored"] is False and not list((tmp_path / "other").rglob("*.ptx"))
    assert tool.restore_cache(archive, "0.32.4-sm_90", dst)["files"] == 2
    assert (dst / "a.ptx").read_text() == "kernel a"
    assert (dst / "sub" / "b.ptx").read_bytes() == b"\x00\x01kernel b"
    assert tool.restore_cache(tmp_path / "none.tar.xz", "k", dst)["restored"] is False
    assert tool.save_cache(archive, "k", tmp_path / "empty")["files"] == 0

    res = gpu_check(tmp_path, "--only", "env", "--budget", "60", "--kernel-cache",
                    str(tmp_path / "cli.tar.xz"))
    assert res["kernel_cache"]["key"].startswith(mx.__version__ + "-")
    assert res["kernel_cache"]["restored"] is False and (tmp_path / "cli.tar.xz").is_file()


@pytest.mark.slow
def test_the_cold_quickstart_leaves_the_shared_kernel_cache_alone(tmp_path: Path) -> None:
    """The cold run compiles into an empty cache of its own (whose kernels then join the shared
    one): kernels restored from an earlier lease (`--kernel-cache`) stay for the other stages."""
    work = tmp_path / "mlx-rlaif-gpu-check" / "ptx-cache"
    work.mkdir(parents=True)
    (work / "restored.ptx").write_text("from the last lease")
    shared = Path(tempfile.gettempdir()) / "mlx"  # MLX's CPU build JIT-compiles its fused
    if shared.is_dir():  # kernels into $TMPDIR/mlx: the suite's own, not 40 s of compiling
        (tmp_path / "mlx").symlink_to(shared, target_is_directory=True)
    res = gpu_check(tmp_path, "--only", "quickstart_cold", "--budget", "500",
                    env={**os.environ, "TMPDIR": str(tmp_path)})
    assert res["quickstart_cold"]["rc"] == 0, res
    assert (work / "restored.ptx").read_text() == "from the last lease"
