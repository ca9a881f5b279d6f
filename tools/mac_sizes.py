"""Which Qwen2.5-Coder size fits a Mac: the memory plan's estimate, as a Markdown table.

    python tools/mac_sizes.py                       # 0.5B-7B, bfloat16 and 4-bit, 16-64 GB
    python tools/mac_sizes.py --prompts 4 --group 8 --prompt-tokens 128 --tokens 256,1024

For each model shape, weight format, Mac memory size and completion length it runs the memory
plan a training run makes before its first step (`mlx_rlaif/backends/mlx/memory.py`: `plan`)
and prints the peak it predicts, or `no` where the plan finds no setting that fits (the run
would stop before its first step with the setting to change). Every cell is an estimate: no
such Mac was measured; docs/memory.md cites the measured peaks the model was validated on.

Inputs, all stated:
- Shapes: the published `config.json` of Qwen2.5-Coder-{0.5B,1.5B,3B,7B}-Instruct (the same
  values as Qwen2.5's: tools/bench_scale.py), LoRA rank 8 on every linear layer (the defaults).
- Weights: bfloat16 (2 bytes each), or 4-bit with group 64 and bfloat16 scales and biases (0.5 +
  4/64 bytes a weight; norms and biases in bfloat16) as `mlx-rlaif convert -q` writes them.
  Activations in bfloat16, MLX's own kernels (Metal: the CPU build's kernels are off).
- The budget: 85% (the plan's HEADROOM) of Metal's recommended working set, taken here as
  2/3 of the Mac's memory up to 32 GB and 3/4 above (`--working-set`): commonly reported
  values of macOS's default, an assumption; `mlx-rlaif doctor` prints your Mac's own budget.
- A step: P x G = 4 x 8 (the quickstart's), prompts of 128 tokens, the plan free to choose the
  decode width, the micro-batch and checkpointing (the defaults: 0, 0, auto).

Not covered: memory outside MLX (Python, the tokenizer, the sandboxes: the headroom is for
them), other macOS settings of the working set (`sysctl iogpu.wired_limit_mb`), the load of a
float checkpoint quantized at load (`model.quantize: 4` holds the float weights first: convert
once instead).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_rlaif.backends.mlx import memory  # noqa: E402
from mlx_rlaif.errors import ConfigError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import SHAPES_7B  # noqa: E402

# Qwen2.5-Coder-*-Instruct config.json: layers, hidden, intermediate, heads, kv heads, vocab, tied
# (1.5B-7B: tools/bench_scale.py's, the same published values)
SHAPES = {
    "0.5B": dict(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936,
                 tied=True),
    **SHAPES_7B,
}
MAC_GB = (16, 24, 32, 64)
RANK = 8
BYTES_PER_WEIGHT = {"bfloat16": 2.0, "4-bit": 0.5 + 4 / 64}


def shape(a: dict, fmt: str) -> memory.Shape:
    """The memory model's Shape of a Qwen2.5 model in `fmt` with LoRA rank 8 on every linear."""
    d, f, layers, v = a["hidden"], a["intermediate"], a["layers"], a["vocab"]
    kv = a["kv_heads"] * d // a["heads"]
    linears = [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]
    big = layers * sum(i * o for i, o in linears) + v * d * (1 if a["tied"] else 2)
    small = layers * (2 * d + d + 2 * kv) + d  # norms, q/k/v biases, the final norm
    weights = int(big * BYTES_PER_WEIGHT[fmt] + 2 * small)
    lora = layers * RANK * sum(i + o for i, o in linears)
    return memory.Shape(layers, d, f, a["heads"], a["kv_heads"], d // a["heads"], v, weights,
                        act_bytes=2, lora_params=lora, fused_bytes=0, cpu_kernels=False)


def working_set_share(mac_gb: int) -> float:
    return 2 / 3 if mac_gb <= 32 else 3 / 4


def budget(mac_gb: int, share: float | None) -> int:
    ws = (share or working_set_share(mac_gb)) * mac_gb * memory.GiB
    return int(memory.HEADROOM * ws)


def cell(s: memory.Shape, w: memory.Work, budget_bytes: int) -> str:
    """The plan's peak, or `no` where nothing fits."""
    try:
        p = memory.plan(s, w, budget_bytes)
    except ConfigError:
        return "no"
    return f"{p.peak / memory.GiB:.1f}"


def table(a: argparse.Namespace) -> str:
    tokens = [int(t) for t in a.tokens.split(",")]
    head = ["model", "weights"] + [f"{m} GB, {t} tok" for t in tokens for m in MAC_GB]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, spec in SHAPES.items():
        for fmt in BYTES_PER_WEIGHT:
            s = shape(spec, fmt)
            row = [f"{name} {fmt}", f"{s.weight_bytes / memory.GiB:.2f} GB"]
            for t in tokens:
                w = memory.Work(a.prompts, a.group, a.prompt_tokens, t, a.prompts * a.group)
                row += [cell(s, w, budget(m, a.working_set)) for m in MAC_GB]
            lines.append("| " + " | ".join(row) + " |")
    budgets = ", ".join(f"{m} GB: {budget(m, a.working_set) / memory.GiB:.1f} GB"
                        for m in MAC_GB)
    return "\n".join(lines) + f"\n\nbudgets (85% of the working set): {budgets}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="P: prompts per step")
    ap.add_argument("--group", type=int, default=8, help="G: completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", default="256,1024", help="new tokens, comma-separated")
    ap.add_argument("--working-set", type=float, default=None,
                    help="Metal's recommended working set as a share of the Mac's memory "
                         "(default: 2/3 up to 32 GB, 3/4 above)")
    print(table(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
