"""Where a long run's memory grows: trains in this process (the shipped tiny model, the exec
reward, 4 prompts x 4 completions, as tools/soak.py but without the teacher) and prints the
resident memory every 50 steps and the Python allocations that grew most between two steps
(tracemalloc), to tell Python objects kept by mistake from native memory.

    flock /tmp/mlx-rlaif-measure.lock python3 tools/heap_growth.py --steps 300 --between 150 300

Not covered: which native allocation grew (tracemalloc sees Python's allocator only).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlx_rlaif.config import load  # noqa: E402
from mlx_rlaif.metrics import MetricsHub  # noqa: E402
from mlx_rlaif.train import train  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--between", type=int, nargs=2, default=(150, 300), metavar=("A", "B"))
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    a, b = args.between
    out = Path(tempfile.mkdtemp(prefix="heap-growth-"))
    cfg = load(None, [f"model.path={ROOT / 'models' / 'tiny-coder'}", f"training.output_dir={out}",
                      f"training.max_steps={args.steps}", "data.train_file=suite:synthetic-train",
                      "data.languages=[python]", "data.difficulties=[easy]",
                      "training.batch_size=4", "generation.num_samples_per_prompt=4",
                      "generation.max_new_tokens=64", "training.num_epochs=100",
                      "training.save_every_batches=50", "training.save_total_limit=2",
                      "reward.type=exec"])
    me = psutil.Process()
    snaps: dict[int, tracemalloc.Snapshot] = {}

    class Hub(MetricsHub):
        def log_step(self, step: int, metrics: dict) -> None:
            super().log_step(step, metrics)
            if step == a - 1:
                tracemalloc.start(25)
            if step in (a, b):
                gc.collect()
                snaps[step] = tracemalloc.take_snapshot()
            if step % 50 == 0:
                print(f"step {step}: RSS {me.memory_info().rss / 2**20:.1f} MB", file=sys.stderr)

    train(cfg, hub=Hub.create(cfg.logging, out, False, args.steps, {}))
    diff = snaps[b].compare_to(snaps[a], "traceback")
    grown = sum(max(0, s.size_diff) for s in diff)
    print(f"Python allocations grew by {grown / 2**10:.0f} KiB between steps {a} and {b}; "
          f"the largest:")
    for s in diff[: args.top]:
        print(f"  {s.size_diff / 2**10:+.0f} KiB  {s.traceback.format()[-2].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
