"""The `mlx-rlaif` command line. Subcommands only parse arguments and call the library.

Each subcommand is a module in `mlx_rlaif.commands` with `HELP`, `add_arguments(parser)` and
`run(args) -> int`, and optionally `check(args)`: a cheap validation (the config, say) that runs
before anything heavy. To add a command: its module, a line in COMMANDS and one in GUIDES.
Usage errors (RlaifError subclasses ConfigError / UsageError) print one line and exit with code 2;
other RlaifErrors exit with code 1.

The command line answers at once: every command module is imported to build the parser, so a
module's top level imports nothing heavy (mlx-lm, transformers, torch, the API SDKs: they are
imported inside `run`; tests/test_cli_imports.py checks it). `--help`, a usage error and a
`check` error are answered before the OpenBLAS re-execution (cpu/blas.py), which only commands
that compute (all but LIGHT) go through.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .errors import ConfigError, RlaifError, UsageError
from .terminal import VisibleFormatter, visible

# command name -> module under mlx_rlaif.commands
COMMANDS: dict[str, str] = {
    "train": "train",
    "eval": "evaluate",
    "score": "score",
    "audit-judge": "audit_judge",
    "summary": "summary",
    "export-dataset": "export_dataset",
    "convert": "convert",
    "fuse": "fuse",
    "export-peft": "export_peft",
    "export-gguf": "export_gguf",
    "validate": "validate",
    "sft": "sft",
    "migrate-config": "migrate_config",
    "data": "data",
    "doctor": "doctor",
    "serve-reward": "serve_reward",
    "check-rewards": "check_rewards",
}

# command name -> the guide in the repository's docs/ that covers it (its --help names it)
GUIDES: dict[str, str] = {
    "train": "docs/training.md (recipes: docs/recipes.md)",
    "eval": "docs/training.md",
    "score": "docs/rewards.md",
    "audit-judge": "docs/rewards.md",
    "summary": "docs/training.md",
    "export-dataset": "docs/data.md",
    "convert": "docs/models.md",
    "fuse": "docs/models.md",
    "export-peft": "docs/models.md",
    "export-gguf": "docs/models.md",
    "validate": "docs/models.md",
    "sft": "docs/models.md",
    "migrate-config": "docs/training.md",
    "data": "docs/data.md",
    "doctor": "docs/memory.md",
    "serve-reward": "docs/rewards.md",
    "check-rewards": "docs/rewards.md",
}

# commands that never compute with MLX: no OpenBLAS re-execution for them
LIGHT: frozenset[str] = frozenset({"summary", "export-dataset", "export-peft", "migrate-config",
                                   "data"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlx-rlaif",
        description="RL from AI feedback for code models, in MLX, on one set of weights.",
        epilog="With no command: `train` on the embedded quickstart. Guides, one per task, are in "
               "the repository's docs/ (README.md lists them); each command's --help names its "
               "own.",
    )
    parser.add_argument("--version", action="version", version=f"mlx-rlaif {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"mlx_rlaif.commands.{module}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           epilog=f"Guide: {GUIDES[name]} in the repository.")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _check=getattr(mod, "check", None))
    return parser


def _setup_logging() -> None:
    """Our own INFO lines (the sandbox chosen, ...) on stderr; other libraries only warn. Once
    per process (main may run several times in one, as in tests)."""
    logger = logging.getLogger("mlx_rlaif")
    if any(getattr(h, "_mlx_rlaif", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(VisibleFormatter("%(message)s"))  # task ids, reasons: escaped
    handler._mlx_rlaif = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    problem = mlx_unavailable()  # first: a command module may import mlx.core (a few ms)
    if problem:
        print(f"mlx-rlaif: error: {visible(problem, lines=False)}", file=sys.stderr)
        return 1
    parser = build_parser()
    if not argv:
        argv = ["train"]  # the embedded default: the quickstart
    args = parser.parse_args(argv)  # --help and usage errors end here, before anything heavy
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        _check(args)
    except (ConfigError, UsageError) as e:
        print(f"mlx-rlaif {args.command}: error: {visible(e, lines=False)}", file=sys.stderr)
        return 2
    if args.command not in LIGHT:
        from .cpu.blas import maybe_reexec_with_fast_blas

        maybe_reexec_with_fast_blas()
    from .install import installed_backends, mixed_builds

    mixed = mixed_builds(installed_backends())
    if mixed:  # MLX loaded one of them: which one is an accident of the install order
        print(f"mlx-rlaif: warning: {mixed}", file=sys.stderr)
    _setup_logging()
    try:
        return int(args._run(args) or 0)
    except (ConfigError, UsageError) as e:
        print(f"mlx-rlaif {args.command}: error: {visible(e, lines=False)}", file=sys.stderr)
        return 2
    except RlaifError as e:
        print(f"mlx-rlaif {args.command}: error: {visible(e, lines=False)}", file=sys.stderr)
        return 1


def _check(args: argparse.Namespace) -> None:
    """The command's own cheap validation (`check(args)`, where its module has one), silent:
    its log lines come once, from the run itself."""
    check = getattr(args, "_check", None)
    if check is None:
        return
    logging.disable(logging.CRITICAL)
    try:
        check(args)
    finally:
        logging.disable(logging.NOTSET)


def mlx_unavailable() -> str | None:
    """Why MLX cannot be imported here, as one line with the install that fixes it (None when
    it imports): no backend build, or two that overwrite each other (install.py)."""
    try:
        import mlx.core  # noqa: F401
    except ImportError as e:
        from .install import backend_problem, installed_backends

        return backend_problem(installed_backends()) or f"MLX does not load: {e}"
    return None


if __name__ == "__main__":
    sys.exit(main())
