"""The torch backend: the same loop on transformers + PEFT, for CUDA (then MPS, then CPU). A thin
fallback that mirrors the MLX backend's semantics and writes the same checkpoint format; it is
imported only when `model.backend: torch` is chosen (`policy.py` names a missing package)."""
