"""`--push REPO` for the commands that export a model (fuse, export-peft, export-gguf): the flags,
their check, and the upload of the output folder with its model card (artifacts/hub_push.py).
Not a subcommand."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError


def add_push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--push", default=None, metavar="REPO",
                   help="Also upload the output folder, with a model card, to this Hugging Face "
                        "model repo (OWNER/NAME; token from HF_TOKEN or HUGGINGFACE_TOKEN; "
                        "private unless --public).")
    p.add_argument("--public", action="store_true", help="With --push: create the repo public.")


def check_push(args: argparse.Namespace) -> None:
    if args.public and not args.push:
        raise UsageError("--public needs --push REPO: add --push")
    if args.push and (args.push.count("/") != 1 or not all(args.push.split("/"))):
        raise UsageError(f"--push {args.push}: name the repo as OWNER/NAME")


def push_export(args: argparse.Namespace, out: Path, kind: str, base: str,
                adapter_dir: Path, card: bool = True) -> str | None:
    """With --push: the model card into `out` (when `card`), then the upload. Returns the line
    to print, or None without --push."""
    if not args.push:
        return None
    from ..artifacts import hub_push

    if card:
        hub_push.write_card(Path(out), kind, base, adapter_dir)
    url = hub_push.push(Path(out), args.push, private=not args.public, what=f"{kind} model")
    return f"pushed {out} to {url} ({'public' if args.public else 'private'})"
