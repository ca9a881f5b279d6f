"""The MLX backend, the product: one model whose LoRA adapters train in place, sampled with its
adapters on (`rollout.py`, `decode.py`), scored with them off as the KL reference (`policy.py`),
with each prompt computed once per group (`shared_prompt.py`), and updated by the compiled,
micro-batched policy-gradient step (`loss.py`, `update.py`)."""
