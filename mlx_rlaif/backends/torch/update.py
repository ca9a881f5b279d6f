"""The update on the torch backend: the reference pass, the loss, mlx's AdamW rule and the MLX
update's micro-batched steps (`backends/mlx/update.py`), in torch.

- reference: the same weights with the adapters off (`disable_adapter()`), no second copy.
- loss and update: `algo.objective` on the global weights of `algo.aggregation`, gradients
  summed over micro-batches, `num_iterations` PPO epochs, norm clipping, non-finite steps
  skipped; `rl.is_correction` as on MLX (algo/correction.py: the first iteration's
  log-probs kept as the later iterations' old policy). The optimizer is
  `mlx.optimizers.AdamW`'s rule (no bias correction, mlx's default) with the MLX backend's
  schedule: a learning rate tuned on a Mac means the same.

Not covered: the shared-prompt forward (`backends/mlx/shared_prompt.py`): every row runs its
prompt in full.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from ...algo import correction, objective
from ...algo.aggregation import aggregation_weights, loss_aggregation
from ...config import batch_sequences, micro_batch_size
from ...records import Rollout
from .. import batch as batching
from ..parallel import Shard
from .policy import TorchPolicy, checkpointed_blocks, token_logprobs

kl_estimate = partial(objective.kl_estimate, xp=torch)
clipped_surrogate = partial(objective.clipped_surrogate, xp=torch)


def rl_loss(model: Any, mb: dict[str, torch.Tensor], rl: Any, kl_penalty: float,
            temperature: float, split: Any = None
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """backends/mlx/loss.rl_loss in torch: (loss, aux of masked sums) for one micro-batch;
    `split`: the model's transformer and head, for log-probs in chunks (`token_logprobs`)."""
    logp, entropy = token_logprobs(model, mb["tokens"], temperature, with_entropy=True,
                                   split=split)
    if rl.entropy_coef == 0:
        entropy = entropy.detach()
    loss, aux = objective.objective(logp, entropy, mb, rl, kl_penalty, xp=torch)
    return loss, {k: v.detach() for k, v in aux.items()}


def to_torch(mb: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """backends.batch.build's arrays as torch tensors on `device` (tokens as int64)."""
    out = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in mb.items()}
    out["tokens"] = out["tokens"].long()
    return out


def reference_logprobs(policy: TorchPolicy, rollouts: list[Rollout], cfg: Any
                       ) -> list[np.ndarray]:
    """Log-probs of each completion under the frozen base (same weights, adapters off)."""
    with policy.model.disable_adapter():
        return policy_logprobs(policy, rollouts, cfg)


def policy_logprobs(policy: TorchPolicy, rollouts: list[Rollout], cfg: Any
                    ) -> list[np.ndarray]:
    """Log-probs of each completion under the model as it is (adapters on unless disabled by
    the caller), at the sampling temperature, without gradients."""
    out: list[np.ndarray] = []
    zeros = [0.0] * len(rollouts)
    with torch.no_grad():
        for s in batching.chunks(len(rollouts), micro_batch_size(cfg)):
            b = to_torch(batching.build(rollouts[s], zeros[s], zeros[s]), policy.device)
            logp = token_logprobs(policy.model, b["tokens"], cfg.generation.temperature,
                                  split=policy.split)[0]
            logp = logp.cpu().numpy()
            for i, r in enumerate(rollouts[s]):
                start = len(r.prompt_tokens) - 1
                out.append(logp[i, start: start + len(r.tokens)])
    return out


# --- optimizer -------------------------------------------------------------------------------


class AdamW(torch.optim.Optimizer):
    """mlx.optimizers.AdamW's rule: p *= 1 - lr * wd; m, v moving averages; p -= lr * m /
    (sqrt(v) + eps), without bias correction (mlx's default). lr = schedule(updates so far)."""

    def __init__(self, params: Any, schedule: Callable[[int], float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": schedule(0), "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "updates": 0})
        self.schedule = schedule

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            lr = group["lr"] = self.schedule(group["updates"])
            (b1, b2), eps, wd = group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                p.mul_(1.0 - lr * wd)
                m.mul_(b1).add_(p.grad, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1.0 - b2)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)
            group["updates"] += 1


def lr_schedule(t: Any, total_updates: int) -> Callable[[int], float]:
    """backends/mlx/update.make_optimizer's learning rate at each update: linear warmup from lr * 1e-3, then
    constant or cosine decay to lr * min_lr_ratio (`t` is the training config section)."""
    peak, warm = t.learning_rate, t.warmup_steps
    decay, end = max(total_updates - warm, 1), t.learning_rate * t.min_lr_ratio

    def after(step: int) -> float:
        if t.lr_schedule != "cosine":
            return peak
        s = min(step, decay)
        return end + 0.5 * (1.0 + math.cos(math.pi * s / decay)) * (peak - end)

    def lr(step: int) -> float:
        if step < warm:
            start = peak * 1e-3
            return start + (peak - start) * step / warm
        return after(step - warm)

    return lr


