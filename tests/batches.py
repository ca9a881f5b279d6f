"""Test helper: backends.batch's numpy micro-batch arrays as MLX arrays (as the MLX update
builds them)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def mx_batch(arrays: dict[str, np.ndarray]) -> dict[str, mx.array]:
    return {k: mx.array(v) for k, v in arrays.items()}
