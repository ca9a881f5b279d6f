"""The exec reward: run the student's code against the task's tests in a sandbox (mlx_rlaif.sandbox).

Value = build_weight * builds + tests_weight * (fraction of tests passed). `builds` is 1 when the
Python parses (checked in the trainer, never run) or the C++/Rust compiles (compiled in the
sandbox), and never for a completion with no code of its own (an empty body completing a
HumanEval-style stub parses, and RL finds that 0.1 beats a wrong attempt's 0 within 20 steps). Each test's verdict and the reason of each failure (wrong_answer, timeout, crash,
build_error) are in `Reward.details["tests"]`. The value is None only when we could not score:
the sandbox failed, the task has no tests we understand, its language has no toolchain here.

Task formats (docs/task-formats.md):
- HumanEval: `prompt`, `entry_point`, `test` defining `check(candidate)`. Each top-level statement
  of `check` that contains an `assert` is one test unit (so partial credit exists); all units pass
  exactly when the original `check` passes.
- function calls: `entry_point` and `tests: [{"args": [...], "expected": ...}]` (Python).
- programs: `tests: [{"stdin": "...", "stdout": "..."}]` (Python, C++, Rust): one sandbox, a fresh
  process per test (mlx_rlaif/sandbox/runs.py);
  after a test times out the rest are not run (they count as timeouts).
With `tests_credit: all` the first failing test decides the reward, so a completion's tests stop
there (the rest reported as `not_run`, counted as failed in `parts["tests"]`); multi-turn
feedback asks for every visible test (`score(..., every_test=True)`). Each distinct answer runs
once: completions of the same task with the same extracted code (trailing whitespace aside)
share one result, within a call, across groups in flight, and across steps through a bounded
cache (`reward.exec.cache_size`; `details["served"]` says which; `reward/exec_served_frac`).
A Python completion that does not define `entry_point` is appended to the prompt when the prompt
is itself code (completion style, as in HumanEval); one that does gets the prompt's imports. The
task's `preamble` goes before the program. An entry point `Class.method` is that method of one
instance of the class (harness.py).

The verdict cannot be forged by the student. Its code runs in its own sandboxed process as a
function server (harness.py, which also holds the wire format). HumanEval's `check(candidate)` runs in a second, separate
sandbox where `candidate` is a proxy: every call is sent to the student's process and the answer
comes back as plain JSON data (tuples, sets and dicts tagged), so `check` compares plain values.
Function-call tests are compared in the trainer the same way; program tests compare the captured
stdout in the trainer. A test passes only on a verdict from trusted code: `sys.exit(0)`,
`os._exit(0)`, exceptions, printed markers, patched builtins or test frameworks, and objects whose
`__eq__` always returns True never produce one. The student's process cannot reach the checker's
(another uid or pid namespace; see mlx_rlaif/sandbox for where that holds).

Not covered: in-place mutation of arguments (the checker does not see the student's copies),
arguments or return values that are not plain data (functions, class instances, generators:
such a test fails), HumanEval tests that inspect the candidate object itself, C++/Rust function
tests (use stdin/stdout programs), floating-point output of programs compared as numbers (it is
compared as text after stripping trailing whitespace).

Layout: this module runs processes (toolchains, builds, the three runners, the thread pool);
tasks.py holds the pure parts (formats, program assembly, `check` instrumentation,
comparisons, the Reward); harness.py is the code that runs inside the sandboxes; pch.py the
precompiled headers C++ builds use with GCC on Linux (`reward.exec.cpp_pch`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import select
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import ExecConfig
from ...errors import ConfigError
from ...records import Reward, Task, extract_code
from ...sandbox import Box, Limits, Running, Sandbox, SandboxError, seatbelt
from ...sandbox.runs import PROGRAM, run_each
from ..signals import NAMES, penalize
from . import harness as wire
from . import pch
from . import signals as hacks
from .cores import Cores
from .repo import is_repo_task, read_paths
from .tasks import (
    Unscorable,
    instrument_check,
    judge_output,
    make_reward,
    prompt_code,
    python_program,
    result,
    same_value,
    short,
    syntax_error,
    task_format,
    unit_results,
)
from .watch import RunsWatch, answered_calls, answered_units, watched, watched_runs

log = logging.getLogger(__name__)

LANGUAGES = ("python", "cpp", "rust")
HARNESS = Path(wire.__file__).read_text()
_SOURCE = {"python": "solution.py", "cpp": "solution.cpp", "rust": "solution.rs"}


@dataclass(frozen=True)
class Toolchain:
    language: str
    compiler: str | None  # None: interpreted (Python)
    flags: tuple[str, ...] = ()
    home: str | None = None  # directory to bind read-only (toolchains outside /usr)
    env: tuple[tuple[str, str], ...] = ()  # the build's environment (macOS: SDKROOT)


# --- toolchains ------------------------------------------------------------------------------


def find_toolchain(language: str, cfg: ExecConfig) -> Toolchain | str:
    """The toolchain for `language`, or a one-line reason why there is none."""
    if language == "python":
        return Toolchain("python", None)
    if language == "cpp":
        names = [cfg.cpp_compiler] if cfg.cpp_compiler else ["g++", "clang++"]
        exe = next((p for p in map(_which, names) if p), None)
        if exe is None:
            return (f"no C++ compiler ({' or '.join(names)}) on PATH: install g++ "
                    "(apt-get install g++) or set reward.exec.cpp_compiler")
        # macOS: the compiler an xcrun shim stands for, and the SDK (sandbox/seatbelt.py)
        real, extra, env = seatbelt.mac_build("cpp", os.path.realpath(exe),
                                              seatbelt.developer_dir())
        home = None if real.startswith("/usr/") else _install_dir(real)
        return Toolchain("cpp", real, (*cfg.cpp_flags, *extra), home, env)
    if language == "rust":
        rustc = _which("rustc") or _which(str(Path.home() / ".cargo/bin/rustc"))
        if rustc is None:
            return "no rustc on PATH or in ~/.cargo/bin: install Rust (rustup or apt-get install rustc)"
        sysroot = _rust_sysroot(rustc)
        if sysroot is None:
            return f"{rustc} --print sysroot failed: check the Rust installation"
        real = str(Path(sysroot) / "bin" / "rustc")
        home = None if sysroot.startswith("/usr") else sysroot
        _, extra, env = seatbelt.mac_build("rust", real, seatbelt.developer_dir())  # its linker
        return Toolchain("rust", real if os.path.exists(real) else rustc,
                         (*cfg.rust_flags, *extra), home, env)
    return f"unknown language {language!r}: the exec reward runs {', '.join(LANGUAGES)}"


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)  # not resolved: rustup's proxies dispatch on their own name


def _install_dir(exe: str) -> str:
    return str(Path(os.path.realpath(exe)).parent.parent)


def _rust_sysroot(rustc: str) -> str | None:
    try:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        r = subprocess.run([rustc, "--print", "sysroot"], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return os.path.realpath(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


# --- the reward ----------------------------------------------------------------------------------


class ExecReward:
    """Runs each completion's tests in a sandbox; scores a batch on a bounded thread pool."""

    name = "exec"

    def __init__(self, cfg: ExecConfig, languages: set[str] | None = None,
                 cores: Cores | None = None):
        """`cores` (cores.py): with `reward.exec.workers` 0, the pool's size and its limit while
        decoding runs beside scoring (train); else `workers` (0: every core) at all times."""
        self.cfg = cfg
        check_penalty(cfg)
        if cfg.workers or cores is None:
            cores = Cores(cfg.workers or os.cpu_count() or 1)
        self.cores = cores
        self.workers = cores.total
        self.toolchains: dict[str, Toolchain] = {}
        self._missing: dict[str, str] = {}
        for lang in LANGUAGES if languages is None else sorted(languages):
            found = find_toolchain(lang, cfg)
            if isinstance(found, Toolchain):
                self.toolchains[lang] = found
            elif languages is not None:
                raise ConfigError(f"tasks in {lang} need a toolchain: {found}")
            else:
                self._missing[lang] = found
        homes = [t.home for t in self.toolchains.values() if t.home]
        self.sandbox = Sandbox(cfg.sandbox, slots=2 * self.workers, uid_base=cfg.uid_base,
                               python=cfg.python, ro_paths=homes)
        for t in list(self.toolchains.values()):
            if t.compiler and not self.sandbox.reachable(t.compiler):
                why = (f"{t.compiler} is not readable by the sandbox user in "
                       f"{self.sandbox.mode} mode: install it system-wide or use sandbox: bwrap")
                if languages is not None:
                    raise ConfigError(f"tasks in {t.language} need a toolchain: {why}")
                del self.toolchains[t.language]
                self._missing[t.language] = why
        level = logging.WARNING if self.sandbox.mode == "process" else logging.INFO
        log.log(level, "exec reward: sandbox %s, %d workers, languages %s",
                self.sandbox.describe(), self.workers, ", ".join(sorted(self.toolchains)))
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="exec-reward")
        self._lock = threading.Lock()
        self._pch_lock = threading.Lock()
        self._pch: dict[str, str | None] = {}  # compiler -> precompiled headers (pch.py)
        self._counts = {"completions": 0, "unscorable": 0, "timeouts": 0, "build_errors": 0,
                        "seconds": 0.0, "shared": 0, "cached": 0}
        self._cache = Answers(cfg.cache_size)

    # RewardFn ------------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task], completions: Sequence[str], *,
              every_test: bool = False) -> list[Reward]:
        """The rewards of `completions` on `tasks`. Each distinct answer (task, extracted code)
        runs once: a copy scored in this call or in flight (another group) shares its result,
        and one scored before comes from the bounded cache (`reward.exec.cache_size`).
        `every_test`: run every test even where `tests_credit: all` has its answer at the
        first failure (multi-turn feedback reports them all)."""
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        stop = self.cfg.tests_credit == "all" and not every_test
        futures = [self._answer(t, c, stop) for t, c in zip(tasks, completions, strict=True)]
        return [f.result() for f in futures]

    def _answer(self, task: Task, completion: str, stop: bool) -> Future[Reward]:
        """A future of the reward: the cached one, the one in flight, or a new run."""
        key = answer_key(task, completion, stop)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._counts["completions"] += 1
                self._counts["cached"] += 1
                done: Future[Reward] = Future()
                done.set_result(served(hit, "cached"))
                return done
            shared = self._cache.inflight.get(key)
            if shared is not None:
                self._counts["completions"] += 1
                self._counts["shared"] += 1
                return _then(shared, lambda r: served(r, "shared"))
            future = self._pool.submit(self.score_one, task, completion, stop)
            self._cache.inflight[key] = future
        future.add_done_callback(lambda f: self._settle(key, f))
        return future

    def _settle(self, key: str, future: Future[Reward]) -> None:
        with self._lock:
            self._cache.inflight.pop(key, None)
            if not future.cancelled() and future.exception() is None:
                self._cache.put(key, future.result())

    def metrics(self) -> dict[str, float]:
        with self._lock:
            out = {f"exec/{k}": float(v) for k, v in self._counts.items()}
        # a fraction: averaged over ranks (train/distributed_metrics.py sums exec/ counters)
        out["reward/exec_served_frac"] = (out["exec/shared"] + out["exec/cached"]) / max(
            out["exec/completions"], 1.0)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # one completion ---------------------------------------------------------------------------

    def score_one(self, task: Task, completion: str, stop: bool = False) -> Reward:
        """One completion's reward, run in the sandbox; `stop`: its tests end at the first
        failure (the rest reported as not run), where that failure already decides it."""
        with self.cores.slot():
            return self._scored(task, completion, stop)

    def _scored(self, task: Task, completion: str, stop: bool) -> Reward:
        t0 = time.monotonic()
        try:
            reward = self._score(task, completion, stop)
        except (Unscorable, SandboxError) as e:
            reward = Reward(None, {"builds": None, "tests": None}, f"unscorable: {e}",
                            {"sandbox": self.sandbox.mode})
        except Exception as e:  # a bug of ours must not pass for the student's failure
            log.exception("exec reward failed on task %s", task.id)
            reward = Reward(None, {"builds": None, "tests": None},
                            f"unscorable: internal error {type(e).__name__}: {e}", {})
        self._count(reward, time.monotonic() - t0)
        return reward

    def _count(self, reward: Reward, seconds: float) -> None:
        tests = reward.details.get("tests", [])
        with self._lock:
            c = self._counts
            c["completions"] += 1
            c["unscorable"] += reward.value is None
            c["timeouts"] += any(t["reason"] == "timeout" for t in tests)
            c["build_errors"] += reward.parts.get("builds") == 0.0
            c["seconds"] += seconds

    def _score(self, task: Task, completion: str, stop: bool = False) -> Reward:
        fmt = task_format(task)
        tc = self.toolchains.get(task.language)
        if tc is None:
            why = self._missing.get(task.language, f"language {task.language!r} not configured")
            raise Unscorable(f"no toolchain for {task.language}: {why}")
        t0 = time.monotonic()
        if task.language == "python":
            program = python_program(task, completion)
        else:
            program = extract_code(completion, task.language)
        n = len(task.tests) if fmt != "humaneval" else len(instrument_check(task.test)[1]) or 1
        found: list[dict[str, str]] = []  # runtime hacking signals (signals.py)
        if is_repo_task(task.meta):  # its repository readable, never writable (repo.py)
            self.sandbox.also_read(read_paths(task.meta["repo"]))
        with self.sandbox.box() as box:
            # a completion with no code of its own must not earn the build credit of the
            # prompt's stub (an empty answer to a HumanEval-style prompt parses)
            empty = not extract_code(completion, task.language).strip()
            build_error = "empty answer: no code" if empty else self._build(box, tc, program)
            if build_error is not None:
                results = [result(f"test {i}", False, "build_error", build_error[:300])
                           for i in range(n)]
            elif fmt == "humaneval":
                results = self._humaneval(box, task, found, stop)
            elif fmt == "calls":
                results = self._calls(box, task, stop, found)
            else:
                results = self._stdio(box, task, tc, stop, found)
        details = {"format": fmt, "language": task.language, "sandbox": self.sandbox.mode,
                   "seconds": round(time.monotonic() - t0, 3)}
        if build_error is not None:
            details["build_log"] = build_error[:2000]
        details["signals"] = hacks.merge(static_signals(task, completion, fmt), found)
        return penalize(make_reward(results, build_error is None, self.cfg, details),
                        self.cfg.hack_penalty, self.cfg.hack_penalty_signals)

    # building ---------------------------------------------------------------------------------

    def _limits(self) -> Limits:
        c = self.cfg
        return Limits(c.timeout_s, c.cpu_s, c.memory_mb, c.max_file_size_mb, c.max_open_files,
                      c.max_processes, c.max_output_kb * 1024)

    def _build_limits(self) -> Limits:
        c = self.cfg
        return Limits(c.build_timeout_s, math.ceil(c.build_timeout_s), c.build_memory_mb,
                      max(64, c.max_file_size_mb), 256, max(128, c.max_processes), 64 * 1024)

    def _build(self, box: Box, tc: Toolchain, program: str) -> str | None:
        """Write the program into the box and compile it; None when it builds."""
        box.write(_SOURCE[tc.language], program)
        if tc.compiler is None:
            return syntax_error(program)
        env = {"PATH": f"{os.path.dirname(tc.compiler)}:/usr/local/bin:/usr/bin:/bin",
               **dict(tc.env)}
        headers, uses, bind = self._headers(tc, env), [], None
        if headers is not None and os.path.isdir(headers):  # bwrap: bound read-only at /prog
            bind = Path(headers) if self.sandbox.mode == "bwrap" else None
            uses = pch.build_args(PROGRAM if bind is not None else headers)
        argv = [tc.compiler, *tc.flags, *uses, "-o", "prog", _SOURCE[tc.language]]
        r = self.sandbox.run(box, argv, self._build_limits(), env=env, program_dir=bind)
        if not r.ok and uses and pch.blamed(r.stderr):  # e.g. GCC < 12's "had to relocate
            argv = [tc.compiler, *tc.flags, "-o", "prog", _SOURCE[tc.language]]  # PCH": without
            r = self.sandbox.run(box, argv, self._build_limits(), env=env)
        if r.ok:
            return None
        log_text = (r.stderr or r.stdout).decode(errors="replace").strip()
        return log_text or f"the compiler failed: {r.describe()}"

    def _headers(self, tc: Toolchain, env: dict[str, str]) -> str | None:
        """The directory of precompiled headers for C++ builds with `tc` (pch.py: GCC on Linux,
        bwrap or process mode), found or built at the first build; None: builds go without."""
        if (tc.language != "cpp" or tc.compiler is None or not self.cfg.cpp_pch
                or self.sandbox.mode not in ("bwrap", "process")):
            return None
        with self._pch_lock:  # the pool's first builds wait for it rather than go without
            if tc.compiler not in self._pch:
                world = self.sandbox.root and self.sandbox.mode == "process"  # another uid reads
                build_env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **env}  # as the sandbox's
                self._pch[tc.compiler] = pch.prepare(tc.compiler, tc.flags, build_env,
                                                     world=world)
            return self._pch[tc.compiler]

    # HumanEval: check(candidate) in its own sandbox ------------------------------------------

    def _humaneval(self, box: Box, task: Task, found: list[dict[str, str]], stop: bool = False
                   ) -> list[dict]:
        source, units = instrument_check(task.test or "")
        limits = self._limits()
        harness = box.write("harness.py", HARNESS)
        serve = [harness, "serve", f"{box.inside}/{_SOURCE['python']}", task.entry_point or ""]
        with self.sandbox.box() as cbox, tempfile.TemporaryFile() as verdicts, \
                watched(self.sandbox, box) as watch:
            spec = {"prompt": prompt_code(task.prompt), "test": source, "units": len(units),
                    "stop": stop,
                    "entry_point": task.entry_point}
            check = [cbox.write("harness.py", HARNESS), "check", cbox.write("task.json", _dumps(spec))]
            req_r, req_w = os.pipe()
            resp_r, resp_w = os.pipe()
            vfd = verdicts.fileno()
            try:
                student = self.sandbox.start(box, [*serve, str(req_r), str(resp_w)], limits,
                                             python_file=True, keep_fds=(req_r, resp_w),
                                             audit=watch.spec)
                watch.started(student)
                try:
                    checker = self.sandbox.start(
                        cbox, [*check, str(req_w), str(resp_r), str(vfd)], limits,
                        python_file=True, keep_fds=(req_w, resp_r, vfd))
                except BaseException:
                    student.stop()
                    _sandbox_error(student)
                    raise
            finally:
                _close(req_r, req_w, resp_r, resp_w)
            try:
                checked = checker.wait()
            finally:
                if _gone(verdicts):  # let it end by itself: how it ended is a hacking signal
                    with suppress(subprocess.TimeoutExpired):
                        student.proc.wait(timeout=0.5)
                student.stop()
            student_error = _sandbox_error(student)
            verdicts.seek(0)
            lines = verdicts.read().decode(errors="replace").split("\n")  # not at U+2028
            found.extend(watch.signals(answered_units(lines)))
        results = unit_results(list(units) or ["check(candidate)"], lines, checked)
        if student_error is not None and any(r["reason"] == "crash" for r in results):
            raise student_error  # the student's sandbox failed, not the student
        return results

    # function calls compared in the trainer ----------------------------------------------------

    def _calls(self, box: Box, task: Task, stop: bool = False,
               found: list[dict[str, str]] | None = None) -> list[dict]:
        with watched(self.sandbox, box) as watch:
            results = self._serve_calls(box, task, stop, watch)
            if found is not None:
                found.extend(watch.signals(answered_calls(results)))
            return results

    def _serve_calls(self, box: Box, task: Task, stop: bool, watch) -> list[dict]:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        harness = box.write("harness.py", HARNESS)
        argv = [harness, "serve", f"{box.inside}/{_SOURCE['python']}", task.entry_point or "",
                str(req_r), str(resp_w)]
        try:
            run = self.sandbox.start(box, argv, self._limits(), python_file=True,
                                     keep_fds=(req_r, resp_w), audit=watch.spec)
            watch.started(run)
        except BaseException:
            _close(req_w, resp_r)
            raise
        finally:
            _close(req_r, resp_w)
        os.set_blocking(req_w, False)  # a student that stops reading must not block us
        results: list[dict] = []
        reader = _LineReader(resp_r, run.deadline)
        try:
            for i, t in enumerate(task.tests):
                if reader.dead:
                    why = "timeout" if reader.timed_out else "crash"
                    results.append(result(f"test {i}", False, why, f"not run: {reader.dead}"))
                elif stop and results and not results[-1]["passed"]:
                    results.append(not_run(i))
                else:
                    results.append(self._one_call(i, t, req_w, reader))
        finally:
            _close(req_w, resp_r)
            if reader.dead == "the solution process exited":  # let it end by itself: how it
                with suppress(subprocess.TimeoutExpired):     # ended is a hacking signal
                    run.proc.wait(timeout=0.5)
            run.stop()
        error = _sandbox_error(run)
        if error is not None and any(r["reason"] == "crash" for r in results):
            raise error
        return results

    def _one_call(self, i: int, test: Mapping, req_w: int, reader: _LineReader) -> dict:
        name = f"test {i}"
        args = test["args"] if isinstance(test["args"], list) else [test["args"]]
        try:
            if not _write_all(req_w, wire.encode_request(i + 1, args, {}), reader.deadline):
                reader.timed_out, reader.dead = True, "timed out"  # it stopped reading
        except TypeError as e:
            raise Unscorable(f"test {i}: {e}") from None
        except OSError:
            reader.dead = "the solution process exited"
        line = reader.line() if not reader.dead else None
        if line is None:
            reason = "timeout" if reader.timed_out else "crash"
            return result(name, False, reason, reader.dead or "no answer")
        try:
            ok, value = wire.decode_response(line, i + 1)
        except wire.ProtocolError as e:
            reader.dead = str(e)
            return result(name, False, "crash", str(e))
        if not ok:
            return result(name, False, "crash", f"the solution raised {value[0]}: {value[1]}",
                          raised=str(value[0])[:60])
        if same_value(value, test["expected"]):
            return result(name, True, "passed", "")
        return result(name, False, "wrong_answer",
                       f"args {short(args)}: expected {short(test['expected'])}, "
                       f"got {short(value)}", got=short(value))

    # programs: stdin -> stdout, one sandbox, one run per test (sandbox/runs.py) ----------------

    def _stdio(self, box: Box, task: Task, tc: Toolchain, stop: bool = False,
               found: list[dict[str, str]] | None = None) -> list[dict]:
        program, py = (_SOURCE["python"], True) if tc.compiler is None else ("prog", False)
        stdins = [str(t.get("stdin", "")).encode() for t in task.tests]
        with watched_runs(self.sandbox, box, len(stdins), py,
                          [] if found is None else found) as watch:
            watch.inputs = stdins
            results, rest = self._each(box, task, program, stdins, py, stop, watch)
        for i in range(len(results), len(task.tests)):
            results.append(not_run(i) if rest == "not_run" else result(
                f"test {i}", False, "timeout", "not run: an earlier test timed out"))
        return results

    def _each(self, box: Box, task: Task, program: str, stdins: list[bytes], py: bool,
              stop: bool, watch: RunsWatch) -> tuple[list[dict], str | None]:
        """The verdicts of the runs made (each run's result kept in `watch`), and why the rest
        were not run (None: all ran)."""
        results: list[dict] = []
        rest = None
        runs = run_each(self.sandbox, box, program, stdins, self._limits(), python_file=py,
                        audit=watch.spec)
        try:
            for i, r in enumerate(runs):
                results.append(judge_output(f"test {i}", r, str(task.tests[i]["stdout"])))
                watch.results.append(r)
                if r.timed_out:
                    rest = "timeout"
                    break
                if stop and not results[-1]["passed"]:
                    rest = "not_run"
                    break
        finally:
            runs.close()
        return results, rest


