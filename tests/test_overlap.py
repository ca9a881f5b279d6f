"""Decontamination: n-gram overlap of prompts and reference solutions and exact-duplicate tests
between a training and an evaluation task file (`mlx-rlaif data overlap`), and
`data.decontaminate_against` dropping the overlapping training tasks at load. Planted exact
duplicates and near-duplicates are flagged; a clean control with the same boilerplate is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_rlaif.config import load
from mlx_rlaif.data import load_tasks
from mlx_rlaif.data.overlap import find_overlaps, ngrams, tokens
from mlx_rlaif.errors import DataError
from mlx_rlaif.train.trainer import prepare

ROOT = Path(__file__).resolve().parent.parent

EVAL = [
    {"id": "e/anagram", "prompt": "Write a function that takes two strings and returns True when "
     "one is an anagram of the other, ignoring spaces and letter case.",
     "solution": "def is_anagram(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n"
                 "    return norm(a) == norm(b)\n",
     "entry_point": "is_anagram", "tests": [{"args": ["Dormitory", "dirty room"], "expected": True},
                                           {"args": ["ab", "abc"], "expected": False}]},
    {"id": "e/primes", "prompt": "Write a function that returns the list of all prime numbers "
     "smaller than n, in increasing order, using the sieve of Eratosthenes.",
     "solution": "def primes_below(n):\n    sieve = [True] * n\n    out = []\n"
                 "    for i in range(2, n):\n        if sieve[i]:\n            out.append(i)\n"
                 "            for j in range(i * i, n, i):\n                sieve[j] = False\n"
                 "    return out\n",
     "entry_point": "primes_below", "tests": [{"args": [10], "expected": [2, 3, 5, 7]}]},
    {"id": "e/vowels", "prompt": "Write a function that counts the vowels in a string.",
     "entry_point": "count_vowels", "tests": [{"args": ["banana"], "expected": 3},
                                              {"args": [""], "expected": 0}]},
]

TRAIN = [
    # an exact duplicate of an eval prompt, under another id
    {"id": "t/exact", "prompt": EVAL[0]["prompt"], "entry_point": "f",
     "tests": [{"args": ["a", "a"], "expected": True}]},
    # a near-duplicate: a few words changed
    {"id": "t/near", "prompt": "Write a function which returns the list of all prime numbers "
     "smaller than n, in ascending order, using the sieve of Eratosthenes.",
     "entry_point": "g", "tests": [{"args": [3], "expected": [2]}]},
    # another prompt, but the eval task's reference solution with a renamed variable
    {"id": "t/solution", "prompt": "Implement a routine that lists primes below a bound.",
     "solution": EVAL[1]["solution"].replace("out", "found"), "entry_point": "primes_below",
     "tests": [{"args": [5], "expected": [2, 3]}]},
    # the eval task's tests (keys in another order), another wording
    {"id": "t/tests", "prompt": "How many of a, e, i, o, u does the text contain?",
     "entry_point": "count_vowels", "tests": [{"expected": 3, "args": ["banana"]},
                                              {"expected": 0, "args": [""]}]},
    # clean control: the same boilerplate opening, another problem
    {"id": "t/clean", "prompt": "Write a function that takes a list of integers and returns the "
     "second largest distinct value, or None when there is none.",
     "solution": "def second_largest(xs):\n    s = sorted(set(xs))\n"
                 "    return s[-2] if len(s) > 1 else None\n",
     "entry_point": "second_largest", "tests": [{"args": [[1, 3, 2]], "expected": 2}]},
]

FLAGGED = {("t/exact", "e/anagram", "prompt"), ("t/near", "e/primes", "prompt"),
           ("t/solution", "e/primes", "solution"), ("t/tests", "e/vowels", "tests")}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "train.jsonl", TRAIN), write(tmp_path / "eval.jsonl", EVAL)


def test_ngrams_and_score_by_hand():
    assert tokens("Sum(x, y)!") == ["sum", "(", "x", ",", "y", ")", "!"]
    assert ngrams("a b c d e", 3) == {("a", "b", "c"), ("b", "c", "d"), ("c", "d", "e")}
    assert ngrams("a b", 3) == {("a", "b")}  # shorter than n: one gram
    # "a b c d e" vs "a b c d x": the shared 3-grams abc, bcd cover a, b, c, d: 4 of 5 tokens
    train = load_tasks_from([{"id": "t", "prompt": "a b c d e"}])
    evals = load_tasks_from([{"id": "e", "prompt": "a b c d x"}])
    (m,) = find_overlaps(train, evals, n=3, threshold=0.5)
    assert (m.field, m.score) == ("prompt", 0.8)
    assert find_overlaps(train, evals, n=3, threshold=0.85) == []
    # the shorter text is measured: "b c d" lies whole inside "a b c d e"
    (m,) = find_overlaps(load_tasks_from([{"id": "s", "prompt": "b c d"}]), train, n=3)
    assert m.score == 1.0
    # no shared run of n tokens: 0, however many words the texts share
    assert find_overlaps(load_tasks_from([{"id": "r", "prompt": "e d c b a"}]), train, n=3,
                         threshold=0.01) == []


def test_planted_duplicates_are_flagged_and_the_control_is_not(files):
    train, evals = load_tasks(str(files[0])), load_tasks(str(files[1]))
    found = find_overlaps(train, evals)
    assert {(m.train_id, m.eval_id, m.field) for m in found} == FLAGGED
    scores = {m.train_id: m.score for m in found}
    assert scores["t/exact"] == 1.0 and scores["t/tests"] == 1.0
    assert 0.5 <= scores["t/near"] < 1.0 and 0.5 <= scores["t/solution"] < 1.0
    assert "t/clean" not in scores


def test_overlap_command_prints_a_table_and_writes_json(files, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "data", "overlap", str(files[0]), str(files[1]),
         "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "4 of 5 training tasks overlap the 3 evaluation tasks" in proc.stdout
    assert "t/near" in proc.stdout and "t/clean" not in proc.stdout
    rep = json.loads(out.read_text())
    assert rep["flagged_train_tasks"] == 4 and rep["by_field"] == {
        "prompt": 2, "solution": 1, "tests": 1}
    assert {(m["train_id"], m["eval_id"], m["field"]) for m in rep["matches"]} == FLAGGED


def test_decontaminate_against_drops_the_overlapping_tasks_at_load(files, tmp_path):
    cfg = load(None, [f"data.train_file={files[0]}", f"data.decontaminate_against={files[1]}",
                      "reward.type=syntax", f"training.output_dir={tmp_path / 'run'}"])
    tasks, _, reward_fn = prepare(cfg, tmp_path / "run", None)
    reward_fn.close()
    assert [t.id for t in tasks] == ["t/clean"]
    off = load(None, [f"data.train_file={files[0]}", "reward.type=syntax"])
    assert len(prepare(off, tmp_path / "run2", None)[0]) == 5
    everything = write(tmp_path / "all.jsonl", TRAIN[:1])
    bad = load(None, [f"data.train_file={everything}", f"data.decontaminate_against={files[1]}",
                      "reward.type=syntax"])
    with pytest.raises(DataError, match="every training task overlaps"):
        prepare(bad, tmp_path / "run3", None)


@pytest.mark.slow
def test_startup_line_counts_the_dropped_tasks(files, micro_model, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(micro_model),
         "--train-file", str(files[0]), "--output-dir", str(tmp_path / "run"), "--max-steps",
         "1", "--set", f"data.decontaminate_against={files[1]}", "--set", "reward.type=syntax",
         "--set", "generation.max_new_tokens=4", "--set", "logging.tensorboard=false",
         "--no-dashboard"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert ("decontamination against " + str(files[1]) + " (8-grams, threshold 0.5): dropped 4 "
            "of 5 training tasks (prompt 2, solution 1, tests 1)") in proc.stderr
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    trained = {r["task_id"] for r in map(json.loads, lines) if r["split"] == "train"}
    assert trained == {"t/clean"}


def load_tasks_from(records: list[dict]):
    from mlx_rlaif.data.tasks import task_from_record

    return [task_from_record(r, r["id"]) for r in records]
