"""The torch backend: the same RL loop on CUDA (or MPS, or CPU) with transformers + PEFT LoRA.

A thin fallback for machines without MLX acceleration. Each function mirrors one of the MLX path
(`backends/mlx.py`, `rollout.sample`, `losses.rl_loss`, `train.update` / `make_optimizer`,
`checkpoint.save_checkpoint`) with the same semantics, so one config trains the same way on both:

- LoRA: PEFT with `lora_alpha = scale * rank` (PEFT scales by alpha / r), `target_modules` = the
  `lora.keys` (empty: every linear layer of a block, as mlx-lm), the last `num_layers` blocks.
- reference: the same weights with the adapters off (`disable_adapter()`), no second copy.
- rollouts: `generate` with all P x G rows together (or `completion_batch_size` at a time), the
  model's own generation defaults ignored; top-p/top-k truncate the untempered distribution
  before the temperature, as mlx-lm's sampler does. The sampler's log-prob of each token is
  log_softmax(raw logits / T), before any truncation, from `output_logits`.
- loss and update: `losses.py`'s objective on the global weights of `batch.aggregation_weights`,
  gradients summed over micro-batches, `num_iterations` PPO epochs, norm clipping, non-finite
  steps skipped. The optimizer is `mlx.optimizers.AdamW`'s rule (no bias correction, mlx's
  default) with `train.make_optimizer`'s schedule: a learning rate tuned on a Mac means the same.
- checkpoints: `checkpoint.py`'s layout, written atomically, adapters in mlx-lm format
  (`mlx_lm.generate --adapter-path` loads them), optimizer state in `optimizer.pt`.
- prompts and EOS ids come from mlx-lm's tokenizer wrapper, so both backends see the same tokens.

Not covered: sharing a prompt's prefill across its group (each row prefills its prompt);
memory of `output_logits`, which holds [rows, new tokens, vocab] float32 logits until a generate
call ends (bound it with `generation.completion_batch_size` on large vocabularies); MLX-quantized
model directories (transformers needs the Hugging Face weights); multi-GPU; LoRA on embeddings or
expert layers; the AdamW moments of a checkpoint written by the MLX backend (weights load, moments
restart). Needs `pip install 'mlx-rlaif[cuda]'` (torch, transformers, peft).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import batch as batching
from .. import checkpoint
from ..config import LoraConfig
from ..errors import CheckpointError, UsageError
from ..export import mlx_from_peft, peft_weights
from ..records import Rollout, Task
from ..rollout import SamplingParams, prompt_formatter

try:
    import peft
    import safetensors.torch
    import torch
    import transformers
except ImportError as _e:
    raise UsageError(f"the torch backend needs torch, transformers and peft ({_e.name} is not "
                     "installed): pip install 'mlx-rlaif[cuda]'") from None

OPTIMIZER = "optimizer.pt"


@dataclass
class TorchPolicy:
    model: Any  # peft.PeftModel around a transformers causal LM
    tokenizer: Any  # mlx-lm's TokenizerWrapper: same chat template and EOS ids as the MLX path
    device: Any  # torch.device
    base_model: str
    num_layers: int
    lora: Any  # the LoraConfig-like object used (rank, scale, dropout, keys)


# --- loading ---------------------------------------------------------------------------------


def pick_device(device: str | None = None) -> torch.device:
    """`device` if given, else cuda > mps > cpu."""
    if device:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    return torch.device("mps" if mps is not None and mps.is_available() else "cpu")


def _local_dir(path: str) -> Path:
    from mlx_lm.utils import _download

    p = Path(path)
    if p.exists() or path.startswith((".", "/", "~")):
        if not (p / "config.json").is_file():
            raise UsageError(f"model {path}: no config.json there: pass a Hugging Face model "
                             "directory or a hub id")
        return p
    try:
        return _download(path)
    except Exception as e:  # hub errors
        raise UsageError(f"model {path} could not be downloaded ({type(e).__name__}): check the "
                         "hub id or pass a local directory") from e


def load_model(path: str, trust_remote_code: bool, device: torch.device) -> tuple[Any, Any]:
    """transformers' model (float32 off CUDA, the checkpoint's dtype on CUDA) and mlx-lm's
    tokenizer wrapper for it."""
    from mlx_lm.utils import load_config, load_tokenizer

    local = _local_dir(path)
    config = load_config(local)
    if "quantization" in config:
        raise UsageError(f"model {path} holds MLX-quantized weights, which transformers cannot "
                         "load: pass the original Hugging Face model to the torch backend")
    dtype = "auto" if device.type == "cuda" else torch.float32
    key = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(local), trust_remote_code=trust_remote_code, **{key: dtype})
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"model {path} could not be loaded by transformers "
                         f"({type(e).__name__}: {first}): check the path or hub id") from e
    # sampling is set on each call: the checkpoint's defaults (top_k, penalties) must not leak in
    model.generation_config = transformers.GenerationConfig()
    tokenizer = load_tokenizer(local, {"trust_remote_code": trust_remote_code},
                               eos_token_ids=config.get("eos_token_id"))
    return model.to(device), tokenizer


def _version(v: str) -> tuple[int, int]:
    major, minor = (v.split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _blocks(model: Any) -> Any:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise UsageError(f"{type(model).__name__} has no model.layers: the torch backend knows "
                         "Llama/Qwen/Mistral-style decoders only")
    return layers


def peft_config(lora: Any, num_layers: int, blocks: Sequence[Any]) -> peft.LoraConfig:
    """PEFT's LoraConfig for a LoRA config section, adapting the last `num_layers` blocks."""
    n = len(blocks)
    keys = list(lora.keys) or sorted({name for b in blocks for name, m in b.named_modules()
                                      if isinstance(m, torch.nn.Linear)})
    last = None if num_layers <= 0 or num_layers >= n else list(range(n - num_layers, n))
    return peft.LoraConfig(r=lora.rank, lora_alpha=lora.scale * lora.rank,
                           lora_dropout=lora.dropout, target_modules=keys,
                           layers_to_transform=last, layers_pattern="layers" if last else None,
                           bias="none", task_type="CAUSAL_LM")