# --- each distinct answer once -------------------------------------------------------------------


class Answers:
    """The bounded (task, code) -> Reward cache (least recently used out) and the answers in
    flight. Only results that cannot depend on timing are kept: none that could not be scored
    (None: a sandbox error of ours), none where a test timed out or memory ran out."""

    def __init__(self, size: int):
        self.size = size
        self._lru: OrderedDict[str, Reward] = OrderedDict()
        self.inflight: dict[str, Future[Reward]] = {}

    def get(self, key: str) -> Reward | None:
        hit = self._lru.get(key)
        if hit is not None:
            self._lru.move_to_end(key)
        return hit

    def put(self, key: str, reward: Reward) -> None:
        if self.size <= 0 or not cacheable(reward):
            return
        self._lru[key] = reward
        self._lru.move_to_end(key)
        while len(self._lru) > self.size:
            self._lru.popitem(last=False)


def cacheable(reward: Reward) -> bool:
    tests = reward.details.get("tests") or []
    return reward.value is not None and not any(
        t["reason"] == "timeout" or "resident memory" in t["message"] for t in tests)


def answer_key(task: Task, completion: str, stop: bool) -> str:
    """What decides a reward: the task's code-facing fields, the extracted code with trailing
    whitespace normalized, and whether the tests stop at the first failure."""
    code = "\n".join(ln.rstrip() for ln in extract_code(completion, task.language).splitlines())
    fields = [task.language, task.prompt, task.entry_point, task.test, list(task.tests),
              task.preamble, code.rstrip("\n"), stop]
    return hashlib.sha256(_dumps(fields).encode()).hexdigest()


