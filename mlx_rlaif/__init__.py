"""mlx-rlaif: RL from AI feedback for code models, in MLX, in one process on one set of weights."""

__version__ = "0.1.0"
