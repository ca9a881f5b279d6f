"""torch.distributed as a run's data-parallel group (started by `torchrun`): gloo on the CPU,
NCCL on CUDA; the same collectives as `backends/mlx/parallel.py`.

The gradients are summed with one `all_reduce` of the flattened LoRA gradients per optimizer
step, after the micro-batch accumulation, rather than through the `DistributedDataParallel`
wrapper: DDP reduces inside backward, bucket by bucket, and needs every rank to run a backward
pass, but here a rank may keep no rollout at all (its groups dropped), the loss weights are
global (so the ranks' gradients add up; DDP averages), and the log-probs may be computed through
the model's transformer and head separately (`TorchPolicy.split`), outside the wrapper's
forward. The result is the same reduction DDP makes, once per step.

Not covered: CUDA and NCCL were not run here (no GPU); MPS tensors are copied to the CPU for
gloo.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class TorchGroup:
    device: torch.device  # where the collectives' tensors live (cpu for gloo, cuda for nccl)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def size(self) -> int:
        return dist.get_world_size()

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """[size, n] bytes: every rank's `data` (uint8 [n], the same n on every rank)."""
        x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8)).to(self.device)
        out = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(out, x)
        return torch.stack(out).cpu().numpy()

    def broadcast(self, data: np.ndarray) -> np.ndarray:
        """Rank 0's bytes (uint8 [n], the same n on every rank)."""
        x = torch.from_numpy(np.array(data, dtype=np.uint8)).to(self.device)
        dist.broadcast(x, src=0)
        return x.cpu().numpy()

    def reduce_grads(self, params: list[Any]) -> list[Any]:
        """Each parameter's `.grad` summed over the ranks, in place (a missing one counts as
        zeros): one all_reduce of the flattened gradients."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        at = 0
        for p, g in zip(params, grads, strict=True):
            p.grad = flat[at: at + g.numel()].view_as(g).to(p.device, p.dtype)
            at += g.numel()
        return params

    def close(self, clean: bool = True) -> None:
        """End the group; when `clean`, once every rank has reached here: a rank that tears its
        connections down while another still reads its last collective can kill that rank
        (gloo aborted one with "terminate called without an active exception" in a CI run)."""
        if dist.is_initialized():
            if clean and dist.get_world_size() > 1:
                with contextlib.suppress(RuntimeError):  # a peer gone: nothing to wait for
                    dist.barrier()
            dist.destroy_process_group()

    def digest(self, policy: Any) -> list[float]:
        """Sum and sum of squares of the trainable weights."""
        with torch.no_grad():
            ps = [p.detach().double() for p in policy.model.parameters() if p.requires_grad]
            return [float(sum(p.sum() for p in ps)), float(sum((p * p).sum() for p in ps))]


def connect(backend: str, timeout_s: float) -> TorchGroup:
    """The process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    `backend` nccl (each rank on cuda:LOCAL_RANK) or gloo (empty: nccl where CUDA is
    available); `timeout_s` bounds every collective (gloo raises after it)."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    return TorchGroup(device)
