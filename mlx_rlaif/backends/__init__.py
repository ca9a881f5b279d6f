"""Backends: load a policy, sample rollouts, compute the reference log-probs, take optimizer
steps, save and restore. `ops.py` picks one per run (`model.backend`); the loop calls only it.

`mlx/` (Apple silicon, and the CPU build on Linux) is the product; `torch/` is a thin CUDA
fallback that runs the same loop. `batch.py` and `sampling.py` are what both share. Backends
receive explicit inputs and return numbers: nothing here knows the training loop's run object.
"""
