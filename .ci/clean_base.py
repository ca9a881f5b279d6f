"""Exit 1, naming it, if this interpreter can import a package the test suite needs.

CI builds its test venv from an interpreter that passes: a test that leaves its venv for the base
interpreter must fail in CI as it fails on a fresh machine (issue 56)."""

import importlib.util
import sys

NEEDED = ("mlx", "mlx_lm", "torch", "transformers", "wheel")

found = [name for name in NEEDED if importlib.util.find_spec(name) is not None]
if found:
    print(f"{sys.executable} can import {', '.join(found)}")
    sys.exit(1)
