"""Run a repository's own tests once, in the sandbox, with the call recorder (recorder.py).

The repository is outside input and its tests run arbitrary code, so the test command runs in
the exec reward's sandbox (mlx_rlaif/sandbox): the repository and the interpreter's import path
bound read-only (under bwrap; readable under seatbelt; process mode relies on permissions and,
as root, on the run's own uid), the box the only writable place, no network, a wall-clock limit
(`timeout_s`) after which every process of the run is killed. Nothing is written into the
repository: bytecode writing is off, pytest's cache provider is disabled.

Bad input ends in one line (RepoError, exit 2): not a Python project, a test command that fails
before any change, one that does not end within the timeout, no function with recorded calls.

The repository's `src/` directory, where there is one, is on the import path (a src layout that
is not installed). Not covered: a test suite that needs the network, writable fixtures inside the repository, or
services (databases); a `sitecustomize` of the repository's environment (ours takes its place
for the run).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import UsageError
from ...sandbox import Limits, Sandbox
from ...terminal import visible
from .checked import Unreadable, checked_record, read_bytes
from .recorder import is_test_file

RECORDER = Path(__file__).with_name("recorder.py")
MAX_RECORD = 64 << 20  # bytes of one process's record read


class RepoError(UsageError):
    """The repository cannot be turned into tasks: one line, exit code 2."""


@dataclass
class Recording:
    functions: list[dict]  # merged over processes (recorder.py's records)
    skipped: dict[str, int]
    seconds: float
    output_tail: str
    sys_path: list[str] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # records dropped, by reason


def python_files(repo: Path) -> list[Path]:
    skip = {".git", ".venv", "venv", "node_modules", "build", "dist", ".tox", ".nox"}
    out = []
    for dirpath, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(files) if f.endswith(".py")]
    return out


def check_project(repo: Path) -> None:
    if not repo.is_dir():
        raise RepoError(f"{repo}: not a directory")
    marks = ("pyproject.toml", "setup.py", "setup.cfg")
    if not python_files(repo) or not any((repo / m).is_file() for m in marks) and not any(
            (repo / d / "__init__.py").is_file() for d in os.listdir(repo)):
        raise RepoError(f"{repo}: not a Python project (no .py files with a pyproject.toml, "
                        "setup.py, setup.cfg or a package directory)")


def interpreter_path(python: str) -> list[str]:
    """The interpreter's import path (its site-packages and the paths .pth files add), without
    the current directory: what the sandbox must let the repository's code read."""
    code = "import json, sys; print(json.dumps([p for p in sys.path if p]))"
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                           cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RepoError(f"--python {python}: does not run ({e})") from None
    if r.returncode != 0:
        raise RepoError(f"--python {python}: does not run: {r.stderr.strip()[-200:]}")
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, timeout=60, cwd="/").stdout.strip()
    paths = [p for p in json.loads(r.stdout) if os.path.isdir(p)]
    return [*paths, *([prefix] if prefix else [])]


def command_argv(command: str, python: str) -> list[str]:
    argv = shlex.split(command)
    if not argv:
        raise RepoError("--test-command is empty")
    if argv[0] in ("python", "python3"):
        argv[0] = python
    if "pytest" in argv[:3]:  # nothing written into the repository (.pytest_cache)
        argv += ["-p", "no:cacheprovider"]
    return argv


