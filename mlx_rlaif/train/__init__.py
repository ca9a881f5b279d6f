"""Training: the run object (`run.py`), one RL step (`step.py`), the loop over steps
(`loop.py`), setting up and resuming a run (`trainer.py`), held-out evaluation (`evaluate.py`)
and the supervised warm start (`sft.py`). Calls the backends through `backends.ops.Ops` only."""

from .trainer import train

__all__ = ["train"]
