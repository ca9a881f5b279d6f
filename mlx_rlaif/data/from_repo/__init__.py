"""Tasks from a Python repository and its own tests (`mlx-rlaif data from-repo`).

    record.py    run the repository's test command once in the sandbox, the repository
                 read-only, with recorder.py loaded into every test process: each module-level
                 function's calls (plain-data arguments, result or exception type, a bound per
                 function) and the repository's test functions that called it
    tasks.py     one task per recorded function: its module with the body removed as the
                 prompt, the original as the solution, the calls and tests as a checker
    gate.py      the quality gate through the exec reward itself: the original passes, blank
                 bodies fail, the checks kill at least `min_score` of simple mutants (mutate.py)
    (here)       the whole build, the summary, and the split by module

What is covered: pure-Python repositories whose tests run with pytest or another command on
one machine, module-level functions (sync), values that are plain data (None, bool, int, finite
float, str, list, tuple, non-empty set, dict). Not covered: methods, generators and coroutines,
functions only exercised with objects, repository-level (multi-file) tasks, other languages.
Nothing leaves the machine: the sandbox has no network, and the only files written are the
task files.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checked import Unreadable, read_source
from .gate import distribution, gate
from .record import RepoError, python_files, record
from .recorder import is_test_file
from .tasks import defined_functions, git_commit, make_task, split_by_module

__all__ = ["Options", "RepoError", "build"]


@dataclass(frozen=True)
class Options:
    repo: Path
    test_command: str = "python -m pytest -x -q"
    python: str = ""
    timeout_s: float = 600.0
    max_calls: int = 20  # recorded per function
    max_tests: int = 10  # recorded calls kept per task
    context_lines: int = 200
    max_mutants: int = 20
    min_score: float = 0.6
    eval_frac: float = 0.0
    id_prefix: str = ""
    sandbox: str = "auto"  # reward.exec.sandbox
    uid_base: int = 64000  # reward.exec.uid_base


def is_test_path(repo: Path) -> Callable[[str], bool]:
    root = os.path.realpath(repo) + "/"
    return lambda path: is_test_file(path, root)


def build(opts: Options, score: Callable, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole build: record, make tasks, gate, split. `score(tasks, completions)` is the exec
    reward's. Returns {"train", "eval", "summary"}."""
    t0 = time.monotonic()
    repo = opts.repo.resolve()
    rec = record(repo, opts.test_command, opts.python, opts.timeout_s, opts.max_calls,
                 opts.sandbox, opts.uid_base, say=say)
    files = python_files(repo)
    top, inner = defined_functions(repo, files, is_test_path(repo))
    called = [f for f in rec.functions if f["calls"] or f["tests"]]
    say(f"recorded: {len(rec.functions)} functions called by the tests "
        f"({sum(len(f['calls']) for f in rec.functions)} distinct calls) in "
        f"{rec.seconds:.1f} s")
    commit = git_commit(repo)
    prefix = opts.id_prefix or f"{repo.name}:"
    drops: Counter = Counter(rec.rejected)
    records = []
    for f in called:
        try:
            source = read_source(repo, f["file"])
        except Unreadable as e:
            drops[f"source not read: {e}"] += 1
            continue
        try:
            records.append(make_task(f, repo, source, commit=commit, sys_path=rec.sys_path,
                                     context_lines=opts.context_lines,
                                     max_tests=opts.max_tests, id_prefix=prefix))
        except (LookupError, SyntaxError, ValueError):
            drops["source not found as a top-level def"] += 1
        except KeyError:
            drops["no import root recorded"] += 1
    gated = gate(records, score, opts.max_mutants, opts.min_score, say=say)
    drops.update(gated.dropped)
    train, evals = split_by_module(gated.kept, opts.eval_frac)
    not_called = max(0, top - len(called))
    summary = {
        "repo": str(repo), "commit": commit, "functions_found": top,
        "methods_and_nested": inner, "called": len(called), "not_called": not_called,
        "tasks_built": len(records), "kept": len(gated.kept), "train": len(train),
        "eval": len(evals), "dropped": dict(drops), "checks_dropped": gated.checks_dropped,
        "recorder_skipped": rec.skipped,
        "mutation_scores": distribution(gated.scores),
        "kept_mutation_scores": distribution([r["gate"]["mutation_score"] for r in gated.kept]),
        "test_seconds": round(rec.seconds, 2), "seconds": round(time.monotonic() - t0, 2)}
    return {"train": train, "eval": evals, "summary": summary}
