"""`mlx-rlaif export-peft`: a run's LoRA adapters in Hugging Face PEFT format
(`adapter_model.safetensors` + `adapter_config.json`), for transformers/peft and vLLM.

A pure renaming and transposition of the adapter tensors (see mlx_rlaif/artifacts/peft.py): the base
model is not loaded.
"""

from __future__ import annotations

import argparse

from .push import add_push_arguments, check_push, push_export

HELP = "Export LoRA adapters in PEFT format (adapter_model.safetensors, Hugging Face names)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                   help="A run directory (its newest checkpoint) or a checkpoint directory.")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="Where to write the PEFT adapter (must not exist or be empty).")
    p.add_argument("--base-name", default=None, metavar="NAME",
                   help="base_model_name_or_path to record, e.g. the hub id of the model "
                        "(default: base_model from adapter_config.json).")
    add_push_arguments(p)


def check(args: argparse.Namespace) -> None:
    check_push(args)


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from ..artifacts import peft
    from ..terminal import text, visible

    out = peft.export_peft(args.path, args.out, args.base_name)
    cfg = json.loads((out / peft.PEFT_CONFIG).read_text())
    Console(stderr=True).print(text("exported", style="green"), text(
        f"PEFT adapter -> {out} (r={cfg['r']}, lora_alpha={cfg['lora_alpha']}, "
        f"target_modules={','.join(cfg['target_modules'])}, base {cfg['base_model_name_or_path']})"))
    from ..artifacts import checkpoint

    pushed = push_export(args, out, "peft", cfg["base_model_name_or_path"],
                         checkpoint.resolve(args.path))
    if pushed:
        print(visible(pushed, lines=False))
    return 0
