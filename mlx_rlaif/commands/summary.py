"""`mlx-rlaif summary RUN_DIR`: a run's batch, epoch or periodic evaluation metrics as a table, CSV
and PNG curves, and the best checkpoint (training.keep_best) when the run has one. What the
records hold (task ids, component names, reasons) and the paths are printed through
terminal.visible / text: one line each, no control characters, no rich markup read."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ..artifacts import checkpoint
from ..metrics import hacking, summary
from ..terminal import text, visible

HELP = "Show a run's metrics (batches.jsonl / epochs.jsonl) as a table; export CSV or PNG curves."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="The run's output directory (training.output_dir).",
    )
    parser.add_argument(
        "--type",
        choices=("batch", "epoch", "eval"),
        default="batch",
        help="Per-step records (batch), per-epoch aggregates (epoch) or the periodic "
        "held-out evaluations (eval).",
    )
    parser.add_argument(
        "--tail",
        type=int,
        default=20,
        metavar="N",
        help="Show the last N records in the table (0: all). Default 20.",
    )
    parser.add_argument(
        "--csv-out",
        type=Path,
        metavar="FILE",
        help="Write all records (every key) to this CSV file.",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="OUT.png",
        help="Write reward, KL, loss and throughput curves to this PNG.",
    )


def run(args: argparse.Namespace) -> int:
    records = summary.load(args.run_dir, args.type)
    console = Console()
    if not console.is_terminal:  # a pipe or file: print the whole table, whatever its width
        console = Console(width=1000)
    shown = summary.tail(records, args.tail)
    n = summary.ranks(records)
    title = f"{args.run_dir} ({args.type}: {len(shown)} of {len(records)}" + \
        (f"; data parallel, {n} ranks)" if n > 1 else ")")
    console.print(summary.table(shown, args.type, title))
    if args.type == "batch" and (parts := summary.component_table(shown)) is not None:
        console.print(parts)  # reward.components: each component's own statistics
    if args.type == "batch":
        for line in hacking.report(args.run_dir, records):
            print(visible(line, lines=False))
    if args.csv_out:
        summary.write_csv(records, args.csv_out)
        console.print(text(f"wrote {len(records)} rows to {args.csv_out}"))
    if args.plot:
        summary.plot(records, args.type, args.plot, title=str(args.run_dir))
        console.print(text(f"wrote {args.plot}"))
    best = checkpoint.read_best(args.run_dir)
    if best is not None:
        print(visible(f"best checkpoint: {checkpoint.best_checkpoint(args.run_dir)} (step "
                      f"{best['step']}: held-out pass@1 {best['eval/pass@1']:.3f}, mean reward "
                      f"{best['eval/reward_mean']:.3f})", lines=False))
    return 0