def make_optimizer(policy: TorchPolicy, cfg: Any, total_updates: int) -> AdamW:
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return AdamW(params, lr_schedule(cfg.training, total_updates),
                 weight_decay=cfg.training.weight_decay)


# --- the update ------------------------------------------------------------------------------


def update(policy: TorchPolicy, optimizer: torch.optim.Optimizer, rollouts: list[Rollout],
           adv: np.ndarray, ref: list[np.ndarray] | None, cfg: Any, kl_penalty: float,
           critic: Any = None, shard: Shard | None = None) -> tuple[dict[str, float], int]:
    """`num_iterations` optimizer updates on the kept rollouts, micro-batched, as the MLX
    update: (metrics, the number of updates skipped for a non-finite loss or gradient).
    `shard`: this rank's part of a data-parallel step, as in the MLX update."""
    if critic is not None:
        raise NotImplementedError("the torch backend has no critic (refused by config.check)")
    if (shard.sequences if shard is not None else len(rollouts)) == 0:
        return {"train/tokens": 0.0}, 0
    skipped = 0
    lengths = [r.trained_tokens for r in rollouts]
    w = aggregation_weights(lengths, loss_aggregation(cfg.rl), cfg.generation.max_new_tokens,
                            batch_sequences(cfg), *((shard.tokens, shard.sequences) if shard
                                                    else ()))
    mbs = [to_torch(batching.build(rollouts[s], adv[s], w[s], ref[s] if ref is not None else None),
                    policy.device)
           for s in batching.chunks(len(rollouts), micro_batch_size(cfg))]
    model, tic, first = policy.model, time.perf_counter(), None
    model.train(cfg.lora.dropout > 0)  # dropout (if any) only inside the update
    try:
        with checkpointed_blocks(model, cfg.training.grad_checkpoint == "on"):
            for _ in range(cfg.rl.num_iterations):
                optimizer.zero_grad(set_to_none=True)
                aux: dict[str, torch.Tensor] = {}
                for mb in mbs:
                    loss, a = rl_loss(model, mb, cfg.rl, kl_penalty, cfg.generation.temperature,
                                      policy.split)
                    loss.backward()
                    if correction.TRAINER_LOGP in a:  # iteration 1's, the later ones' old policy
                        mb[correction.TRAINER_LOGP] = a.pop(correction.TRAINER_LOGP)
                    aux = correction.accumulate(aux, a, torch) if aux else a
                if shard is not None:  # summed over the ranks (zeros where a rank has no rollouts)
                    shard.reduce_grads([p for g in optimizer.param_groups for p in g["params"]])
                    aux = reduce_aux(aux, shard)
                first = first or aux
                norm, ok = apply_update(optimizer, aux["loss"], cfg.training.max_grad_norm)
                skipped += not ok
    finally:
        model.train(False)
    seconds = time.perf_counter() - tic
    tokens = sum(lengths) * cfg.rl.num_iterations
    lr = float(optimizer.param_groups[0]["lr"])
    return update_metrics(aux, first, norm, lr, tokens, seconds), skipped


def reduce_aux(aux: dict[str, torch.Tensor], shard: Shard) -> dict[str, torch.Tensor]:
    """The aux sums summed over the ranks; `*_max` entries stay this rank's (the metrics take
    their maximum over the ranks: train/distributed_metrics.py)."""
    total = shard.sum({k: float(v) for k, v in aux.items() if not k.endswith("_max")})
    total.update({k: float(v) for k, v in aux.items() if k.endswith("_max")})
    return {k: torch.tensor(v) for k, v in total.items()}


def apply_update(optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_norm: float
                 ) -> tuple[float, bool]:
    """Clip, check finiteness, step. Returns (gradient norm before clipping, stepped?)."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
    norm_v, loss_v = float(norm), float(loss)
    if not (math.isfinite(norm_v) and math.isfinite(loss_v)):
        return norm_v, False
    optimizer.step()
    return norm_v, True


def update_metrics(aux: dict, first: dict, norm: float, lr: float, tokens: int,
                   seconds: float) -> dict[str, float]:
    """backends/mlx/update.update_metrics' keys and formulas."""
    v = {k: float(x) for k, x in aux.items()}
    n = max(v["tokens"], 1.0)
    m = {
        "loss/total": v["loss"], "loss/policy": v["pg"], "policy/entropy": v["entropy"] / n,
        "policy/clipfrac": v["clipped"] / n, "policy/ratio_mean": v["ratio"] / n,
        "policy/approx_kl": v["approx_kl"] / n,
        "kl/sample_train": float(first["approx_kl"]) / max(float(first["tokens"]), 1.0),
        "optim/grad_norm": norm, "optim/lr": lr,
        "train/tokens": float(tokens), "train/tokens_per_sec": tokens / max(seconds, 1e-9),
    }
    m.update(correction.metrics({k: float(x) for k, x in first.items()}))
    if "kl" in v:
        m["kl/mean"] = v["kl"] / n
        m["loss/kl"] = v["kl_loss"]
    return m