def record(repo: Path, command: str, python: str, timeout_s: float, max_calls: int,
           sandbox_mode: str = "auto", uid_base: int = 64000,
           say: Callable[[str], None] = print) -> Recording:
    """Run `command` in `repo` once under the recorder; the merged records of its processes."""
    repo = repo.resolve()
    check_project(repo)
    paths = interpreter_path(python)
    sandbox = Sandbox(sandbox_mode, slots=1, uid_base=uid_base, python=python,
                      ro_paths=[str(repo), *paths])
    argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(repo), *command_argv(command, python)]
    limits = Limits(timeout_s=timeout_s, cpu_s=int(timeout_s) + 1, memory_mb=4096,
                    file_size_mb=64, open_files=1024, processes=256, output_bytes=256 << 10)
    say(f"running the tests in the sandbox ({sandbox.mode}): {shlex.join(argv[4:])}")
    with sandbox.box() as box:
        box.write("sitecustomize.py", RECORDER.read_text())
        src = [str(repo / "src")] if (repo / "src").is_dir() else []  # a src/ layout
        env = {"PYTHONPATH": ":".join([box.inside, *src]), "PYTHONDONTWRITEBYTECODE": "1",
               "MLX_RLAIF_RECORD_REPO": str(repo), "MLX_RLAIF_RECORD_OUT": box.inside,
               "MLX_RLAIF_RECORD_MAX": str(max_calls), "PYTHONHASHSEED": "0"}
        r = sandbox.run(box, argv, limits, env=env)
        tail = visible((r.stdout + r.stderr).decode(errors="replace")[-2000:])
        if r.timed_out:
            raise RepoError(f"the test command did not end within --timeout {timeout_s:g} s "
                            "(killed): raise --timeout, or pass a --test-command that runs less")
        if not r.ok:
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "no output")
            raise RepoError(f"the repository's tests fail before any change ({r.describe()}): "
                            f"{last.strip()[:200]}")
        loaded, rejected = load_records(sorted(box.host.glob("record-*.json")))
    functions, skipped, bad = merge(loaded, repo)
    rejected.update(bad)
    if not any(f["calls"] for f in functions):
        raise RepoError("no function of the repository has recorded calls: the tests call no "
                        "module-level function with plain-data arguments and results")
    return Recording(functions, skipped, r.duration_s, tail, paths, dict(rejected))


def load_records(paths: list[Path]) -> tuple[list[dict], Counter]:
    """The record files the test processes wrote into the box (hostile: each a regular file of
    at most MAX_RECORD bytes holding a JSON object, else counted and left out)."""
    loaded, rejected = [], Counter()
    for p in paths:
        try:
            rec = json.loads(read_bytes(str(p), MAX_RECORD))
        except Unreadable as e:
            rejected[f"recorder output: {e}"] += 1
            continue
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict):
            loaded.append(rec)
        else:
            rejected["recorder output: a record file that is not a JSON object"] += 1
    return loaded, rejected


def merge(records: list[dict], repo: Path) -> tuple[list[dict], dict[str, int], Counter]:
    """One record per function over all processes (calls deduplicated, tests united); every
    record checked first (checked.py): (functions, skipped by the recorder, records dropped
    with their reason)."""
    root = str(repo.resolve()) + "/"
    is_test = lambda path: is_test_file(path, root)  # noqa: E731
    by: dict[tuple[str, str], dict] = {}
    skipped: dict[str, int] = {}
    rejected: Counter = Counter()
    for rec in records:
        counts = rec.get("skipped")
        for k, n in (counts.items() if isinstance(counts, dict) else ()):
            if type(n) is int and n >= 0:
                skipped[str(k)] = skipped.get(str(k), 0) + n
        functions = rec.get("functions")
        for raw in functions if isinstance(functions, list) else ():
            try:
                f = checked_record(raw, repo, is_test)
            except Unreadable as e:
                rejected[f"recorder output: {e}"] += 1
                continue
            key = (str(f["file"]), str(f["name"]))
            have = by.setdefault(key, {**f, "calls": [], "tests": [], "dropped": {}, "seen": 0})
            have["seen"] += int(f.get("seen", 0))
            for c in f.get("calls", []):
                if c not in have["calls"]:
                    have["calls"].append(c)
            for t in f.get("tests", []):
                if t not in have["tests"]:
                    have["tests"].append(t)
            for k, n in (f.get("dropped") or {}).items():
                have["dropped"][k] = have["dropped"].get(k, 0) + int(n)
    return sorted(by.values(), key=lambda f: (f["file"], f["line"])), skipped, rejected
