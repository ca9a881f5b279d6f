"""The RL algorithm as pure functions: advantages from rewards, the loss aggregation weights, the
clipped objective and the KL estimators. No model, no backend: arrays and numbers in, arrays and
numbers out (numpy, or the `xp` array library the backend passes)."""
