"""What ships inside the package, so that `mlx-rlaif train` runs the quickstart from any
directory and from a plain `pip install`: the quickstart config and the tiny model it trains
(`tiny-coder/`, built by tools/make_tiny_model.py; the repository's `models/tiny-coder` and
`configs/quickstart.yaml` are links to these files).

A model path `builtin:NAME` names a model shipped here (today `builtin:tiny-coder`);
`resolve_model` turns it into this installation's directory. Checkpoints keep the `builtin:`
name, so they load on any machine that has the package.

Not covered: models downloaded at run time (mlx-lm's hub ids do that, where the network allows).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE / "quickstart.yaml"
PREFIX = "builtin:"
MODELS = ("tiny-coder",)


def resolve_model(path: str) -> str:
    """A model path as mlx-lm and transformers take it: `builtin:NAME` -> the shipped directory;
    anything else unchanged."""
    if not path.startswith(PREFIX):
        return path
    name = path[len(PREFIX):]
    if name not in MODELS:
        raise UsageError(f"model {path}: no such built-in model: use one of "
                         f"{', '.join(PREFIX + m for m in MODELS)}, a directory or a hub id")
    return str(HERE / name)


def model_source(path: str, hint: str = "pass a model directory (HF layout or `mlx-rlaif "
                 "convert` output), builtin:tiny-coder or a hub id") -> str:
    """`resolve_model(path)`, checked: a path that looks local must hold a config.json (a
    one-line error with `hint` otherwise); a hub id is left for the loader to fetch."""
    source = resolve_model(path)
    p = Path(source).expanduser()
    if (p.exists() or source.startswith((".", "/", "~"))) and not (p / "config.json").is_file():
        raise UsageError(f"model {path}: no config.json there: {hint}")
    return str(p) if p.exists() else source