def served(reward: Reward, how: str) -> Reward:
    """A copy of `reward` for another completion with the same answer (`how`: shared, cached)."""
    return Reward(reward.value, dict(reward.parts), reward.reason,
                  {**reward.details, "served": how})


def _then(future: Future[Reward], fn: Callable[[Reward], Reward]) -> Future[Reward]:
    out: Future[Reward] = Future()

    def done(f: Future[Reward]) -> None:
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())
        else:
            out.set_result(fn(f.result()))

    future.add_done_callback(done)
    return out


def not_run(i: int) -> dict:
    return result(f"test {i}", False, "not_run",
                  "not run: an earlier test failed (tests_credit: all)")


# --- helpers -------------------------------------------------------------------------------------


def _gone(verdicts: Any) -> bool:
    """Whether the checker's verdicts say the student's process ended (harness.StudentGone)."""
    verdicts.seek(0)
    return b"the solution process" in verdicts.read(1 << 20)


def _sandbox_error(run: Running) -> SandboxError | None:
    """Collect a stopped run; the SandboxError if its sandbox failed."""
    try:
        run.wait()
    except SandboxError as e:
        return e
    return None


class _LineReader:
    """Reads newline-terminated responses from a pipe, up to a deadline."""

    def __init__(self, fd: int, deadline: float):
        self.fd, self.deadline, self.buf = fd, deadline, bytearray()
        self.dead: str | None = None
        self.timed_out = False

    def line(self) -> bytes | None:
        end = self.buf.find(b"\n")
        while end < 0:
            if not _ready(self.fd, "r", self.deadline):
                self.timed_out, self.dead = True, "timed out"
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.dead = "the solution process exited"
                return None
            start = len(self.buf)
            self.buf += chunk
            if len(self.buf) > wire.MAX_LINE:
                self.dead = "response too long"
                return None
            end = self.buf.find(b"\n", start)
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        return line


