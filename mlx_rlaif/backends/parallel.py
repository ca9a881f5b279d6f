"""What a backend's update is given when several processes (ranks) train data-parallel: its
`Shard` of the optimizer step. The group and the reductions themselves are built by the
training loop (`train/distributed.py`) on the backend's collectives (`backends/mlx/parallel.py`,
`backends/torch/parallel.py`) and come in here as plain numbers and callables.

With a shard, the update equals the one-process update on the whole step's batch:

- the loss weights (`algo.aggregation`) use the whole step's kept sequences and completion
  tokens (`sequences`, `tokens`), so each rank's gradient is its part of the global sum;
- the micro-batch gradients are accumulated, then summed over ranks once per optimizer step
  (`reduce_grads`), and clipping and the finiteness check act on the sum;
- the loss's aux sums (loss, tokens, entropy, ...) are summed over ranks (`sum`), so the
  metrics and the skip decision are the global ones;
- a rank that keeps no rollout still takes part: an all-zero gradient goes through the sum.

Not covered: the group, shares, seeds and metrics (train/distributed.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shard:
    """This rank's part of a data-parallel optimizer step.

    sequences, tokens: kept sequences and their completion tokens over every rank (the loss
    divisor's counts). sum: named numbers summed over ranks (keys may differ between ranks; a
    key missing on a rank counts 0). reduce_grads: the gradient summed over ranks; on MLX it
    takes and returns the gradient tree, on torch it takes the parameters and sums their
    `.grad` in place (a missing `.grad` counts as zeros)."""

    sequences: int
    tokens: int
    sum: Callable[[dict[str, float]], dict[str, float]]
    reduce_grads: Callable[[Any], Any]
