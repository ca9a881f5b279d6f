"""`mlx-rlaif export-gguf`: a run's adapters fused into the base and written as one GGUF file,
with an Ollama Modelfile and a model card beside it, for llama.cpp, Ollama and LM Studio.

The adapters are folded into float weights (a quantized base is dequantized first, and the
command says so); artifacts/gguf.py writes the file and artifacts/modelfile.py the Modelfile.
`--push REPO` uploads the folder to the Hugging Face Hub (artifacts/hub_push.py). `--name` is
checked before anything loads (letters, digits, '.', '_', '-': a file name in --out, never a
path); what it prints (paths, the base model recorded in adapter_config.json) goes through
terminal.text: no control characters, no rich markup read.
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
                   help="Model name in the file and the GGUF's file name: 1-64 letters, digits, "
                        "'.', '_' or '-' (default: the base model's directory name).")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="The Modelfile's system prompt (default: the run's model.system_prompt).")
    add_push_arguments(p)


def check(args: argparse.Namespace) -> None:
    from ..artifacts.modelfile import check_name

    if args.name is not None:
        check_name(args.name)
    check_push(args)


def ollama_hint(out: object) -> str:
    """The command that loads the export into Ollama, the path shell-quoted (copied and pasted
    as it is printed)."""
    import shlex

    return f"ollama create NAME -f {shlex.quote(f'{out}/Modelfile')} && ollama run NAME"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from ..artifacts import atomic, checkpoint, export_gguf
    from ..terminal import text

    out = atomic.check_out_dir(args.out)
    adapter_dir = checkpoint.resolve(args.path)
    base = checkpoint.base_model_of(adapter_dir, args.model)
    console = Console(stderr=True)

    def say(line: str) -> None:  # paths, the base's name, its config's values: shown as text
        console.print(text(line))

    with console.status(text(f"loading {base} + {adapter_dir.name}")) as status:
        result = export_gguf.export(adapter_dir, base, Path(out), args.type, name=args.name,
                                    system=args.system, say=say,
                                    status=lambda line: status.update(text(line)))
    info = result.gguf
    console.print(text("exported", style="green"), text(
        f"{adapter_dir} fused into {base} -> {info.path} ({info.type}, {info.arch}, "
        f"{info.tensors} tensors, {info.path.stat().st_size / 2**20:.1f} MiB) + Modelfile"))
    say(f"  {ollama_hint(out)}")
    pushed = push_export(args, out, "gguf", base, adapter_dir, card=False)  # card: written
    if pushed:
        say(pushed)
    return 0