def load_policy(model_path: str, lora_cfg: Any = None, adapter: str | Path | None = None,
                seed: int = 0, trust_remote_code: bool = False, device: str | None = None
                ) -> TorchPolicy:
    """Load the base model and add LoRA layers (from `adapter`, mlx-lm format, if given)."""
    dev = pick_device(device)
    base, tokenizer = load_model(model_path, trust_remote_code, dev)
    lora = lora_cfg or LoraConfig()
    num_layers = getattr(lora, "num_layers", -1)
    adapter_dir = checkpoint.resolve(adapter) if adapter else None
    if adapter_dir is not None:
        saved = checkpoint.load_adapter_config(adapter_dir)
        p = saved["lora_parameters"]
        lora = replace(LoraConfig(), rank=p["rank"], scale=p["scale"],
                       dropout=p.get("dropout", 0.0), keys=tuple(p.get("keys") or ()))
        num_layers = saved["num_layers"]
    blocks = _blocks(base)
    n = len(blocks)
    num_layers = n if num_layers in (-1, None) or num_layers > n else num_layers
    torch.manual_seed(seed)
    try:
        model = peft.get_peft_model(base, peft_config(lora, num_layers, blocks))
    except ValueError as e:
        raise UsageError(f"lora.keys: {str(e).splitlines()[0]}: name keys that exist in the model, "
                         "like self_attn.q_proj, or leave it empty for every linear layer") from e
    policy = TorchPolicy(model, tokenizer, dev, model_path, num_layers, lora)
    if adapter_dir is not None:
        load_adapters(policy, adapter_dir)
    model.eval()
    return policy


def adapter_config_for(policy: TorchPolicy) -> dict:
    return checkpoint.adapter_config(policy.lora, policy.base_model, policy.num_layers)


def mlx_adapters(policy: TorchPolicy) -> dict[str, torch.Tensor]:
    """The LoRA weights under mlx-lm's names and layout (lora_a [in, r], lora_b [r, out])."""
    state = peft.get_peft_model_state_dict(policy.model)
    weights, _ = mlx_from_peft(state, policy.model.peft_config["default"].to_dict())
    return {k: v.detach().float().contiguous().cpu() for k, v in weights.items()}


