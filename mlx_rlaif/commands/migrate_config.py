"""`mlx-rlaif migrate-config OLD.yaml`: the seed trainer's config file in our layout.

Prints (or writes with `--out`) the YAML our loader builds from the file: the keys that map,
moved to their place, and as comments above them one line per key that no longer applies and
why. Keys with no equivalent stop with a one-line error (exit 2). The result is checked by
loading it, so what is printed is a config `mlx-rlaif train --config` accepts.

Not covered: comments of the old file (YAML loses them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

HELP = "Print the seed trainer's config.yaml in mlx-rlaif's layout (what maps, what no longer applies)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OLD.yaml", help="the seed trainer's config file")
    p.add_argument("--out", default=None, help="write the new config here (default: stdout)")


def migrated(path: str) -> str:
    """The new config's text: notes as comments, then the translated keys."""
    from ..config import from_dict
    from ..config.loading import read_yaml
    from ..config.seed import translate

    raw, notes = translate(read_yaml(Path(path)))
    from_dict(raw)  # what we print must load
    head = [f"# migrated from {path} by mlx-rlaif migrate-config"]
    head += [f"# {n}" for n in notes]
    body = yaml.safe_dump(raw, sort_keys=False) if raw else "{}\n"
    return "\n".join(head) + "\n" + body


def run(args: argparse.Namespace) -> int:
    text = migrated(args.path)
    if args.out:
        from ..artifacts.atomic import write_text_atomic

        write_text_atomic(Path(args.out), text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
