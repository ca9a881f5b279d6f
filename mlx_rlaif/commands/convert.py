"""`mlx-rlaif convert`: a Hugging Face model (local directory or hub id) to MLX, optionally
quantized. A thin wrapper of `mlx_lm.convert.convert`: its progress lines drive a live status, and
the result is written to a temporary directory and renamed into place, so a failed conversion
leaves nothing behind. An existing non-empty --mlx-path is refused, never overwritten.

Not covered: mixed-bit recipes, uploading to the hub (use `mlx_lm.convert` for those).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from ..errors import UsageError
from ..terminal import text

HELP = "Convert a Hugging Face model to MLX, optionally quantized (wraps mlx_lm.convert)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf-path", required=True, metavar="PATH_OR_ID",
                   help="Hugging Face model: a local directory or a hub id.")
    p.add_argument("--mlx-path", required=True, metavar="DIR",
                   help="Where to write the MLX model (must not exist or be empty).")
    p.add_argument("-q", "--quantize", action="store_true", help="Quantize the weights.")
    p.add_argument("--q-bits", type=int, choices=(2, 3, 4, 5, 6, 8), default=None,
                   help="Bits per weight when quantizing (default 4).")
    p.add_argument("--q-group-size", type=int, choices=(32, 64, 128), default=None,
                   help="Quantization group size (default 64).")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default=None,
                   help="Type of the non-quantized weights (default: the model's torch_dtype).")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="Allow custom model code shipped with a hub model.")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..artifacts.atomic import check_out_dir

    out = check_out_dir(args.mlx_path, "--mlx-path")
    src = Path(args.hf_path).expanduser()
    if (src.exists() or args.hf_path.startswith((".", "/", "~"))) and not (
            src / "config.json").is_file():
        raise UsageError(f"--hf-path {args.hf_path} has no config.json: pass a Hugging Face "
                         "model directory or a hub id")
    if (args.q_bits or args.q_group_size) and not args.quantize:
        raise UsageError("--q-bits/--q-group-size need -q/--quantize: add -q")
    console = Console(stderr=True)
    convert_model(args.hf_path, out, args.quantize, args.q_bits, args.q_group_size, args.dtype,
                  args.trust_remote_code, console)
    what = f"{args.q_bits or 4}-bit" if args.quantize else (args.dtype or "unquantized")
    console.print(text("converted", style="green"),
                  text(f"{args.hf_path} -> {out} ({what}, {_size_mb(out):.1f} MB)"))
    return 0


def convert_model(hf_path: str, out: Path, quantize: bool, bits: int | None,
                  group_size: int | None, dtype: str | None, trust_remote_code: bool,
                  console) -> Path:
    """mlx_lm.convert into a temporary directory, renamed to `out` when it succeeded."""
    from mlx_lm.convert import convert

    from ..artifacts.atomic import atomic_dir

    with console.status(text(f"loading {hf_path}")) as status, atomic_dir(out) as tmp:
        lines = StatusWriter(lambda line: status.update(text(line.replace("[INFO] ", ""))))
        tmp.rmdir()  # mlx_lm.convert refuses an existing path
        try:
            with contextlib.redirect_stdout(lines):
                convert(hf_path, str(tmp), quantize=quantize, q_bits=bits,
                        q_group_size=group_size, dtype=dtype,
                        trust_remote_code=trust_remote_code)
        except Exception as e:  # hub, network, missing weights, unsupported architecture
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UsageError(f"cannot convert {hf_path} ({first}): pass a Hugging Face model "
                             "directory with config.json and safetensors, or a hub id") from e
        status.update(text(f"written {out}"))
    return out


class StatusWriter(io.TextIOBase):
    """A stdout stand-in that shows each complete printed line on a rich status."""

    def __init__(self, show) -> None:
        self._show = show
        self._buf = ""

    def write(self, s: str) -> int:
        self._buf += s
        *done, self._buf = self._buf.split("\n")
        for line in done:
            if line.strip():
                self._show(line.strip())
        return len(s)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