def _ready(fd: int, mode: str, deadline: float) -> bool:
    """Wait until `fd` can be read ("r") or written ("w"); False at the deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, w, _ = select.select([fd] if mode == "r" else [], [fd] if mode == "w" else [], [],
                                left)
        if r or w:
            return True


def _write_all(fd: int, data: bytes, deadline: float) -> bool:
    """Write everything to a non-blocking pipe before the deadline; False if time ran out."""
    view = memoryview(data)
    while view:
        if not _ready(fd, "w", deadline):
            return False
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
    return True


def _close(*fds: int) -> None:
    """Close each fd once (callers never close an fd twice: its number may be reused)."""
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, default=repr)


def static_signals(task: Task, completion: str, fmt: str) -> list[dict[str, str]]:
    """The hacking signals of the student's own code, read without running it (signals.py)."""
    code = extract_code(completion, task.language)
    if task.language == "python":
        return hacks.python_static(task, code, fmt) + hacks.to_grader(completion, task.language)
    return hacks.native_static(task, code) + hacks.to_grader(completion, task.language)


def check_penalty(cfg: ExecConfig) -> None:
    """A ConfigError naming a signal in reward.exec.hack_penalty_signals that does not exist."""
    unknown = [n for n in cfg.hack_penalty_signals if n not in NAMES]
    if unknown:
        raise ConfigError(f"reward.exec.hack_penalty_signals: unknown signal {unknown[0]!r}: use "
                          f"names from {', '.join(sorted(NAMES))}")
