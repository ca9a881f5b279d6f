"""Fault injection, a soak: tools/soak.py for 50 steps (the full 500-step run and its figures are
in docs/reliability.md) on the shipped tiny model, the exec reward in its sandbox and a teacher
failing 10% of requests. Sampled every 10 steps: resident memory, file descriptors and threads
stay flat within noise, no zombie, and after the run nothing is left in its temporary directory
or /dev/shm and none of its processes runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("training.batch_size=2", "generation.num_samples_per_prompt=2",
         "generation.max_new_tokens=32", "reward.teacher.reference=false")


def _soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "tools" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_soak_50_steps_flat_no_zombies_nothing_left(tmp_path):
    soak = _soak()
    r = soak.measure(50, 10, ROOT / "models" / "tiny-coder", tmp_path, rate=0.10, seed=1,
                     sets=SMALL)
    print("\n" + soak.table(r))
    assert r["rc"] == 0, Path(r["log"]).read_text()[-3000:]
    rows = r["samples"]
    assert rows[-1]["step"] == 50 and len(rows) >= 5
    assert sum(n for k, n in r["faults"].items() if k != "ok") > 0  # the teacher did fail
    assert [x["zombies"] for x in rows] == [0] * len(rows)
    assert r["left_in_tmp"] == [] and r["left_in_dev_shm"] == [] and r["survivors"] == []
    steady = rows[1:]  # after the first step: models loaded, kernels compiled
    threads = [x["threads"] for x in steady]
    # pools start threads lazily and idle ones exit: a sample may catch a few more or fewer
    # (one full-suite run sampled 21, 21, 21, 24, 21); a leak grows with the steps and stays,
    # so the lower of the last two samples must not exceed the early peak
    assert min(threads[-2:]) <= max(threads[: len(threads) // 2 + 1]) + 2, threads
    fds = [x["fds"] for x in steady]  # a sample may land while sandboxes run: compare lows
    assert min(fds[-2:]) <= min(fds[:2]) + 4, fds
    rss = [x["rss_mb"] for x in steady]
    assert rss[-1] <= 1.25 * rss[0], rss