def load_adapters(policy: TorchPolicy, adapter_dir: Path) -> None:
    """Load mlx-lm-format adapters into a policy whose LoRA layers have the same shapes."""
    weights = safetensors.torch.load_file(str(Path(adapter_dir) / checkpoint.ADAPTERS))
    new = {k: v.contiguous() for k, v in peft_weights(weights).items()}
    have = peft.get_peft_model_state_dict(policy.model)
    missing = sorted(set(have) - set(new))
    wrong = sorted(k for k in new if k not in have or new[k].shape != have[k].shape)
    if missing or wrong:
        raise CheckpointError(f"{adapter_dir}: adapters do not match the model (first mismatch: "
                              f"{(missing + wrong)[0]}); use the same model and lora settings the "
                              "checkpoint was made with")
    peft.set_peft_model_state_dict(policy.model, new)


# --- log-probs and the loss ------------------------------------------------------------------


def token_logprobs(model: Any, tokens: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of tokens[:, 1:] given tokens[:, :-1] at `temperature` (float32 at least).

    tokens: [B, T] -> logp: [B, T-1] (and the entropy of each next-token distribution [B, T-1]).
    """
    logits = model(input_ids=tokens[:, :-1], use_cache=False).logits  # [B, T-1, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, tokens[:, 1:, None])[..., 0] - lse
    if not with_entropy:
        return logp, None
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(policy || ref) estimate: k1, k2 or k3 (see losses.py)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1.0


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      clip_low: float, clip_high: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss, the ratio, and where clipping was active. adv: [N] -> broadcast."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    unclipped = -a * ratio
    clipped = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), ratio, clipped > unclipped


def rl_loss(model: Any, mb: dict[str, torch.Tensor], rl: Any, kl_coef: float,
            temperature: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """losses.rl_loss in torch: (loss, aux of masked sums) for one micro-batch."""
    logp, entropy = token_logprobs(model, mb["tokens"], temperature, with_entropy=True)
    if rl.entropy_coef == 0:
        entropy = entropy.detach()
    mask, w, old = mb["mask"], mb["weights"], mb["old_logp"]
    pg, ratio, clipped = clipped_surrogate(logp, old, mb["adv"], rl.clip_low, rl.clip_high)
    per_token = pg - rl.entropy_coef * entropy
    aux = {"tokens": mask.sum(), "pg": (pg * w).sum(), "entropy": (entropy * mask).sum(),
           "clipped": (clipped * mask).sum(), "ratio": (ratio * mask).sum(),
           "approx_kl": (0.5 * (logp - old) ** 2 * mask).sum()}
    if "ref_logp" in mb:
        kl = kl_estimate(logp, mb["ref_logp"], rl.kl_estimator)
        per_token = per_token + kl_coef * kl
        aux["kl_loss"] = (kl * w).sum()
        aux["kl"] = ((logp - mb["ref_logp"]) * mask).sum()
    loss = (per_token * w).sum()
    aux["loss"] = loss
    return loss, {k: v.detach() for k, v in aux.items()}


def to_torch(mb: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """batch.build's arrays as torch tensors on `device` (tokens as int64)."""
    out = {k: torch.from_numpy(np.array(v)).to(device) for k, v in mb.items()}
    out["tokens"] = out["tokens"].long()
    return out


# --- rollouts --------------------------------------------------------------------------------


def _processors(params: SamplingParams) -> list[Any]:
    """mlx-lm's sampler order: top-p, then top-k, on the untempered distribution; then T."""
    from transformers.generation import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list[Any] = []
    if 0 < params.top_p < 1.0:
        out.append(TopPLogitsWarper(params.top_p))
    if params.top_k > 0:
        out.append(TopKLogitsWarper(params.top_k))
    if params.temperature != 1.0:
        out.append(TemperatureLogitsWarper(params.temperature))
    return out


def _generate_rows(policy: TorchPolicy, rows: Sequence[list[int]], params: SamplingParams,
                   eos: Sequence[int]) -> list[tuple[list[int], list[float], str]]:
    """One generate call over left-padded prompt rows: (tokens, logprobs, finish) per row."""
    pad = policy.tokenizer.pad_token_id
    pad = eos[0] if pad is None else pad
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    gen = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0,
        max_new_tokens=params.max_new_tokens, min_new_tokens=0, num_return_sequences=1,
        eos_token_id=list(eos), pad_token_id=pad, output_logits=True,
        return_dict_in_generate=True)
    with torch.no_grad():
        out = policy.model.generate(
            input_ids=ids.to(policy.device), attention_mask=mask.to(policy.device),
            generation_config=gen,
            logits_processor=transformers.LogitsProcessorList(_processors(params)))
        new = out.sequences[:, width:]  # [n, S]
        lp = torch.stack([  # log_softmax(raw / T)[token], step by step: [n, S]
            torch.log_softmax(step.float() / params.temperature, dim=-1)
            .gather(1, new[:, t, None])[:, 0] for t, step in enumerate(out.logits)], dim=1)
    return [_cut(toks, lps, set(eos)) for toks, lps in zip(new.tolist(), lp.tolist(),
                                                            strict=True)]


