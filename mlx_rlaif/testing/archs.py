"""Tiny random-weight models of the architectures users bring, for tests (no hub, no download).

`make_arch_dir(path, model_type, dtype)` writes a model directory of one of `ARCHS` (mlx-lm's
model types: dense, mixture-of-experts, hybrid linear-attention / SSM / convolution, nested
`text_config`) that `mlx_lm.load` reads: config.json, random weights in `dtype` (float32,
bfloat16) and the toy tokenizer of `randmodel`. Every shape is the smallest the architecture
accepts: 2 layers (one of each kind where the architecture mixes them), width 64, vocabulary
512, 4 experts of which 2 are active.

Not covered: trained weights, the architectures' real sizes, vision towers (the text model
only), mlx-lm model types not in `ARCHS`.
"""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .randmodel import make_tokenizer

VOCAB = 512
_DENSE: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=4096,
                              rope_theta=10000.0, tie_word_embeddings=True)
_MOE: dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])

# model_type -> config.json (beside model_type); the text model's where it nests text_config
ARCHS: dict[str, dict[str, Any]] = {
    "qwen2": dict(_DENSE),
    "qwen3": dict(_DENSE),
    "llama": dict(_DENSE),
    "phi3": dict(_DENSE, tie_word_embeddings=False),
    "gemma3_text": dict(_DENSE, query_pre_attn_scalar=16, sliding_window=16,
                        sliding_window_pattern=2),
    "gemma2": dict(_DENSE, query_pre_attn_scalar=16),  # soft-capped logits: no head split
    "seed_oss": dict(_DENSE),
    "granite": dict(_DENSE, logits_scaling=2.0, attention_multiplier=0.25,
                    embedding_multiplier=4.0, residual_multiplier=0.5, attention_bias=False,
                    mlp_bias=False),
    "qwen3_moe": dict(_DENSE, **_MOE),
    "gpt_oss": dict(_DENSE, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention"]),
    "deepseek_v2": dict(_DENSE, moe_intermediate_size=32, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, kv_lora_rank=16,
                        q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8,
                        first_k_dense_replace=1,
                        rope_scaling={"type": "yarn", "factor": 1.0, "mscale_all_dim": 0,
                                      "original_max_position_embeddings": 4096}),
    "qwen3_next": dict(_DENSE, **_MOE, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                       shared_expert_intermediate_size=32, partial_rotary_factor=0.25,
                       full_attention_interval=2),
    "lfm2": dict(_DENSE, norm_eps=1e-5, conv_bias=False, conv_L_cache=3, block_dim=64,
                 block_ff_dim=128, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                 block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention"]),
    "nemotron_h": dict(_DENSE, attention_bias=False, mamba_num_heads=4, mamba_head_dim=16,
                       mamba_proj_bias=False, ssm_state_size=16, conv_kernel=4, n_groups=1,
                       mlp_bias=False, layer_norm_epsilon=1e-5, use_bias=False,
                       use_conv_bias=True, hybrid_override_pattern=["M", "*", "E"],
                       moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                       n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                       n_group=1, topk_group=1, norm_topk_prob=True,
                       routed_scaling_factor=1.0),
    "granitemoehybrid": dict(_DENSE, attention_bias=False, embedding_multiplier=4.0,
                             attention_multiplier=0.25, logits_scaling=2.0,
                             residual_multiplier=0.5, layer_types=["mamba", "attention"],
                             num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=64, mamba_n_heads=4, mamba_d_head=32,
                             mamba_proj_bias=False, mamba_d_state=16, mamba_d_conv=4,
                             mamba_n_groups=1, mamba_conv_bias=True),
    "qwen3_5": dict(text_config=dict(_DENSE, linear_num_value_heads=4, linear_num_key_heads=2,
                                     linear_key_head_dim=16, linear_value_head_dim=16,
                                     linear_conv_kernel_dim=4, full_attention_interval=2,
                                     model_type="qwen3_5_text")),
    "mistral3": dict(text_config=dict(_DENSE, model_type="ministral3", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
        "original_max_position_embeddings": 4096})),
}


def arch_config(model_type: str, tied: bool | None = None) -> dict[str, Any]:
    """config.json of the tiny `model_type` (with `tied`: its embeddings tied or not)."""
    if model_type not in ARCHS:
        raise UsageError(f"no tiny model of {model_type!r}: pick one of {', '.join(ARCHS)}")
    cfg = {"model_type": model_type, **copy.deepcopy(ARCHS[model_type]),
           "eos_token_id": 2, "bos_token_id": None}
    if tied is not None:
        cfg["tie_word_embeddings"] = tied
        if "text_config" in cfg:
            cfg["text_config"]["tie_word_embeddings"] = tied
    return cfg


def make_arch_dir(path: str | Path, model_type: str, dtype: str = "float32", seed: int = 0,
                  tied: bool | None = None) -> Path:
    """Write a random-weight tiny `model_type` model in `dtype` that `mlx_lm.load` reads."""
    import mlx.core as mx
    from mlx_lm.utils import save_model

    path = Path(path)
    cfg = arch_config(model_type, tied)
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(cfg))
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    make_tokenizer(path, VOCAB)
    save_model(path, model)
    cfg["torch_dtype"] = dtype
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
