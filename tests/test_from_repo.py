"""`mlx-rlaif data from-repo`: a repository and its tests into verified tasks (issue 59).

The fixture repository (tests/data/repo_fixture: three modules, a pytest suite written for it)
is built into tasks through the CLI once per module; the references all pass through `score
--reward exec`, blank bodies all fail, whole modules are held out, a training run takes 2 steps
on them. Bad repositories end in one line with exit code 2. Hostile runs: the repository's
tests and the student's function cannot write into the repository, and the student cannot read
outside it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlx_rlaif.data.from_repo.mutate import blank_bodies, mutants
from mlx_rlaif.data.from_repo.tasks import cut, definition, split_by_module, stub
from mlx_rlaif.rewards.exec.repo import splice, student_program

FIXTURE = Path(__file__).parent / "data" / "repo_fixture"
UIDS = ["--set", "reward.exec.uid_base=64700"]  # apart from other suites' sandbox uids


def bwrap() -> bool:
    from mlx_rlaif.sandbox import Sandbox

    try:
        return Sandbox("auto").mode == "bwrap"
    except Exception:  # noqa: BLE001 - no sandbox here at all
        return False


needs_bwrap = pytest.mark.skipif(not bwrap(), reason="read-only binds need the bwrap sandbox")


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# --- pure parts -----------------------------------------------------------------------------------

CLAMP = (FIXTURE / "minitext" / "numbers.py").read_text()


def test_mutants_change_one_place_each_and_never_the_docstring():
    _, source = definition(CLAMP, "clamp")
    ms = mutants(source, "clamp", 100)
    assert len(ms) >= 8 and len(set(ms)) == len(ms)
    for m in ms:
        compile(m, "m", "exec")
        assert '"""`x` limited to the range [lo, hi]."""' in m
    assert any("lo >= hi" in m for m in ms) and any("pass" in m for m in ms)
    assert mutants(source, "clamp", 3) == mutants(source, "clamp", 3)  # seeded
    blanks = blank_bodies(source, "clamp")
    assert [b.splitlines()[-1].strip() for b in blanks] == [
        "pass", "return None", "raise NotImplementedError"]


def test_the_prompt_keeps_the_signature_docstring_and_the_rest_of_the_module():
    node, _ = definition(CLAMP, "mean")
    out, start = stub(CLAMP, node)
    text = "\n".join(out)
    assert 'def mean(values):\n    """The arithmetic mean of `values`' in text
    assert "return sum(values) / len(values)" not in text
    assert "def gcd(a, b):" in text and "a, b = b, a % b" in text  # other definitions kept
    short = cut(out, start, 6)
    assert "def mean(values):" in short and "lines above cut" in short and len(
        short.splitlines()) == 8


def test_the_student_function_replaces_only_its_own_definition():
    answer = "import math\n\ndef gcd(a, b):\n    return math.gcd(a, b)\n"
    spliced = splice(CLAMP, "gcd", answer)
    assert "return math.gcd(a, b)" in spliced and "a, b = b, a % b" not in spliced
    assert "def clamp(x, lo, hi):" in spliced and "def digits(n, base=10):" in spliced
    assert splice(CLAMP, "gcd", "def other():\n    pass\n") is None
    repo = {"path": "/r", "file": "minitext/numbers.py", "module": "minitext.numbers",
            "root": "/r", "source": CLAMP, "sys_path": []}
    assert "NameError" in student_program(repo, "gcd", "x = 1\n")
    assert student_program(repo, "gcd", "def gcd(:\n") == "def gcd(:\n"  # the build says why


def test_recorded_calls_must_be_literals_before_they_become_checker_code():
    from mlx_rlaif.data.from_repo.tasks import literal_call

    assert literal_call({"args": "(1, [2])", "kwargs": "{'k': 3}", "returns": "(4,)"})
    assert literal_call({"args": "()", "kwargs": "{}", "raises": "ValueError"})
    forged = "__import__('os').system('x')"
    assert not literal_call({"args": forged, "kwargs": "{}", "returns": "1"})
    assert not literal_call({"args": "()", "kwargs": "{}", "returns": forged})
    assert not literal_call({"args": "()", "kwargs": "{}", "raises": "E); import os; ("})
    assert not literal_call({"args": "[1]", "kwargs": "{}", "returns": "1"})  # not a tuple


