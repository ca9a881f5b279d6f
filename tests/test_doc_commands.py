"""The documented commands run as written: every fenced `bash` block of README.md and
docs/*.md, on the shipped tiny model, with one declared override, `MLX_RLAIF_SMOKE=1` (at most
one training step and small evaluations: config/loading.py `smoke_caps`).

Each page's blocks run in order with `bash -e` in a fresh directory of their own, where
`configs/`, `models/`, `tools/` and `examples/` link to this checkout's and `mlx-rlaif`,
`python` and `python3` run this checkout's code with this test's interpreter. A block whose fence is
preceded by `<!-- skip: REASON (...) -->` is listed as skipped; REASON is one of `SKIP_REASONS`.
The fast tests check the markers, that every subcommand of `mlx-rlaif` appears in a block that
runs, that each command's `--help` names its guide, the smoke caps themselves, and that the
README's first screen keeps the two commands CI depends on.

Not covered: output examples (fences without a language), blocks in other languages (`json`,
`yaml`), and what a command prints (only that it succeeds).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlx_rlaif.cli import COMMANDS, GUIDES, build_parser
from mlx_rlaif.config import load, smoke_caps
from mlx_rlaif.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
SKIP_REASONS = {"network", "teacher-key", "gpu", "machines", "long"}
MARKER = re.compile(r"^\s*<!--\s*skip:\s*([\w-]+)")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
LINKED = ("configs", "models", "tools", "examples")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the marker's reason, or None: the block runs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def shell_blocks(page: Path) -> list[Block]:
    """The fenced shell blocks of a page, each with the skip marker on the line before it."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])
                    and not FENCE.match(lines[j]).group(1)), len(lines))
        if m.group(1) in SHELL:
            marker = MARKER.match(lines[i - 1]) if i else None
            out.append(Block(str(page.relative_to(ROOT)), i + 1, "\n".join(lines[i + 1:end]),
                             marker.group(1) if marker else None))
        i = end + 1
    return out


def subcommands(code: str) -> set[str]:
    """The `mlx-rlaif` subcommands a block runs (comments left out)."""
    text = "\n".join(re.sub(r"(^|\s)#.*", "", line) for line in code.splitlines())
    found = re.findall(r"(?:mlx-rlaif|mlx_rlaif\.cli)\s+([a-z][a-z-]*)", text)
    return {name for name in found if name in COMMANDS}


ALL = [b for page in PAGES for b in shell_blocks(page)]
RUNNABLE_PAGES = sorted({b.page for b in ALL if b.skip is None})


# --- fast checks -------------------------------------------------------------------------------


def test_markers_name_a_known_reason_and_sit_on_a_shell_fence():
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARKER.match(line)
            if not m:
                continue
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            assert m.group(1) in SKIP_REASONS, f"{where}: unknown skip reason {m.group(1)!r}"
            fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            assert fence and fence.group(1) in SHELL, f"{where}: a marker must precede a bash fence"


def test_every_subcommand_appears_in_a_block_that_runs():
    ran = set().union(*(subcommands(b.code) for b in ALL if b.skip is None))
    missing = sorted(set(COMMANDS) - ran)
    assert not missing, f"subcommands in no runnable block of README.md or docs/: {missing}"


def test_block_parsing_and_subcommands():
    assert subcommands("# mlx-rlaif fuse in a comment\nmlx-rlaif data convert --from x  # eval") \
        == {"data"}
    assert subcommands("torchrun -m mlx_rlaif.cli train --x") == {"train"}


def test_each_help_names_its_guide():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a.choices, dict))
    assert set(GUIDES) == set(COMMANDS)
    for name, p in sub.choices.items():
        help_text = p.format_help()
        guide = re.search(r"docs/[\w-]+\.md", help_text)
        assert guide, f"mlx-rlaif {name} --help names no guide"
        assert (ROOT / guide.group(0)).is_file(), f"{name}: {guide.group(0)} does not exist"
        assert name in (ROOT / guide.group(0)).read_text(), f"{guide.group(0)} never names {name}"
    assert "docs/" in parser.format_help()


