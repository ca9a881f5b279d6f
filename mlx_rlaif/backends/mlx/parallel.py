"""MLX's distributed engine (`mx.distributed`) as a run's data-parallel group: the few
collectives the training loop needs, on the group `mlx.launch` set up (ring over TCP or
Thunderbolt, MPI, JACCL's RDMA, NCCL).

- `all_gather` and `broadcast` move raw bytes (uint8 arrays, on the CPU stream): the loop
  builds its sums, JSON exchanges and file copies on them (train/distributed.py);
- `reduce_grads` sums a gradient tree over the ranks with mlx's own `average_gradients` (which
  packs the small LoRA arrays into few large all-reduces) times the group size: the loss weights
  are global (backends/parallel.py), so each rank holds a part of the sum, not a mean;
- `digest` is a cheap fingerprint of the trainable weights (their sum and sum of squares), for
  the loop's check that every rank holds the same weights.

Every call blocks until the collective is done (arrays are evaluated here), so the caller's
watchdog can time it. Not covered: choosing the backend (the environment `mlx.launch` sets
does: train/distributed.py), timeouts (MLX's collectives have none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.nn.utils import average_gradients
from mlx.utils import tree_flatten, tree_map


@dataclass
class MlxGroup:
    group: Any  # mx.distributed.Group

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """[size, n] bytes: every rank's `data` (uint8 [n], the same n on every rank)."""
        out = mx.distributed.all_gather(mx.array(data), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return np.array(out, dtype=np.uint8).reshape(self.size, -1)

    def broadcast(self, data: np.ndarray) -> np.ndarray:
        """Rank 0's bytes (uint8 [n], the same n on every rank; others pass zeros): a sum."""
        out = mx.distributed.all_sum(mx.array(data), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return np.array(out, dtype=np.uint8)

    def reduce_grads(self, grads: Any) -> Any:
        """The gradient tree summed over the ranks (evaluated)."""
        n = self.size
        out = tree_map(lambda g: g * n, average_gradients(grads, self.group))
        mx.eval(out)
        return out

    def digest(self, policy: Any) -> list[float]:
        """Sum and sum of squares of the trainable weights (adapters, a value head)."""
        arrays = [v.astype(mx.float32) for _, v in
                  tree_flatten(policy.model.trainable_parameters())]
        parts = [mx.stack([a.sum(), (a * a).sum()]) for a in arrays]
        total = mx.stack(parts).astype(mx.float32) if parts else mx.zeros((0, 2))
        mx.eval(total)
        return np.array(total, dtype=np.float64).sum(axis=0).tolist() if parts else [0.0, 0.0]


def connect(backend: str, timeout_s: float) -> MlxGroup:
    """The group of this process (`backend`: ring, mpi, jaccl or nccl, as launched). MLX has no
    connection timeout: the caller's watchdog bounds the wait."""
    return MlxGroup(mx.distributed.init(strict=True, backend=backend))
