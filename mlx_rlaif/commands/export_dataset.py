"""`mlx-rlaif export-dataset RUN_DIR --out DIR [--push REPO]`: the run's collected completions as a
folder `datasets.load_dataset(DIR)` loads; pushed to the Hugging Face Hub only with --push."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..metrics import dataset

HELP = (
    "Write the run's collected dataset (train/validation/evaluation + card) to a folder; "
    "optionally push it to the Hugging Face Hub."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="The run's output directory (training.output_dir).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="Folder to write (created if missing; its split files are replaced).",
    )
    parser.add_argument(
        "--push",
        metavar="REPO",
        help="Also upload to this Hub dataset repo (token from HF_TOKEN or HUGGINGFACE_TOKEN).",
    )
    parser.add_argument("--private", action="store_true", help="Create the Hub repo as private.")


def run(args: argparse.Namespace) -> int:
    counts = dataset.export(args.run_dir, args.out)
    listed = ", ".join(f"{split} {n}" for split, n in counts.items())
    print(f"wrote {args.out}: {listed} records")
    if args.push:
        url = dataset.push(args.out, args.push, private=args.private)
        print(f"pushed to {url}")
    return 0
