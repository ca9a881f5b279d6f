"""The check every exact-resume test makes: the adapters a resumed run ends with equal those
the uninterrupted run wrote at the same step."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_rlaif.artifacts import checkpoint


def assert_resumed_equals_straight(straight: Path, resumed: Path, step: int) -> None:
    """`straight`'s checkpoint of global step `step` against `resumed`'s newest one."""
    a = mx.load(str(next(p for p in checkpoint.list_checkpoints(straight)
                         if p.name.endswith(f"gs{step}")) / checkpoint.ADAPTERS))
    b = mx.load(str(checkpoint.latest_checkpoint(resumed) / checkpoint.ADAPTERS))
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(np.array(b[k]), np.array(a[k]), rtol=1e-5, atol=1e-7)
