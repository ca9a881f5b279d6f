"""Backends: load a policy, generate, compute token log-probs, take an optimizer step.

`mlx` (Apple Silicon, and the CPU build on Linux) is the product. `torch` is a thin CUDA fallback
that runs the same loop. Nothing else differs between them.
"""
