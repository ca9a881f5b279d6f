"""`mlx-rlaif export-gguf`: a run's adapters fused into the base and written as one GGUF file,
with an Ollama Modelfile and a model card beside it, for llama.cpp, Ollama and LM Studio.

The adapters are folded into float weights (a quantized base is dequantized first, and the
command says so); artifacts/gguf.py writes the file and artifacts/modelfile.py the Modelfile.
`--push REPO` uploads the folder to the Hugging Face Hub (artifacts/hub_push.py).
"""

from __future__ import annotations

import argparse

from .push import add_push_arguments, check_push, push_export

HELP = ("Fuse LoRA adapters into the base and write one GGUF file (+ Ollama Modelfile) for "
        "llama.cpp, Ollama and LM Studio.")

TYPE_CHOICES = ("f16", "bf16", "f32", "q8_0", "q4_0")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_DIR|CHECKPOINT",
                   help="A run directory (its newest checkpoint) or a checkpoint directory.")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="Where to write the GGUF, Modelfile and README.md (must not exist or "
                        "be empty).")
    p.add_argument("--type", default="f16", choices=TYPE_CHOICES,
                   help="Tensor type: f16 (default), bf16, f32, q8_0 (8-bit) or q4_0 (4-bit).")
    p.add_argument("--model", default=None, metavar="BASE",
                   help="Base model (default: base_model recorded in adapter_config.json).")
    p.add_argument("--name", default=None,
                   help="Model name in the file and the GGUF's file name (default: the base "
                        "model's directory name).")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="The Modelfile's system prompt (default: the run's model.system_prompt).")
    add_push_arguments(p)


def check(args: argparse.Namespace) -> None:
    check_push(args)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from ..artifacts import atomic, checkpoint, export_gguf

    out = atomic.check_out_dir(args.out)
    adapter_dir = checkpoint.resolve(args.path)
    base = checkpoint.base_model_of(adapter_dir, args.model)
    console = Console(stderr=True)
    with console.status(f"loading {base} + {adapter_dir.name}") as status:
        result = export_gguf.export(adapter_dir, base, Path(out), args.type, name=args.name,
                                    system=args.system, say=console.print,
                                    status=status.update)
    info = result.gguf
    console.print(f"[green]exported[/] {adapter_dir} fused into {base} -> {info.path} ("
                  f"{info.type}, {info.arch}, {info.tensors} tensors, "
                  f"{info.path.stat().st_size / 2**20:.1f} MiB) + Modelfile")
    console.print(f"  ollama create NAME -f {out}/Modelfile && ollama run NAME")
    pushed = push_export(args, out, "gguf", base, adapter_dir, card=False)  # card: written
    if pushed:
        console.print(pushed)
    return 0
