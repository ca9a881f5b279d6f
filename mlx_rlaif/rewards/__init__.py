"""Rewards: score a batch of (task, completion) pairs into Reward records.

The interface is `RewardFn` (base.py). Built-ins: `syntax` (Python parses), `exec` (sandboxed
tests), teacher judges, and `mix` (a weighted sum). `build_reward(cfg)` picks from config.
"""
