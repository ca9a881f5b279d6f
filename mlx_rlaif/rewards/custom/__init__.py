"""Your own rewards: Python functions and HTTP reward servers as components of the reward,
next to the built-in exec, teacher and syntax rewards (docs/rewards.md).

`spec.py` loads a function and checks its signature (before any model loads), `contract.py`
holds what a function receives and what it may return, `worker.py` and `pool.py` run functions
in worker processes that are killed when one hangs, `server.py` is the HTTP client and the
server of `mlx-rlaif serve-reward`, `components.py` combines the components into one reward.
"""
