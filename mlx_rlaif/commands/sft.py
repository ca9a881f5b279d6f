"""`mlx-rlaif sft`: supervised LoRA fine-tuning on prompt/completion JSONL (see mlx_rlaif/sft.py),
writing RL-compatible checkpoints: continue with `mlx-rlaif train --set lora.init_adapter=RUN_DIR`.
"""

from __future__ import annotations

import argparse

HELP = "Supervised LoRA fine-tuning on prompt/completion JSONL (the warm start before RL)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="FILE",
                   help="SFT config YAML (sections model, lora, training, sft; see configs/sft.yaml).")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="Override a config value, e.g. --set sft.train_file=data.jsonl (repeatable).")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from ..artifacts import checkpoint
    from ..train.sft import load_config, sft

    cfg = load_config(args.config, args.overrides)
    console = Console(stderr=True)
    columns = (TextColumn("sft"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("sft", total=None, info="loading model")

        def progress(step: int, total: int, m: dict) -> None:
            bar.update(task, completed=step, total=total,
                       info=f"loss {m['loss/sft']:.4f}  {m['sft/tokens_per_sec']:.0f} tok/s")
            if not console.is_terminal and (step == total or step % 10 == 0):
                of = f"/{total}" if total else ""  # None: training.max_minutes alone ends it
                console.print(f"sft step {step}{of}: loss {m['loss/sft']:.4f}")

        run_dir = sft(cfg, progress, log=console.print)
    latest = checkpoint.latest_checkpoint(run_dir)
    console.print(f"[green]sft done[/]: {latest}\ncontinue with RL: mlx-rlaif train --set "
                  f"lora.init_adapter={run_dir}")
    return 0
