"""The command line answers at once: `mlx-rlaif --help`, `mlx-rlaif CMD --help` for every command
and a config error import none of the heavy libraries (mlx-lm, transformers, torch, the API and
tracker SDKs) and are answered before the OpenBLAS re-execution (cli.py). What is measured is the
set of modules a fresh interpreter has imported, not the time (BENCHMARKS.md has the times).

Not covered: what a command imports once it runs (it imports what it needs).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlx_rlaif.cli import COMMANDS

HEAVY = ("mlx_lm", "transformers", "torch", "anthropic", "openai", "huggingface_hub", "wandb",
         "trackio", "tensorboardX", "datasets", "gguf", "llama_cpp", "peft")

# main() in a fresh interpreter, then the heavy modules it imported, as JSON on the last line.
# A re-execution would replace the process before that line is printed.
PROBE = """
import json, sys
from mlx_rlaif import cli
try:
    rc = cli.main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
heavy = HEAVY
print(json.dumps({"rc": rc, "heavy": sorted(m for m in heavy if m in sys.modules)}))
""".replace("HEAVY", repr(HEAVY))


def probe(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip(), f"no answer (re-executed?): {out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_top_level_help_imports_nothing_heavy() -> None:
    got = probe("--help")
    assert got == {"rc": 0, "heavy": []}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_imports_nothing_heavy(command: str) -> None:
    got = probe(command, "--help")
    assert got == {"rc": 0, "heavy": []}, f"mlx-rlaif {command} --help imported {got['heavy']}"


def test_a_config_error_is_answered_before_anything_heavy(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  max_stepz: 3\n")
    got = probe("train", "--config", str(bad))
    assert got == {"rc": 2, "heavy": []}


def test_a_usage_error_is_answered_before_anything_heavy() -> None:
    got = probe("fuse", "--no-such-flag")
    assert got == {"rc": 2, "heavy": []}
