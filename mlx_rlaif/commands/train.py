"""`mlx-rlaif train`: parse flags into config overrides and call mlx_rlaif.train.train.

`--resume` continues the newest whole checkpoint (a damaged one is moved aside with a line, see
artifacts/checkpoint.py); a full disk ends the run with one line naming it (`disk_full`).
"""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..artifacts import checkpoint
from ..assets import QUICKSTART
from ..config import Config, from_dict, load, to_dict, with_functions
from ..errors import DiskFullError, UsageError
from ..terminal import visible

if TYPE_CHECKING:
    from ..train.distributed import World

HELP = "Train a code model with RL (sample, score, LoRA policy-gradient update)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: the quickstart shipped with the "
                   "package, configs/quickstart.yaml in the repository)")
    p.add_argument("--model", help="model directory or hub id (model.path)")
    p.add_argument("--train-file", help="training tasks: JSONL or suite:NAME (data.train_file)")
    p.add_argument("--eval-file",
                   help="held-out tasks evaluated before and after training (data.eval_file)")
    p.add_argument("--output-dir", help="run directory (training.output_dir)")
    p.add_argument("--max-steps", type=int, help="stop after N steps (training.max_steps)")
    p.add_argument("--init-adapter", help="start from these adapters, e.g. an sft run")
    p.add_argument("--resume", nargs="?", const="", metavar="DIR",
                   help="continue the newest checkpoint of DIR (default: the output dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key, e.g. --set rl.kl_penalty=0.05 (repeatable)")
    p.add_argument("--no-dashboard", action="store_true", help="plain log lines, no live view")
    p.add_argument("--reward", action="append", default=[], metavar="FILE.py:fn[@weight]",
                   help="add your reward function to the reward (reward.functions; weight 1 "
                   "unless given; repeatable): docs/rewards.md")


def overrides(args: argparse.Namespace) -> list[str]:
    pairs = [("model.path", args.model), ("data.train_file", args.train_file),
             ("data.eval_file", args.eval_file), ("training.output_dir", args.output_dir),
             ("training.max_steps", args.max_steps), ("lora.init_adapter", args.init_adapter)]
    out = [f"{k}={v}" for k, v in pairs if v is not None]
    if args.train_file and not args.config:  # the quickstart's easy-only filter is for its suite
        out.insert(0, "data.difficulties=[]")
    if args.no_dashboard:
        out.append("logging.dashboard=false")
    return out + list(args.set)


def config_path(args: argparse.Namespace) -> str | None:
    if args.config:
        return args.config
    if args.resume is not None:
        run_dir = Path(args.resume or _output_dir(args))
        saved = run_dir / "config.yaml"
        return str(saved) if saved.is_file() else None
    return str(QUICKSTART)


def _output_dir(args: argparse.Namespace) -> str:
    if args.output_dir:
        return args.output_dir
    cfg = load(args.config or str(QUICKSTART), list(args.set))
    return cfg.training.output_dir


def resolve(args: argparse.Namespace) -> tuple[Config, Path | None]:
    """The config and, with --resume, the checkpoint to continue."""
    cfg = with_functions(load(config_path(args), overrides(args)), absolute(args.reward))
    resume_from = None
    if args.resume is not None:
        run_dir = Path(args.resume or cfg.training.output_dir)
        resume_from = checkpoint.newest_valid(
            run_dir, say=lambda s: print(visible(s, lines=False), file=sys.stderr))
        if resume_from is None:
            raise UsageError(f"--resume: no complete checkpoint in {run_dir}/checkpoints: "
                             "start a new run without --resume")
        if args.resume:
            from dataclasses import replace

            cfg = replace(cfg, training=replace(cfg.training, output_dir=str(run_dir)))
    return cfg, resume_from


def resolve_on_rank0(world: World, args: argparse.Namespace) -> tuple[Config, Path | None]:
    """`resolve` on rank 0 (its files: the config, the run directory), sent to every rank."""
    if world.size == 1:
        return resolve(args)

    def encoded() -> dict:
        cfg, resume_from = resolve(args)
        return {"config": to_dict(cfg), "resume": str(resume_from) if resume_from else None}

    raw = world.first(encoded, "exchange of rank 0's config")
    return from_dict(raw["config"]), Path(raw["resume"]) if raw["resume"] else None


def absolute(specs: list[str]) -> list[str]:
    """--reward FILE.py:fn@w with the file's path made absolute: the run's config.yaml keeps
    it, so --resume finds the file from any directory."""
    from ..rewards.custom.spec import absolute as one

    return [one(s) for s in specs]


def check(args: argparse.Namespace) -> None:
    """The config as `run` loads it, before anything heavy is imported: a config error is
    answered at once (cli.py calls this first)."""
    with_functions(load(config_path(args), overrides(args)), args.reward)


def run(args: argparse.Namespace) -> int:
    from ..train import train
    from ..train.distributed import connect

    world = connect()  # one process unless started by mlx.launch or torchrun
    with world.session():  # ranks other than 0 print nothing but errors
        cfg, resume_from = resolve_on_rank0(world, args)
        interactive = world.rank == 0 and sys.stdout.isatty() and cfg.logging.dashboard
        try:
            run_dir = train(cfg, resume_from=resume_from, interactive=interactive, world=world)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFullError(disk_full(Path(cfg.training.output_dir), e)) from None
        print(f"run directory: {visible(run_dir, lines=False)}")
    return 0


def disk_full(run_dir: Path, e: OSError) -> str:
    """One line: which disk filled up, how full it is, what is kept, what to do."""
    where = e.filename or run_dir
    try:
        du = shutil.disk_usage(run_dir)
        room = f"now {du.free / 2**20:.1f} MiB free of {du.total / 2**20:.1f} MiB"
    except OSError:
        room = "size unknown"
    latest = checkpoint.latest_checkpoint(run_dir)
    kept = f"the newest complete checkpoint, {latest}, is intact" if latest else \
        "no checkpoint was complete yet"
    return (f"no space left on the disk holding {run_dir} ({e.strerror or 'ENOSPC'} writing "
            f"{where}; {room}): free space there or pass another --output-dir, then --resume; "
            f"{kept}")
