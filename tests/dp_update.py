"""One data-parallel update on a fixed batch, run by tests/test_distributed.py alone (the whole
batch) or as one of several ranks (`mlx.launch -n 2`, `torchrun --nproc-per-node 2`), each with
its part. Rank 0 writes what the test compares (advantages, metrics, weights after the update)
as JSON.

    python3 tests/dp_update.py mlx|torch MODEL OUT.json SCENARIO [SCENARIO ...]

A SCENARIO is `SPLIT:AGG`: SPLIT the number of groups each rank takes, in order (e.g. `1,3`: rank
0 the first group, rank 1 the other three; alone, `4`); AGG the loss aggregation. The batch is 4
groups of 3 completions of different lengths; the last group's rewards tie, so it is dropped
(`3,1` leaves rank 1 nothing to train on). The optimizer is SGD with learning rate 1, so the
weights move by exactly the clipped gradient; `rl.num_iterations=2` takes two steps (one for a
bfloat16 or float16 model, MLX_RLAIF_TEST_DTYPE: there the rounding of two ranks against one
process flips a token across the clip boundary in the second step, which moves a short
sequence's weights by ~12% under sequence-mean aggregation, measured; the first step agrees to
0.3%).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from mlx_rlaif.algo import advantages
from mlx_rlaif.backends.ops import OPS
from mlx_rlaif.config import load
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.train.distributed import World, connect

LENGTHS = [[3, 9, 5], [14, 2, 7], [11, 4, 16], [6, 8, 10]]  # completion tokens per group
REWARDS = [[1.0, 0.0, 0.5], [0.2, 0.9, 0.4], [0.0, 0.3, 1.0], [0.5, 0.5, 0.5]]
ITERATIONS = 2 if os.environ.get("MLX_RLAIF_TEST_DTYPE", "float32") == "float32" else 1


def batch() -> list[list[tuple[Rollout, float]]]:
    """The fixed batch: 4 groups of (rollout, reward), old log-probs near the policy's."""
    rng = np.random.default_rng(0)
    groups = []
    for g, (lengths, rewards) in enumerate(zip(LENGTHS, REWARDS, strict=True)):
        task = Task(f"t{g}", f"task {g}")
        prompt = tuple(int(x) for x in rng.integers(3, 500, size=4 + g))
        group = []
        for n, reward in zip(lengths, rewards, strict=True):
            tokens = tuple(int(x) for x in rng.integers(3, 500, size=n))
            old = tuple(float(x) for x in -6.2 + 0.3 * rng.standard_normal(n))
            group.append((Rollout(task, prompt, tokens, old, "", "length", 1.0), reward))
        groups.append(group)
    return groups


def my_groups(world: World, split: list[int]) -> list[list[tuple[Rollout, float]]]:
    start = sum(split[: world.rank])
    return batch()[start: start + split[world.rank]]


def optimizer(backend: str, policy: object) -> object:
    if backend == "mlx":
        import mlx.optimizers as optim

        return optim.SGD(learning_rate=1.0)
    import torch

    return torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=1.0)


def weights(backend: str, policy: object) -> dict[str, list]:
    if backend == "mlx":
        from mlx.utils import tree_flatten

        return {k: np.array(v).tolist() for k, v in
                tree_flatten(policy.model.trainable_parameters())}
    return {k: v.detach().numpy().tolist() for k, v in policy.model.named_parameters()
            if v.requires_grad}


def scenario(world: World, backend: str, model: str, split: list[int], agg: str) -> dict:
    cfg = load(None, [f"model.path={model}", f"model.backend={backend}", "model.device=cpu",
                      f"rl.loss_agg={agg}", "rl.scale=batch", "rl.whiten=true",
                      f"rl.num_iterations={ITERATIONS}", "rl.kl_penalty=0.1", "rl.entropy_coef=0.01",
                      "training.max_grad_norm=0.05", "training.micro_batch_size=2",
                      "generation.num_samples_per_prompt=3", "generation.max_new_tokens=16"])
    ops = OPS[backend]()
    policy = ops.load(cfg)
    pairs = [p for g in my_groups(world, split) for p in g]
    rollouts, rewards = [r for r, _ in pairs], [v for _, v in pairs]
    adv = advantages.compute(rewards, [r.task.id for r in rollouts], "grpo", "batch", True,
                             reduce=world.reduce)
    kept = [r for r, k in zip(rollouts, adv.keep, strict=True) if k]
    ref = ops.reference(policy, kept, cfg) if kept else None
    start = weights(backend, policy)
    metrics, skipped = ops.update(policy, optimizer(backend, policy), kept,
                                  list(adv.values[adv.keep]), ref, cfg, 0.1,
                                  shard=world.shard([r.trained_tokens for r in kept]))
    return {"adv": world.gather_flat(adv.values.tolist()), "metrics": metrics,
            "skipped": skipped, "kept": world.gather_flat([len(kept)]),
            "weights": weights(backend, policy), "start": start}


def main(argv: list[str]) -> None:
    backend, model, out, *scenarios = argv
    world = connect()
    results = {}
    for s in scenarios:
        split, agg = s.split(":")
        results[s] = scenario(world, backend, model, [int(x) for x in split.split(",")], agg)
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump({"size": world.size, "results": results}, f)
    world.close()


if __name__ == "__main__":
    main(sys.argv[1:])
