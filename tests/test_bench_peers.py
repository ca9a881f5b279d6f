"""tools/bench.py's pure parts for the peers: the `--peers` list, the line `--quick` prints per
peer, and the summary of one peer's runs (medians, phases, the memory target).

Not covered: running the peers (network installs and minutes of CPU: that is the benchmark
itself, BENCHMARKS.md's "Peers" section).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench", ROOT / "tools" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_speedup_line_ends_with_the_ratio_the_issue_asks_for() -> None:
    line = bench.speedup_line("mlx-tune", "tiny", 0.41234, 1.5, 3.6349)
    assert re.search(r"speedup over mlx-tune: 3\.63x$", line)
    assert "ours 0.412 s, mlx-tune 1.500 s" in line


def test_peer_names_default_is_every_peer_and_unknown_names_stop() -> None:
    assert bench.peer_names(",".join(bench.PEERS)) == ["mlx-lm-lora", "mlxrl", "mlx-tune"]
    assert bench.peer_names(" mlxrl ,") == ["mlxrl"]
    with pytest.raises(SystemExit, match="unknown peers"):
        bench.peer_names("mlxrl,trl")


def _runs(ours: list[float], peer: list[float]) -> dict:
    side = {"ours": {"step_s": ours, "generate_s": ours, "score_s": [0.0] * len(ours),
                     "train_s": ours},
            "peer": {"step_s": peer, "generate_s": peer, "score_s": [0.0] * len(peer),
                     "train_s": peer, "old_ref_s": [0.5] * len(peer)}}
    return {"alone": {**side["peer"], "mlx_peak_gb": 0.2, "rss_peak_gb": 0.5,
                      "decode_width": 8, "note": "n"},
            "duel": {**side, "ratio": [p / o for p, o in zip(peer, ours, strict=True)]}}


def test_peer_summary_takes_medians_of_pairs_and_keeps_the_extra_phase() -> None:
    s = bench.peer_summary(_runs([1.0, 1.0, 2.0], [2.0, 3.0, 3.0]))
    assert s["speedup"] == 2.0 and s["pairs"] == [1.5, 3.0]
    assert s["side_by_side"]["peer"]["old_ref_s"] == 0.5
    assert s["alone"]["mlx_peak_gb"] == 0.2
    assert bench.peer_summary({"error": "pip failed"}) == {"error": "pip failed"}


def test_targets_name_each_peer_speed_and_memory() -> None:
    s = {"rollout_ratio_ours_over_mlx_lm": 1.0, "mlx_peak_gb_tiny": {"ours": 0.3},
         "peers": {"mlxrl": bench.peer_summary(_runs([1.0], [2.0]))}}
    t = bench.targets(s)
    assert t["tiny: RL step >= 1.5x faster than mlxrl"] is True
    assert t["tiny: MLX peak <= mlxrl's"] is False  # 0.3 GB against its 0.2 GB
