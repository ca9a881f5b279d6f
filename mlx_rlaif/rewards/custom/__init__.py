"""Your own rewards: Python functions and HTTP reward servers as components of the reward,
next to the built-in exec, teacher and syntax rewards (docs/rewards.md).

`spec.py` loads a function and checks its signature (before any model loads), `contract.py`
holds what a function receives and what it may return, `worker.py` and `pool.py` run functions
in worker processes that are killed when one hangs, `client.py` is the HTTP client of a reward
server and `server.py` the server of `mlx-rlaif serve-reward`, `components.py` combines the
components into one reward.
"""