def _cut(tokens: list[int], logprobs: list[float], eos: set[int]
         ) -> tuple[list[int], list[float], str]:
    """Up to and including the first EOS ("stop"); all of it otherwise ("length")."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], "stop"
    return tokens, logprobs, "length"


def sample(policy: TorchPolicy, tasks: Sequence[Task], params: SamplingParams, group_size: int,
           format: Callable[[Task], list[int]] | None = None, seed: int | None = None
           ) -> tuple[list[Rollout], dict]:
    """Rollouts for `tasks` (P) with `group_size` (G) completions each, prompt-major (P x G);
    the same records and stats keys as rollout.sample. `seed` seeds torch's generator first."""
    tok = policy.tokenizer
    fmt = format or prompt_formatter(tok)
    prompts_P = [fmt(t) for t in tasks]
    eos = sorted(getattr(tok, "eos_token_ids", None) or {tok.eos_token_id})
    if seed is not None:
        torch.manual_seed(seed)
    rows = [p for p in prompts_P for _ in range(group_size)]
    policy.model.eval()
    tic, seqs, widths = time.perf_counter(), [], []
    for s in batching.chunks(len(rows), params.completion_batch_size):
        seqs += _generate_rows(policy, rows[s], params, eos)
        widths.append(s.stop - s.start)
    seconds = time.perf_counter() - tic
    ntok = sum(len(t) for t, _, _ in seqs)
    stats = {"gen/tokens": float(ntok), "gen/seconds": seconds,
             "gen/tokens_per_sec": ntok / seconds if seconds > 0 else 0.0,
             "gen/decode_width": float(max(widths, default=0)),
             "gen/decode_width_mean": float(np.mean(widths)) if widths else 0.0}
    eos_set = set(eos)
    rollouts = []
    for i, (toks, lps, finish) in enumerate(seqs):
        p = i // group_size
        rollouts.append(Rollout(
            task=tasks[p], prompt_tokens=tuple(prompts_P[p]), tokens=tuple(toks),
            logprobs=tuple(lps), text=tok.decode([t for t in toks if t not in eos_set]),
            finish_reason=finish, temperature=params.temperature))
    return rollouts, stats


