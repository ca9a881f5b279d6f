"""What data-parallel training costs per step (BENCHMARKS.md, "Several machines"):

    python3 tools/dp_bench.py bytes                  LoRA gradient bytes per step, from the
                                                     Qwen2.5 0.5B and 7B shapes (rank 8, 16)
    mlx.launch -n 2 -- python3 tools/dp_bench.py allreduce [--repeats 10]
                                                     the measured all-reduce of those bytes, and
                                                     of the small exchanges of a step
    python3 tools/dp_bench.py straggler RUN [--prompts 8]
                                                     the straggler cost, from the completion
                                                     lengths a run sampled (RUN/datasets)

`bytes` builds each model with mlx-lm's own Qwen2 code and our LoRA layers (`add_lora`, the
default: every linear layer of every block) without evaluating any weight, and counts the
trainable arrays. `allreduce` sums trees of float32 arrays of exactly those shapes with the
training loop's gradient reduction (`MlxGroup.reduce_grads`: mlx's `average_gradients` times
the group size) and times the loop's small exchanges (a JSON gather, a float sum).
`straggler` resamples whole groups of the run's completions into steps of P prompts split over
k ranks and measures how long the other ranks wait for the one with the longest completion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

QWEN = {  # Qwen2.5 config.json values that decide the LoRA shapes
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
}
RANKS = (8, 16)


def lora_shapes(name: str, rank: int) -> list[tuple[int, ...]]:
    """Shapes of the trainable arrays of `name` with LoRA of `rank` on every linear layer."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    from mlx_rlaif.artifacts.lora import LoraSpec
    from mlx_rlaif.backends.mlx.policy import add_lora

    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1e6, **QWEN[name])
    model = qwen2.Model(args)  # lazy: no weight is ever evaluated
    model.freeze()
    add_lora(model, LoraSpec(rank=rank, scale=20.0, dropout=0.0), -1)
    return [tuple(v.shape) for _, v in tree_flatten(model.trainable_parameters())]


def grad_bytes() -> list[dict[str, Any]]:
    rows = []
    for name in QWEN:
        for rank in RANKS:
            shapes = lora_shapes(name, rank)
            n = sum(int(np.prod(s)) for s in shapes)
            rows.append({"model": name, "rank": rank, "arrays": len(shapes), "params": n,
                         "bytes": 4 * n})
    return rows


def allreduce(repeats: int) -> None:
    import mlx.core as mx

    from mlx_rlaif.train.distributed import connect

    world = connect()
    assert world.size > 1, "run under mlx.launch -n 2"
    out = []
    for row in grad_bytes():
        tree = [mx.ones(s) for s in lora_shapes(row["model"], row["rank"])]
        mx.eval(tree)
        times = []
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            world.group.reduce_grads(tree)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out.append({**row, "median_s": statistics.median(times), "min_s": min(times)})
    record = {"metrics": {f"k{i}": 0.5 for i in range(40)},
              "samples": [{"completion": "x" * 400, "reward": 0.5}] * 32}  # ~15 KB
    small = {"gather_15kb": lambda: world.gather(record), "sum_2_floats": lambda: world.sum([1, 2])}
    for name, fn in small.items():
        times = []
        for _ in range(repeats * 5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out.append({"exchange": name, "median_s": statistics.median(times)})
    if world.rank == 0:
        print(json.dumps({"ranks": world.size, "repeats": repeats, "rows": out}, indent=1))


def completion_groups(run: Path) -> list[list[int]]:
    """Token lengths of every group of completions a run trained on (datasets/train.jsonl),
    tokenized with the run's model."""
    from mlx_lm.utils import load

    from mlx_rlaif.assets import model_source
    from mlx_rlaif.config import load as load_config

    cfg = load_config(run / "config.yaml")
    _, tok = load(model_source(cfg.model.path, ""))
    groups: dict[tuple[int, str], list[int]] = {}
    for line in (run / "datasets" / "train.jsonl").read_text().splitlines():
        r = json.loads(line)
        n = len(tok.encode(r["completion"], add_special_tokens=False))
        groups.setdefault((r.get("step", 0), r["task_id"]), []).append(n)
    return list(groups.values())


def straggler(run: Path, prompts: int, trials: int = 20000, seed: int = 0) -> dict[str, Any]:
    """For k ranks sharing a step of `prompts` groups (whole groups per rank): the mean
    longest completion over all ranks (what the step waits for), the mean longest per rank,
    and the share of rank-time spent waiting, 1 - mean_r(L_r) / max_r(L_r)."""
    groups = completion_groups(run)
    longest = np.array([max(g) for g in groups], dtype=np.float64)
    lengths = np.array([x for g in groups for x in g], dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows = []
    for k in (1, 2, 4, 8):
        if prompts % k:
            continue
        pick = longest[rng.integers(0, len(longest), size=(trials, k, prompts // k))]
        per_rank = pick.max(axis=2)  # each rank decodes until its longest completion
        step = per_rank.max(axis=1)  # the reduction waits for the slowest rank
        rows.append({"ranks": k, "prompts_per_rank": prompts // k,
                     "step_longest": float(step.mean()), "rank_longest": float(per_rank.mean()),
                     "idle_share": float(1 - (per_rank.mean(axis=1) / step).mean())})
    return {"groups": len(groups), "group_size": int(np.median([len(g) for g in groups])),
            "completion_tokens": {"mean": float(lengths.mean()),
                                  "p50": float(np.percentile(lengths, 50)),
                                  "p90": float(np.percentile(lengths, 90)),
                                  "max": float(lengths.max())},
            "truncated_share_at_max": float((lengths >= lengths.max()).mean()),
            "prompts_per_step": prompts, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["bytes", "allreduce", "straggler"])
    ap.add_argument("run", nargs="?", help="run directory (straggler)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8)
    a = ap.parse_args()
    if a.what == "bytes":
        print(json.dumps(grad_bytes(), indent=1))
    elif a.what == "allreduce":
        allreduce(a.repeats)
    else:
        print(json.dumps(straggler(Path(a.run), a.prompts), indent=1))


if __name__ == "__main__":
    main()
