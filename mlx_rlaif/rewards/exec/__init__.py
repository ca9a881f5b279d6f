"""The exec reward: the student's code run against the task's tests in a sandbox. `reward.py`
runs the processes, `tasks.py` holds the pure parts (formats, checks, the Reward), `harness.py`
is the code that runs inside the sandboxes."""

from .reward import ExecReward

__all__ = ["ExecReward"]