def reference_logprobs(policy: TorchPolicy, rollouts: list[Rollout], cfg: Any
                       ) -> list[np.ndarray]:
    """Log-probs of each completion under the frozen base (same weights, adapters off)."""
    out: list[np.ndarray] = []
    zeros = [0.0] * len(rollouts)
    with torch.no_grad(), policy.model.disable_adapter():
        for s in batching.chunks(len(rollouts), cfg.training.micro_batch_size):
            b = to_torch(batching.build(rollouts[s], zeros[s], zeros[s]), policy.device)
            logp = token_logprobs(policy.model, b["tokens"], cfg.generation.temperature)[0]
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
    """train.make_optimizer's learning rate at each update: linear warmup from lr * 1e-3, then
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
           adv: np.ndarray, ref: list[np.ndarray] | None, cfg: Any, kl_coef: float,
           skipped: int) -> tuple[dict[str, float], int]:
    """`num_iterations` optimizer updates on the kept rollouts, micro-batched, as train.update.
    Returns the metrics and the new count of skipped (non-finite) updates."""
    if not rollouts:
        return {"optim/skipped": float(skipped), "train/tokens": 0.0}, skipped
    lengths = [len(r.tokens) for r in rollouts]
    w = batching.aggregation_weights(lengths, cfg.rl.loss_agg, cfg.generation.max_new_tokens)
    mbs = [to_torch(batching.build(rollouts[s], adv[s], w[s], ref[s] if ref is not None else None),
                    policy.device)
           for s in batching.chunks(len(rollouts), cfg.training.micro_batch_size)]
    model, tic, first = policy.model, time.perf_counter(), None
    model.train(cfg.lora.dropout > 0)  # dropout (if any) only inside the update
    try:
        for _ in range(cfg.rl.num_iterations):
            optimizer.zero_grad(set_to_none=True)
            aux: dict[str, torch.Tensor] = {}
            for mb in mbs:
                loss, a = rl_loss(model, mb, cfg.rl, kl_coef, cfg.generation.temperature)
                loss.backward()
                aux = {k: aux[k] + a[k] for k in aux} if aux else a
            first = first or aux
            norm, ok = apply_update(optimizer, aux["loss"], cfg.training.max_grad_norm)
            skipped += not ok
    finally:
        model.train(False)
    seconds = time.perf_counter() - tic
    tokens = sum(lengths) * cfg.rl.num_iterations
    lr = float(optimizer.param_groups[0]["lr"])
    return update_metrics(aux, first, norm, lr, skipped, tokens, seconds), skipped


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


def update_metrics(aux: dict, first: dict, norm: float, lr: float, skipped: int, tokens: int,
                   seconds: float) -> dict[str, float]:
    """train.update_metrics' keys and formulas."""
    v = {k: float(x) for k, x in aux.items()}
    n = max(v["tokens"], 1.0)
    m = {
        "loss/total": v["loss"], "loss/policy": v["pg"], "policy/entropy": v["entropy"] / n,
        "policy/clipfrac": v["clipped"] / n, "policy/ratio_mean": v["ratio"] / n,
        "policy/approx_kl": v["approx_kl"] / n,
        "kl/sample_train": float(first["approx_kl"]) / max(float(first["tokens"]), 1.0),
        "optim/grad_norm": norm, "optim/skipped": float(skipped), "optim/lr": lr,
        "train/tokens": float(tokens), "train/tokens_per_sec": tokens / max(seconds, 1e-9),
    }
    if "kl" in v:
        m["kl/mean"] = v["kl"] / n
        m["loss/kl"] = v["kl_loss"]
    return m


# --- checkpoints -----------------------------------------------------------------------------


def save_checkpoint(policy: TorchPolicy, optimizer: torch.optim.Optimizer | None,
                    run_dir: Path, name: str, state: checkpoint.LoopState,
                    extra_json: dict[str, Any] | None = None, config_text: str | None = None
                    ) -> Path:
    """checkpoint.save_checkpoint's layout (adapters in mlx-lm format), written atomically."""

    def weights(tmp: Path) -> None:
        safetensors.torch.save_file(mlx_adapters(policy), str(tmp / checkpoint.ADAPTERS),
                                    metadata={"format": "mlx"})
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER)

    return checkpoint.write_checkpoint(run_dir, name, weights, adapter_config_for(policy), state,
                                       extra_json, config_text)


def restore(policy: TorchPolicy, optimizer: torch.optim.Optimizer, ckpt: Path
            ) -> checkpoint.LoopState:
    """Adapters, optimizer state (when the checkpoint has optimizer.pt) and loop state."""
    load_adapters(policy, Path(ckpt))
    path = Path(ckpt) / OPTIMIZER
    if path.is_file():
        optimizer.load_state_dict(torch.load(path, map_location=policy.device, weights_only=True))
    return checkpoint.load_state(Path(ckpt))