def test_eval_holds_out_whole_modules():
    recs = [{"id": f"{m}:{i}", "repo": {"module": m}} for m in ("a", "b", "c") for i in range(4)]
    train, evals = split_by_module(recs, 0.3)
    assert evals and train
    assert not {r["repo"]["module"] for r in train} & {r["repo"]["module"] for r in evals}
    assert split_by_module(recs, 0.0) == (recs, [])
    assert split_by_module(recs, 0.99)[0]  # one module always trains


# --- the CLI on the fixture repository -------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("from_repo") / "tasks.jsonl"
    r = cli("data", "from-repo", str(FIXTURE), "--out", str(out), "--eval-frac", "0.3",
            "--max-mutants", "5", *UIDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mutation score (measured" in r.stdout and "held out (whole modules)" in r.stdout
    return out


@needs_bwrap
def test_from_repo_tasks_pass_with_their_reference_and_fail_empty(built: Path, tmp_path: Path):
    train, evals = lines(built), lines(built.with_name("tasks.eval.jsonl"))
    summary = json.loads(built.with_name("tasks.summary.json").read_text())
    assert summary["functions_found"] == 13 and summary["called"] == 12
    assert summary["not_called"] == 1  # initials()
    assert len(train) + len(evals) == summary["kept"] >= 8
    assert not {t["repo"]["module"] for t in train} & {t["repo"]["module"] for t in evals}
    for t in train + evals:
        assert t["gate"]["mutation_score"] >= 0.6 and t["gate"]["blank_bodies_fail"]
        assert t["repo"]["file"].startswith("minitext/") and t["calls"] and t["repo_tests"]
        assert t["solution"].startswith(f"def {t['entry_point']}(")
    scored = tmp_path / "in.jsonl"
    rows = []
    for t in train + evals:
        rows.append({**t, "id": t["id"] + "#ref", "completion": t["solution"]})
        for k, blank in enumerate(blank_bodies(t["solution"], t["entry_point"])):
            rows.append({**t, "id": f"{t['id']}#blank{k}", "completion": blank})
    scored.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("score", "--file", str(scored), "--out", str(tmp_path / "out.jsonl"), "--reward",
            "exec", *UIDS)
    assert r.returncode == 0, r.stdout + r.stderr
    out = lines(tmp_path / "out.jsonl")
    refs = [o for o in out if o["id"].endswith("#ref")]
    blanks = [o for o in out if "#blank" in o["id"]]
    assert refs and all(o["details"]["passed"] == o["details"]["total"] for o in refs), [
        o["reason"] for o in refs]
    assert len(blanks) == 3 * len(refs)
    assert all(o["reward"] is not None and o["details"]["passed"] < o["details"]["total"]
               for o in blanks)
    ov = cli("data", "overlap", str(built), str(built.with_name("tasks.eval.jsonl")))
    assert ov.returncode == 0, ov.stderr


@needs_bwrap
@pytest.mark.slow
def test_two_training_steps_on_repository_tasks(built: Path, micro_model: Path, tmp_path: Path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(micro_model),
           "--train-file", str(built), "--output-dir", str(out), "--max-steps", "2",
           "--set", "reward.type=exec", "--set", "generation.max_new_tokens=8",
           "--set", "generation.num_samples_per_prompt=2", "--set", "rl.drop_zero_std=false",
           *UIDS]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = lines(out / "batches.jsonl")
    assert len(steps) == 2 and all(s["reward/mean"] is not None for s in steps)


# --- bad repositories: one line, exit code 2 --------------------------------------------------------


def copy_fixture(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    return repo


def one_line_error(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert err and words in err[-1], r.stderr


def test_not_a_python_project(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no code here\n")
    r = cli("data", "from-repo", str(tmp_path / "empty"), "--out", str(tmp_path / "t.jsonl"))
    one_line_error(r, "not a Python project")


def test_the_task_file_is_never_written_into_the_repository(tmp_path: Path):
    repo = copy_fixture(tmp_path)
    r = cli("data", "from-repo", str(repo), "--out", str(repo / "tasks.jsonl"))
    one_line_error(r, "inside the repository, which is never written")
    assert not (repo / "tasks.jsonl").exists()


@needs_bwrap
def test_tests_that_fail_before_any_change_and_a_hanging_command(tmp_path: Path):
    repo = copy_fixture(tmp_path)
    test = repo / "tests" / "test_lists.py"
    test.write_text(test.read_text() + "\n\ndef test_broken():\n    assert False\n")
    out = str(tmp_path / "t.jsonl")
    r = cli("data", "from-repo", str(repo), "--out", out, *UIDS)
    one_line_error(r, "tests fail before any change")
    assert "1 failed" in r.stderr or "test_broken" in r.stderr, r.stderr  # pytest's own line
    hang = "python -c 'import time; time.sleep(600)'"
    r = cli("data", "from-repo", str(repo), "--out", out, "--test-command", hang, "--timeout",
            "2", *UIDS, timeout=120)
    one_line_error(r, "did not end within --timeout 2 s")


@needs_bwrap
def test_no_function_with_recorded_calls(tmp_path: Path):
    repo = tmp_path / "quiet"
    (repo / "quiet").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'quiet'\n")
    (repo / "quiet" / "__init__.py").write_text("def unused(x):\n    return x\n")
    (repo / "test_quiet.py").write_text("def test_nothing():\n    assert 1 + 1 == 2\n")
    r = cli("data", "from-repo", str(repo), "--out", str(tmp_path / "t.jsonl"), *UIDS)
    one_line_error(r, "no function of the repository has recorded calls")


# --- hostile: nothing of the repository is writable, nothing outside it is visible ---------------


@needs_bwrap
def test_the_repository_tests_cannot_write_into_the_repository(tmp_path: Path):
    repo = copy_fixture(tmp_path)
    (repo / "tests" / "test_zz_write.py").write_text(textwrap.dedent("""
        import os

        def test_write():
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            with open(os.path.join(here, "minitext", "planted.py"), "w") as f:
                f.write("x = 1\\n")
    """))
    r = cli("data", "from-repo", str(repo), "--out", str(tmp_path / "t.jsonl"), *UIDS)
    one_line_error(r, "tests fail before any change")
    assert not (repo / "minitext" / "planted.py").exists()
    assert not list(repo.rglob("__pycache__")) and not (repo / ".pytest_cache").exists()


@needs_bwrap
def test_the_student_cannot_write_the_repository_or_read_outside_it(built: Path):
    from mlx_rlaif.config import load
    from mlx_rlaif.data import task_from_record
    from mlx_rlaif.rewards.exec import ExecReward

    rec = next(t for t in lines(built) + lines(built.with_name("tasks.eval.jsonl"))
               if t["entry_point"] == "gcd")
    task = task_from_record(rec, rec["id"])
    target = Path(rec["repo"]["path"]) / rec["repo"]["file"]
    before = target.read_bytes()
    outside = Path(__file__).resolve().parents[1] / "pyproject.toml"  # this project's, not theirs
    # gcd itself when contained, a wrong answer (-1) as soon as one attempt succeeds
    hostile = textwrap.dedent(f"""
        def gcd(a, b):
            for path in ({str(target)!r}, {str(target.parent / 'planted.py')!r}):
                try:
                    with open(path, "a") as f:
                        f.write("# changed")
                    return -1
                except OSError:
                    pass
            try:
                open({str(outside)!r}).read()
                return -1
            except OSError:
                pass
            a, b = abs(a), abs(b)
            while b:
                a, b = b, a % b
            return a
    """)
    cfg = load(None, ["reward.exec.uid_base=64700"])
    reward = ExecReward(cfg.reward.exec, languages={"python"})
    try:
        r = reward.score([task], [hostile])[0]
    finally:
        reward.close()
    assert r.value is not None and r.details["passed"] == r.details["total"], r.reason
    assert target.read_bytes() == before and not (target.parent / "planted.py").exists()


WALKER = r"""
import os
import re


def gcd(a, b):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = ""
    for where, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                text += open(os.path.join(where, f)).read()
    for x, y, r in re.findall(r"\((-?\d+), (-?\d+)\) == (-?\d+)", text):
        if (int(x), int(y)) == (a, b):
            return int(r)
    return 1
"""


@needs_bwrap
def test_an_answer_that_walks_the_repository_to_its_tests_is_flagged(built: Path):
    """Red team 3: the repository is given to the student's run to import from; reading its
    test files for the expected values scored 1.0 with no signal."""
    from mlx_rlaif.config import load
    from mlx_rlaif.data import task_from_record
    from mlx_rlaif.rewards import signals as hacks
    from mlx_rlaif.rewards.exec import ExecReward

    rec = next(t for t in lines(built) + lines(built.with_name("tasks.eval.jsonl"))
               if t["entry_point"] == "gcd")
    task = task_from_record(rec, rec["id"])
    cfg = load(None, ["reward.exec.uid_base=64700"])
    reward = ExecReward(cfg.reward.exec, languages={"python"})
    try:
        walker, honest = reward.score([task, task], [WALKER, rec["solution"]])
    finally:
        reward.close()
    assert {"reads_outside", "lists_outside"} & set(hacks.names_of(walker)), walker.details
    assert not hacks.names_of(honest), honest.details


@needs_bwrap
def test_a_read_only_path_under_tmp_is_not_hidden_by_the_private_tmp(tmp_path: Path):
    """Failing first: bwrap bound it before mounting the private /tmp over it (a repository in
    /tmp could not be entered)."""
    from mlx_rlaif.sandbox import Limits, Sandbox

    (tmp_path / "data.txt").write_text("visible\n")
    tmp_path.chmod(0o755)
    sandbox = Sandbox("bwrap", slots=1, uid_base=64700)
    sandbox.also_read([str(tmp_path)])
    with sandbox.box() as box:
        r = sandbox.run(box, ["/bin/sh", "-c", f"cat {tmp_path}/data.txt; echo x > "
                              f"{tmp_path}/data.txt"], Limits())
    assert r.stdout == b"visible\n", r.stderr
    assert (tmp_path / "data.txt").read_text() == "visible\n"  # read-only


# --- hostile: what the recorder writes and what the repository holds (red team 3) ----------------

FORGE = """
import atexit, sys
def _forge():
    fs = sys.modules["sitecustomize"].functions
    base = {"calls": [{"args": "(3,)", "kwargs": "{}", "returns": "3"},
                      {"args": "('q',)", "kwargs": "{}", "returns": "'q'"}],
            "seen": 2, "dropped": {}, "line": 1, "root": REPO}
    fs[("/x1", "leak")] = dict(base, file="../secret.py", name="leak", module="pkg.core",
                              tests=[])
    fs[("/x2", "leak")] = dict(base, file="pkg/evil.py", name="leak", module="pkg.core",
                              tests=[])
    for k, v in list(fs.items()):
        if v["name"] == "double":
            v["tests"].append(["os", "/", "getcwd", "tests/test_core.py"])
atexit.register(_forge)
"""


def hostile_repo(tmp_path: Path) -> Path:
    import os

    repo = tmp_path / "hostile"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "core.py").write_text(
        "def double(x):\n    return x * 2\n\n\ndef same(x):\n    return x\n\n\n"
        "def leak(x):  # what the forged records name, so that the gate passes them\n"
        "    return x\n")
    (repo / "tests" / "test_core.py").write_text(
        "from pkg.core import double, same\n\n\ndef test_double():\n    assert double(2) == 4\n"
        "    assert double(3) == 6\n    assert double('a') == 'aa'\n\n\n"
        "def test_same():\n    assert same(3) == 3\n    assert same('q') == 'q'\n")
    (repo / "conftest.py").write_text(f"REPO = {str(repo)!r}\n" + FORGE)
    secret = "def leak(x):\n    return x  # SECRET-MARKER-59\n"
    (tmp_path / "secret.py").write_text(secret)  # outside the repository
    (tmp_path / "secret.py").chmod(0o600)
    os.symlink(tmp_path / "secret.py", repo / "pkg" / "evil.py")
    os.mkfifo(repo / "pkg" / "fifo.py")
    os.symlink("/dev/zero", repo / "pkg" / "zero.py")
    return repo


@needs_bwrap
def test_forged_records_fifos_and_devices_never_reach_the_task_file(tmp_path: Path):
    repo = hostile_repo(tmp_path)
    out = tmp_path / "t.jsonl"
    r = cli("data", "from-repo", str(repo), "--out", str(out), "--max-mutants", "3",
            "--min-mutation-score", "0", *UIDS, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    tasks = out.read_text()
    assert "SECRET-MARKER-59" not in tasks and "getcwd" not in tasks
    names = {t["entry_point"] for t in lines(out)}
    assert names <= {"double", "same"} and "double" in names
    for t in lines(out):
        assert all(x["name"].startswith("test_") for x in t["repo_tests"])
    dropped = json.loads((tmp_path / "t.summary.json").read_text())["dropped"]
    assert sum(n for k, n in dropped.items() if "outside the repository" in k) == 2, dropped


def test_every_output_path_is_checked_like_out(tmp_path: Path):
    repo = copy_fixture(tmp_path)
    before = (repo / "minitext" / "numbers.py").read_text()
    for eval_out in (repo / "minitext" / "numbers.py", repo / "held.jsonl"):
        r = cli("data", "from-repo", str(repo), "--out", str(tmp_path / "t.jsonl"),
                "--eval-out", str(eval_out), "--eval-frac", "0.3")
        one_line_error(r, "--eval-out")
        assert "inside the repository, which is never written" in r.stderr
    r = cli("data", "from-repo", str(repo), "--out", str(tmp_path / "t.jsonl"),
            "--eval-out", str(tmp_path))
    one_line_error(r, "is a directory")
    assert (repo / "minitext" / "numbers.py").read_text() == before
    assert not (repo / "held.jsonl").exists() and not (tmp_path / "t.jsonl").exists()


@needs_bwrap
def test_a_repository_without_any_task_is_an_error_and_nothing_is_written(tmp_path: Path):
    repo = tmp_path / "weak"
    (repo / "weak").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'weak'\n")
    (repo / "weak" / "__init__.py").write_text(
        "def inc(x):\n    if x > 100:\n        return x + 2\n    return x + 1\n")
    (repo / "test_weak.py").write_text(
        "from weak import inc\n\n\ndef test_inc():\n    assert inc(1) == 2\n")
    out = tmp_path / "t.jsonl"
    r = cli("data", "from-repo", str(repo), "--out", str(out), "--min-mutation-score", "1",
            "--max-mutants", "5", *UIDS)
    one_line_error(r, "no task could be built from the repository")
    assert list(tmp_path.iterdir()) == [repo]


def test_form_feeds_do_not_shift_the_lines_of_a_definition():
    src = "def f(x):\n    y = x + 1\n    \x0c\n    return y\n\n\ndef g(x):\n    return x\n"
    assert definition(src, "g")[1] == "def g(x):\n    return x\n"
    assert definition(src, "f")[1] == "def f(x):\n    y = x + 1\n    \x0c\n    return y\n"
    assert splice(src, "g", "def g(x):\n    return 2\n").endswith(
        "\n\n\ndef g(x):\n    return 2\n")
    node, _ = definition(src, "f")
    assert stub(src, node)[0][:2] == ["def f(x):", "    ..."]


@needs_bwrap
def test_sources_with_a_coding_cookie_a_bom_or_a_form_feed_become_tasks(tmp_path: Path):
    repo = tmp_path / "enc"
    (repo / "enc").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'enc'\n")
    (repo / "enc" / "__init__.py").write_text("")
    (repo / "enc" / "latin.py").write_bytes(
        "# -*- coding: latin-1 -*-\n\"\"\"caf\u00e9\"\"\"\n\n\ndef shout(s):\n"
        "    return s.upper() + '!'\n".encode("latin-1"))
    (repo / "enc" / "bom.py").write_bytes(
        b"\xef\xbb\xbfdef twice(s):\n    return s + s\n")
    (repo / "enc" / "ff.py").write_text(
        "def third(x):\n    y = x * 3\n    \x0c\n    return y\n")
    (repo / "test_enc.py").write_text(
        "from enc.latin import shout\nfrom enc.bom import twice\nfrom enc.ff import third\n\n\n"
        "def test_all():\n    assert shout('a') == 'A!' and shout('b') == 'B!'\n"
        "    assert twice('a') == 'aa' and twice('xy') == 'xyxy'\n"
        "    assert third(2) == 6 and third(5) == 15\n")
    out = tmp_path / "t.jsonl"
    r = cli("data", "from-repo", str(repo), "--out", str(out), "--min-mutation-score", "0",
            "--max-mutants", "3", *UIDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {t["entry_point"] for t in lines(out)} == {"shout", "twice", "third"}, r.stdout


def test_a_symlink_loop_in_the_repository_is_skipped(tmp_path: Path):
    import os

    from mlx_rlaif.data.from_repo import is_test_path
    from mlx_rlaif.data.from_repo.record import python_files
    from mlx_rlaif.data.from_repo.tasks import defined_functions

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f(x):\n    return x\n")
    os.symlink("loop.py", tmp_path / "pkg" / "loop.py")
    assert defined_functions(tmp_path, python_files(tmp_path), is_test_path(tmp_path)) == (1, 0)
