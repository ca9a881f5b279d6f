"""The shipped task suites: they load, are well-formed, held out, and their solutions pass."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_rlaif.data.suites import SUITES, load_suite
from mlx_rlaif.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import make_suite  # noqa: E402


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return load_suite("synthetic-train")


@pytest.fixture(scope="module")
def evals() -> list[dict]:
    return load_suite("synthetic-eval")


def test_names_and_unknown_suite() -> None:
    assert set(SUITES) == {"synthetic-train", "synthetic-eval", "humaneval"}
    with pytest.raises(UsageError, match="unknown suite 'synthtic-eval'.*synthetic-eval"):
        load_suite("synthtic-eval")


def test_records_are_well_formed(train: list[dict], evals: list[dict]) -> None:
    for t in train + evals:
        assert t["language"] in ("python", "cpp", "rust")
        assert t["difficulty"] in ("easy", "medium", "hard")
        assert t["prompt"] and t["solution"] and len(t["tests"]) >= 3
        if t["language"] == "python":
            assert t["entry_point"] in t["prompt"]
            assert t["solution"].startswith(f"def {t['entry_point']}(")
            assert t["prompt"] == t["solution"].split("\n")[0] + f'\n    """{t["prompt"].split(chr(34) * 3)[1]}"""\n'
            assert all(set(c) == {"args", "expected"} for c in t["tests"])
        else:
            assert all(set(c) == {"stdin", "stdout"} for c in t["tests"])
    ids = [t["id"] for t in train + evals]
    assert len(ids) == len(set(ids))


def test_sizes_and_mix(train: list[dict], evals: list[dict]) -> None:
    def count(tasks: list[dict], lang: str) -> int:
        return sum(t["language"] == lang for t in tasks)

    assert [count(train, x) for x in ("python", "cpp", "rust")] == [1280, 48, 48]
    assert [count(evals, x) for x in ("python", "cpp", "rust")] == [96, 12, 12]
    assert {t["difficulty"] for t in evals} == {"easy", "medium", "hard"}


def test_eval_is_held_out_but_same_families(train: list[dict], evals: list[dict]) -> None:
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in evals}
    train_names = {(t["family"], t["entry_point"]) for t in train if t["language"] == "python"}
    eval_names = {(t["family"], t["entry_point"]) for t in evals if t["language"] == "python"}
    assert not train_names & eval_names
    assert {t["family"] for t in evals} == {t["family"] for t in train}
    held_out = {re.split(r"[`{]", make_suite.docstring(f.templates[-1]))[0]
                for f in make_suite.FAMILIES}

    def phrasing(t: dict) -> str:  # a Python prompt's phrasing is its stub's docstring
        return t["prompt"].split('"""')[1] if t["language"] == "python" else t["prompt"]

    assert any(phrasing(t).startswith(tuple(held_out)) for t in evals)
    assert not any(phrasing(t).startswith(tuple(held_out)) for t in train)


def test_generator_is_deterministic_and_matches_shipped_files(train: list[dict],
                                                               evals: list[dict]) -> None:
    assert make_suite.build(make_suite.SEED) == (train, evals)
    assert make_suite.build(make_suite.SEED + 1)[1] != evals


def test_python_solutions_pass_their_tests(train: list[dict], evals: list[dict]) -> None:
    python = [t for t in train + evals if t["language"] == "python"]
    assert make_suite.check_python(python) == []


def test_broken_python_solution_is_caught(evals: list[dict]) -> None:
    task = dict(next(t for t in evals if t["family"] == "add"))
    task["solution"] = task["solution"].replace("+", "-")
    assert make_suite.check_python([task]) == [task["id"]]


def _one_per_family(tasks: list[dict], lang: str) -> list[dict]:
    seen: dict[str, dict] = {}
    for t in tasks:
        if t["language"] == lang:
            seen.setdefault(t["family"], t)
    return list(seen.values())


@pytest.mark.slow
@pytest.mark.parametrize("lang,tool", [("cpp", "g++"), ("rust", "rustc")])
def test_program_solutions_pass_their_tests(evals: list[dict], lang: str, tool: str) -> None:
    if not shutil.which(tool):
        pytest.skip(f"{tool} not installed")
    tasks = _one_per_family(evals, lang)
    assert len(tasks) == 9
    assert [t["id"] for t in tasks if make_suite.check_program(t) is not True] == []


@pytest.mark.skipif(not shutil.which("g++"), reason="g++ not installed")
def test_broken_program_is_caught(evals: list[dict]) -> None:
    task = dict(next(t for t in evals if t["language"] == "cpp" and t["family"] == "sum2"))
    task["solution"] = task["solution"].replace("a + b", "a - b")
    assert make_suite.check_program(task) is False


def test_humaneval_is_read_from_the_package() -> None:
    tasks = load_suite("humaneval")
    assert len(tasks) == 164
    first = tasks[0]
    assert first["id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert first["language"] == "python" and "def check(candidate)" in first["test"]
    program = first["solution"] + "\n" + first["test"] + f"\ncheck({first['entry_point']})\n"
    assert subprocess.run([sys.executable, "-c", program], timeout=30).returncode == 0


def test_suites_are_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"data/suites/*.jsonl"' in text
    for name in ("synthetic-train", "synthetic-eval"):
        path = ROOT / "mlx_rlaif" / "data" / "suites" / f"{name}.jsonl"
        assert json.loads(path.read_text().splitlines()[0])["id"].startswith("synthetic/")
