"""Which of MLX's backend builds this environment holds, read from the installed distributions'
metadata (no MLX import, so it also runs where MLX cannot load).

MLX's Python front end (`mlx`) needs exactly one backend library: `mlx-metal` on macOS (mlx
itself pulls it in), and on Linux one of `mlx-cpu`, `mlx-cuda-12`, `mlx-cuda-13`, chosen by this
package's extras `cpu`, `cuda12`, `cuda13`. The Linux builds all install `mlx/lib/libmlx.so`, so
two of them in one environment overwrite each other's library (which one wins depends on the
install order): `backend_problem` names that, and a Linux install with none.

Not covered: checking the CUDA driver or the GPU (MLX's own error says what is wrong there), and
builds of MLX from source (no backend distribution is installed: reported as none, with the
import's own error beside it by the caller).
"""

from __future__ import annotations

import sys
from importlib import metadata

BACKENDS = {"mlx-metal": "Metal", "mlx-cpu": "CPU", "mlx-cuda-12": "CUDA 12",
            "mlx-cuda-13": "CUDA 13"}
EXTRA = {"mlx-cpu": "cpu", "mlx-cuda-12": "cuda12", "mlx-cuda-13": "cuda13"}
INSTALL_LINES = (
    "macOS (Apple silicon): pip install mlx-rlaif",
    "Linux, CPU: pip install 'mlx-rlaif[cpu]'",
    "Linux, NVIDIA GPU (CUDA 13 driver): pip install 'mlx-rlaif[cuda13]' (CUDA 12: [cuda12])",
)


def installed_backends() -> dict[str, str]:
    """{distribution: version} of MLX's backend builds installed here."""
    found = {}
    for name in BACKENDS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def mixed_builds(found: dict[str, str]) -> str | None:
    """One line naming two Linux backend builds installed together, with the fix (None
    otherwise)."""
    linux = sorted(n for n in found if n != "mlx-metal")
    if len(linux) < 2:
        return None
    named = " and ".join(f"{n} {found[n]}" for n in linux)
    return (f"MLX's builds {named} are both installed and overwrite each other's "
            f"mlx/lib/libmlx.so: pip uninstall -y {' '.join(linux)}, then reinstall the one you "
            "want, e.g. pip install 'mlx-rlaif[cuda13]' (NVIDIA) or 'mlx-rlaif[cpu]'")


def backend_problem(found: dict[str, str], platform: str = sys.platform) -> str | None:
    """One line naming what is wrong with the installed backend builds `found` (two builds, or
    none on Linux), with the fix; None when they are right for `platform` (sys.platform's
    value)."""
    mixed = mixed_builds(found)
    if mixed:
        return mixed
    if platform.startswith("linux") and not any(n != "mlx-metal" for n in found):
        return ("no MLX backend is installed (MLX's front end needs one on Linux): pip install "
                "'mlx-rlaif[cpu]', or 'mlx-rlaif[cuda13]' on an NVIDIA GPU")
    return None
