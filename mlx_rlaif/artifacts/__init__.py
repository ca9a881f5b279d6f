"""What a run leaves behind: checkpoints (atomic, resumable, loadable by mlx-lm), the LoRA
adapter format they share with mlx-lm, fused models and PEFT exports. Files only: nothing here
trains or samples."""
