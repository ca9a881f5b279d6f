"""The package's layering (docs/architecture.md's table) holds: every import of every module,
read with `ast` (top level, inside functions, under TYPE_CHECKING), goes where the table allows,
and no files import each other in a circle. The CPU fast paths sit behind one gate."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlx_rlaif"
TABLE = ROOT / "docs" / "architecture.md"


def allowed_table() -> dict[str, set[str]]:
    """unit -> the units it may import, from the markdown table."""
    rules = {}
    for line in TABLE.read_text().splitlines():
        m = re.match(r"\| `([\w.]+)` \|[^|]*\|([^|]*)\|$", line.strip())
        if m:
            rules[m.group(1)] = set(re.findall(r"`([\w.]+)`", m.group(2)))
    return rules


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> list[str]:
    """The mlx_rlaif modules `path` imports, absolute, anywhere in the file."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("mlx_rlaif")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("mlx_rlaif"):
                continue
            # `from pkg import sub`: the submodule when it is one
            subs = [f"{mod}.{a.name}" for a in node.names]
            found = [s for s in subs if _exists(s, root)]
            out += found or [mod]
    return out


def _exists(module: str, root: Path) -> bool:
    p = root.joinpath(*module.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def unit_of(module: str, units: set[str]) -> str:
    parts = module.split(".")[1:]  # without "mlx_rlaif"
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in units:
            return ".".join(parts[:n])
    return "mlx_rlaif"


def graph() -> dict[str, list[str]]:
    return {module_name(p): imports(p) for p in PKG.rglob("*.py")}


def test_every_import_follows_the_table() -> None:
    rules = allowed_table()
    units = set(rules) - {"mlx_rlaif"}
    assert {"train", "backends.mlx", "cpu", "commands", "testing"} <= units
    bad = []
    for mod, deps in graph().items():
        src = unit_of(mod, units)
        assert src in rules, f"{mod} is in no unit of docs/architecture.md"
        for dep in deps:
            dst = unit_of(dep, units)
            if dst != src and dst not in rules[src]:
                bad.append(f"{mod} -> {dep} ({src} may not import {dst})")
    assert not bad, "\n".join(bad)


def test_no_runtime_module_imports_testing() -> None:
    users = [m for m, deps in graph().items() if not m.startswith("mlx_rlaif.testing")
             and any(d.startswith("mlx_rlaif.testing") for d in deps)]
    assert not users


def test_no_circles() -> None:
    edges = {m: {d for d in deps if d != m} for m, deps in graph().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in edges.get(m, ()):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d in edges and not state.get(d):
                visit(d)
        stack.pop()
        state[m] = 2

    for m in edges:
        if not state.get(m):
            visit(m)


def test_the_checker_sees_a_forbidden_edge(tmp_path: Path) -> None:
    """The checker itself: a function-level import from a lower unit to a higher one is found."""
    rules = allowed_table()
    pkg = tmp_path / "mlx_rlaif"
    (pkg / "algo").mkdir(parents=True)
    (pkg / "train").mkdir()
    (pkg / "train" / "loop.py").write_text("")
    lower = pkg / "algo" / "advantages.py"
    lower.write_text("import numpy\n\n\ndef f():\n    from ..train import loop\n")
    deps = imports(lower, tmp_path)
    assert deps == ["mlx_rlaif.train.loop"]
    assert unit_of(deps[0], set(rules)) not in rules["algo"]
