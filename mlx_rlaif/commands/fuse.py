"""`mlx-rlaif fuse`: fold a run's LoRA adapters into its base model and write an MLX model that
`mlx_lm.load`, `mlx_lm.generate` and `mlx_lm.server` serve without adapters.

The output keeps the base's precision unless --dequantize (float) or --quantize BITS says
otherwise; adapters are always folded into dequantized weights, and a quantized result that would
lose the adapter in rounding is refused (see mlx_rlaif/artifacts/fuse.py).
"""

from __future__ import annotations

import argparse
import contextlib

from ..artifacts import checkpoint
from ..errors import UsageError
from .convert import StatusWriter
from .push import add_push_arguments, check_push, push_export

HELP = "Fuse LoRA adapters into the base model (optionally quantized) for mlx_lm.generate/server."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                   help="A run directory (its newest checkpoint) or a checkpoint directory.")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="Where to write the fused model (must not exist or be empty).")
    p.add_argument("--model", default=None, metavar="BASE",
                   help="Base model (default: base_model recorded in adapter_config.json).")
    p.add_argument("--quantize", type=int, choices=(4, 8), default=None, metavar="{4,8}",
                   help="Quantize the fused model to 4 or 8 bits.")
    p.add_argument("--q-group-size", type=int, choices=(32, 64, 128), default=None,
                   help="Group size with --quantize (default 64).")
    p.add_argument("--dequantize", action="store_true",
                   help="Write float weights even when the base model is quantized.")
    p.add_argument("--min-adapter-corr", type=float, default=None, metavar="C",
                   help="Refuse a quantized result whose weights apply the LoRA update with a "
                        "correlation below C (default 0.5; 0 disables the check).")
    add_push_arguments(p)


def check(args: argparse.Namespace) -> None:
    check_push(args)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..artifacts import atomic, fuse
    from ..terminal import text

    out = atomic.check_out_dir(args.out)
    if args.q_group_size and not args.quantize:
        raise UsageError("--q-group-size needs --quantize 4|8: add --quantize")
    adapter_dir = checkpoint.resolve(args.path)
    base = checkpoint.base_model_of(adapter_dir, args.model)
    min_corr = fuse.MIN_CORRELATION if args.min_adapter_corr is None else args.min_adapter_corr
    console = Console(stderr=True)
    with console.status(text(f"loading {base} + {adapter_dir.name}")) as status:
        model, tokenizer, config = fuse.load_with_adapters(base, adapter_dir)
        q = fuse.quantization_for(model, config, args.quantize, args.dequantize,
                                  args.q_group_size)
        status.update("fusing" + (f" and quantizing to {q.bits} bits" if q.bits else ""))
        with contextlib.redirect_stdout(StatusWriter(lambda s: status.update(text(s)))):
            fused, cfg, corr = fuse.fuse(model, config, q, min_corr)
        status.update(text(f"writing {out}"))
        fuse.save_model_dir(out, fused, tokenizer, cfg, base)
    precision = f"{q.bits}-bit" if q.bits else "float"
    kept = "adapters are zero" if corr is None else f"adapter correlation {corr:.3f}"
    console.print(text("fused", style="green"),
                  text(f"{adapter_dir} into {base} -> {out} ({precision}, {kept})"))
    pushed = push_export(args, out, "mlx", base, adapter_dir)
    if pushed:
        console.print(text(pushed))
    return 0