def test_readme_first_screen_keeps_the_two_commands():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
    assert 'python3 -m pip install -e ".[cpu]" && mlx-rlaif train' in head
    assert 'python3 -m pip install -e ".[cpu,dev]" && python3 -m pytest' in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python3 -m pip install -q -e ".[cpu,dev]" && python3 -m pytest -q' in ci
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260


def test_smoke_caps_only_lower(monkeypatch):
    monkeypatch.setenv("MLX_RLAIF_SMOKE", "3")
    raw = {"training": {"max_steps": 60}, "data": {"eval_samples": 4, "eval_max_tasks": 2},
           "generation": {"max_new_tokens": 32}, "rl": {"overlong_buffer": 100}}
    applied = smoke_caps(raw, rl=True)
    assert raw["training"]["max_steps"] == 3
    assert raw["data"] == {"eval_samples": 1, "eval_max_tasks": 2}  # 2 is under the cap of 8
    assert raw["generation"]["max_new_tokens"] == 32  # under 64: kept
    assert raw["rl"]["overlong_buffer"] == 64
    assert set(applied) == {"training.max_steps=3", "data.eval_samples=1",
                            "rl.overlong_buffer=64"}
    raw = {}
    smoke_caps(raw, rl=True)  # unset: max_steps and eval_max_tasks (0 = all) capped, tokens too
    assert raw == {"training": {"max_steps": 3}, "data": {"eval_max_tasks": 8},
                   "generation": {"max_new_tokens": 64}}
    raw = {"data": {"eval_every": 25}, "rl": {"overlong_buffer": 0}}
    smoke_caps(raw, rl=True)  # a periodic evaluation still happens; 0 (off) stays off
    assert raw["data"]["eval_every"] == 3 and raw["rl"] == {"overlong_buffer": 0}
    raw = {"data": {"eval_every": 0}}
    smoke_caps(raw, rl=True)
    assert raw["data"]["eval_every"] == 0
    raw = {"training": {"max_steps": 60}}
    smoke_caps(raw, rl=False)  # sft: no data or generation sections
    assert raw == {"training": {"max_steps": 3}}


def test_smoke_caps_through_the_config_load(monkeypatch):
    cfg = load(ROOT / "configs" / "quickstart.yaml")
    assert (cfg.training.max_steps, cfg.data.eval_samples) == (60, 4)
    monkeypatch.setenv("MLX_RLAIF_SMOKE", "1")
    cfg = load(ROOT / "configs" / "quickstart.yaml", ["training.max_steps=0"])
    assert (cfg.training.max_steps, cfg.data.eval_samples, cfg.data.eval_max_tasks,
            cfg.generation.max_new_tokens) == (1, 1, 8, 64)
    monkeypatch.setenv("MLX_RLAIF_SMOKE", "lots")
    with pytest.raises(ConfigError, match="MLX_RLAIF_SMOKE='lots'"):
        load(ROOT / "configs" / "quickstart.yaml")
    monkeypatch.setenv("MLX_RLAIF_SMOKE", "0")
    assert load(ROOT / "configs" / "quickstart.yaml").training.max_steps == 60


# --- the blocks, run --------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL if b.skip], ids=lambda b: b.where)
def test_skipped_block(block: Block):
    pytest.skip(f"{block.where} needs: {block.skip}")


def workspace(tmp: Path) -> dict[str, str]:
    """A directory like a clone's root for the blocks, and the environment they run in."""
    for name in LINKED:
        (tmp / name).symlink_to(ROOT / name)
    bin_dir = tmp / ".bin"
    bin_dir.mkdir()
    shims = {"mlx-rlaif": f'exec "{sys.executable}" -m mlx_rlaif.cli "$@"',
             "python": f'exec "{sys.executable}" "$@"', "python3": f'exec "{sys.executable}" "$@"'}
    for name, line in shims.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["MLX_RLAIF_SMOKE"] = "1"  # the one declared override
    env.pop("MLX_RLAIF_FAULT", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_blocks_run(page: str, tmp_path: Path):
    env = workspace(tmp_path)
    for block in (b for b in ALL if b.page == page and b.skip is None):
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert r.returncode == 0, (f"{block.where} failed (exit {r.returncode}):\n{block.code}\n"
                                   f"--- output ---\n{(r.stdout + r.stderr)[-4000:]}")
