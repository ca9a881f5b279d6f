"""The torch backend: the same RL loop on CUDA (or MPS, or CPU) with transformers + PEFT LoRA.

A thin fallback for machines without MLX acceleration, in three modules that mirror the MLX path
with the same semantics, so one config trains the same way on both:

- this module (`backends/mlx/policy.py`, `artifacts/checkpoint.py`): loading and LoRA, PEFT with
  `lora_alpha = scale * rank` (PEFT scales by alpha / r), `target_modules` = the `lora.keys`
  (empty: every linear layer of a block, as mlx-lm), the last `num_layers` blocks; log-probs;
  checkpoints in `checkpoint.py`'s layout, written atomically, adapters in mlx-lm format
  (`mlx_lm.generate --adapter-path` loads them), optimizer state in `optimizer.pt`. Prompts and
  EOS ids come from mlx-lm's tokenizer wrapper, so both backends see the same tokens.
- `rollout.py` (`backends/mlx/rollout.py`): rollouts.
- `update.py` (`backends/mlx/loss.py`, `backends/mlx/update.py`): the reference (the same
  weights with the adapters off, `disable_adapter()`, no second copy), the loss, the optimizer
  and the update.

Not covered: MLX-quantized model directories (transformers needs the Hugging Face weights);
the memory plan (MLX only: the micro-batch size and `training.grad_checkpoint: on` are taken as
set, `auto` is off); multi-GPU; LoRA on embeddings or expert layers; the AdamW moments of a
checkpoint written by the MLX backend (weights load, moments restart). Needs
`pip install 'mlx-rlaif[torch]'` (torch, transformers, peft).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ...artifacts import checkpoint
from ...artifacts.lora import LoraSpec, adapter_config, spec_of
from ...artifacts.peft import mlx_from_peft, peft_weights
from ...assets import model_source
from ...errors import CheckpointError, UsageError

try:
    import peft
    import safetensors.torch
    import torch
    import transformers
except ImportError as _e:
    raise UsageError(f"the torch backend needs torch, transformers and peft ({_e.name} is not "
                     "installed): pip install 'mlx-rlaif[torch]'") from None

OPTIMIZER = "optimizer.pt"


@dataclass
class TorchPolicy:
    model: Any  # peft.PeftModel around a transformers causal LM
    tokenizer: Any  # mlx-lm's TokenizerWrapper: same chat template and EOS ids as the MLX path
    device: Any  # torch.device
    base_model: str
    num_layers: int
    lora: Any  # the LoraConfig-like object used (rank, scale, dropout, keys)
    split: tuple[Any, Any] | None = None  # (transformer, head): chunked log-probs (split_head)


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

    source = model_source(path, "pass a Hugging Face model directory, builtin:tiny-coder or a "
                                "hub id")
    if Path(source).is_dir():
        return Path(source)
    try:
        return _download(source)
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


@contextmanager
def checkpointed_blocks(model: Any, on: bool) -> Iterator[None]:
    """Inside, each transformer block's forward runs under `torch.utils.checkpoint`
    (non-reentrant): the backward pass keeps each block's input and recomputes the rest
    (`training.grad_checkpoint: on`, as the MLX update's). Not transformers'
    `gradient_checkpointing_enable`: that acts only in training mode, which would also turn on
    the base model's own dropout; here the train/eval mode is untouched, so dropout stays as
    the update sets it (LoRA's only). `on` False: nothing changes."""
    if not on:
        yield
        return
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = list(_blocks(lm))
    for block in blocks:  # an instance attribute: nn.Module.__call__ looks it up first
        block.forward = partial(torch.utils.checkpoint.checkpoint, type(block).forward.__get__(
            block), use_reentrant=False)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward


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
    lora = lora_cfg or LoraSpec()
    num_layers = getattr(lora, "num_layers", -1)
    adapter_dir = checkpoint.resolve(adapter) if adapter else None
    if adapter_dir is not None:
        lora, num_layers = spec_of(checkpoint.load_adapter_config(adapter_dir))
    blocks = _blocks(base)
    n = len(blocks)
    num_layers = n if num_layers in (-1, None) or num_layers > n else num_layers
    torch.manual_seed(seed)
    try:
        model = peft.get_peft_model(base, peft_config(lora, num_layers, blocks))
    except ValueError as e:
        raise UsageError(f"lora.keys: {str(e).splitlines()[0]}: name keys that exist in the model, "
                         "like self_attn.q_proj, or leave it empty for every linear layer") from e
    policy = TorchPolicy(model, tokenizer, dev, model_path, num_layers, lora, split_head(model))
    if adapter_dir is not None:
        load_adapters(policy, adapter_dir)
    model.eval()
    return policy


def adapter_config_for(policy: TorchPolicy) -> dict:
    return adapter_config(policy.lora, policy.base_model, policy.num_layers)


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


# --- log-probs ----------------------------------------------------------------------


LOGITS_CHUNK_MB = 64  # the float32 logits of one chunk of positions, at most (as the MLX loss)


def _stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[..., None])[..., 0] - lse
    return logp, lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def split_head(model: Any) -> tuple[Any, Any] | None:
    """(transformer, output head) of a (PEFT-wrapped) causal LM whose logits are exactly
    head(transformer(x)) (checked on 2 tokens); None for other layouts (logit scaling,
    soft-capping)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = getattr(lm, "model", None), lm.get_output_embeddings()
    if body is None or head is None:
        return None
    x = torch.tensor([[1, 2]], device=lm.device)
    with torch.no_grad():
        full = lm(input_ids=x, use_cache=False).logits
        parts = head(body(input_ids=x, use_cache=False).last_hidden_state)
    return (body, head) if torch.allclose(full, parts, rtol=1e-4, atol=1e-4) else None


def token_logprobs(model: Any, tokens: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False, split: tuple[Any, Any] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of tokens[:, 1:] given tokens[:, :-1] at `temperature` (float32 at least).
    With `split` (`split_head`) and logits larger than LOGITS_CHUNK_MB, the head runs a chunk
    of positions at a time under `torch.utils.checkpoint`, so the vocabulary-sized memory is one
    chunk's, forward and backward.

    tokens: [B, T] -> logp: [B, T-1] (and the entropy of each next-token distribution [B, T-1]).
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    size = (max(1, (LOGITS_CHUNK_MB << 20) // (4 * split[1].out_features))
            if split is not None else 0)
    if split is None or targets.numel() <= size:
        logp, ent = _stats(model(input_ids=inputs, use_cache=False).logits, targets, temperature)
        return logp, (ent if with_entropy else None)
    body, head = split
    hidden = body(input_ids=inputs, use_cache=False).last_hidden_state  # [B, T-1, D]
    b, t, d = hidden.shape
    flat_h, flat_t = hidden.reshape(b * t, d), targets.reshape(b * t)
    parts = [torch.utils.checkpoint.checkpoint(
        lambda h, y: _stats(head(h), y, temperature), flat_h[i: i + size], flat_t[i: i + size],
        use_reentrant=False) for i in range(0, b * t, size)]
    logp = torch.cat([p[0] for p in parts]).reshape(b, t)
    ent = torch.cat([p[1] for p in parts]).reshape(b, t)
    return logp, (ent if with_entropy else None)


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
