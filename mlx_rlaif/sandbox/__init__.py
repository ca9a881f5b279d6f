"""Running untrusted code: one command in isolation (`box.py`: limits, modes, the verdict's
plumbing), what each mode needs from the host (`modes.py`; the macOS profile: `seatbelt.py`),
the trusted first code inside every run (`launcher.py`), and the hostile self-test `mlx-rlaif
doctor` runs (`selftest.py`). See box.py for what each mode does and does not cover."""

from .box import Box, Limits, Running, RunResult, Sandbox, SandboxError

__all__ = ["Box", "Limits", "RunResult", "Running", "Sandbox", "SandboxError"]
