"""Precompiled headers for C++ builds (mlx_rlaif/rewards/exec/pch.py, issue 49).

GCC promises that a precompiled header is used only where it is equivalent to the header; here
that is shown for what the exec reward scores: the shipped suites' C++ reference solutions and
broken answers, programs whose first include is not precompiled or that define a macro before
it, a missing include, `-Wall -Werror`, all get the same rewards with `reward.exec.cpp_pch` on
and off, in process mode and bwrap. The sandboxed compiler really uses the cache (`-H` prints
`! DIR/H.gch`), and neither a build nor a run can change it. One cache (a temporary directory)
serves the whole module; it is built once per set of flags (about 5 s here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_rlaif.config import ExecConfig
from mlx_rlaif.data import load_tasks
from mlx_rlaif.records import Reward, Task
from mlx_rlaif.rewards.exec import ExecReward, pch
from mlx_rlaif.sandbox.modes import bwrap_problem

ROOT = Path(__file__).resolve().parent.parent


def _gcc() -> str | None:
    gxx = shutil.which("g++")
    if gxx is None or not sys.platform.startswith("linux"):
        return None
    out = subprocess.run([gxx, "-dM", "-E", "-x", "c++", "/dev/null"], capture_output=True,
                         text=True).stdout
    return gxx if "__GNUC__" in out and "__clang__" not in out else None


pytestmark = pytest.mark.skipif(_gcc() is None, reason="needs GCC's g++ on Linux")
BWRAP_SKIP = None if sys.platform.startswith("linux") and bwrap_problem() is None else (
    "bubblewrap does not work here")
FAST = {"timeout_s": 2.0, "cpu_s": 2}
UID_BASE = 64900  # as root: uids no other test uses (runs are killed by uid)
STRICT = ("-std=c++17", "-O1", "-pipe", "-Wall", "-Werror")
SUM = tuple({"stdin": f"{k} {k * k}\n", "stdout": f"{k + k * k}\n"} for k in range(5))
TASK = Task(id="sum-cpp", prompt="Print a + b.", language="cpp", tests=SUM)
BODY = "int main(){long long a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}\n"

# program -> what it must score with the precompiled headers and without: the same
EDGES = {
    "bits first": ("#include <bits/stdc++.h>\n" + BODY, 1.0),
    "iostream first": ("#include <iostream>\n" + BODY, 1.0),
    "first include not precompiled": ("#include <cstdio>\n#include <iostream>\n" + BODY, 1.0),
    # the second header is read as text after the first one's PCH: GCC opens the path where it
    # found <iostream> again, so the directory must hold the header too (pch.py)
    "iostream then bits": ("#include <iostream>\n#include <bits/stdc++.h>\n" + BODY, 1.0),
    "iostream twice": ("#include <iostream>\n#include <iostream>\n" + BODY, 1.0),
    "define int after bits": ("#include <bits/stdc++.h>\n#define int long long\n"
                              "signed main(){int a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}\n",
                              1.0),
    "define int before bits": ("#define int long long\n#include <bits/stdc++.h>\n"  # breaks it
                               "signed main(){int a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}\n",
                               0.0),
    # a macro the header depends on: the PCH (built without it) must not be used, else the
    # assert would fire / the out-of-range access would go unchecked
    "NDEBUG before bits": ("#define NDEBUG\n#include <bits/stdc++.h>\n"
                           "int main(){long long a,b; std::cin>>a>>b; assert(a < 0);"
                           " std::cout<<a+b<<'\\n';}\n", 1.0),
    "_GLIBCXX_DEBUG before bits": ("#define _GLIBCXX_DEBUG\n#include <bits/stdc++.h>\n"
                                   "int main(){long long a,b; std::cin>>a>>b; std::vector<int> "
                                   "v(2); v[5] = 1; std::cout<<a+b<<'\\n';}\n", 0.1),
    "missing include": ("#include <iostream>\nint main(){std::map<int,int> m; "
                        "std::cout<<m.size();}\n", 0.0),
    "syntax error after bits": ("#include <bits/stdc++.h>\nint main(){ return }\n", 0.0),
}
STRICT_EDGES = {  # with -Wall -Werror: warnings decide the build, and must not change
    "clean bits": ("#include <bits/stdc++.h>\n" + BODY, 1.0),
    "clean iostream after cstdio": ("#include <cstdio>\n#include <iostream>\n" + BODY, 1.0),
    "NDEBUG before bits (PCH not used: no warning)": (
        "#define NDEBUG\n#include <bits/stdc++.h>\n" + BODY, 1.0),
    "unused variable": ("#include <bits/stdc++.h>\nint main(){int x; long long a,b; "
                        "std::cin>>a>>b; std::cout<<a+b<<'\\n';}\n", 0.0),
    "iostream then bits, unused": ("#include <iostream>\n#include <bits/stdc++.h>\n"
                                   "int main(){int x; return 0;}\n", 0.0),
}


def verdict(r: Reward) -> tuple:
    tests = r.details.get("tests") or []
    return r.value, r.parts, [(t["passed"], t["reason"]) for t in tests]


@pytest.fixture(scope="module")
def cache() -> Iterator[Path]:
    """A cache directory of this module's own, readable by the sandbox uids, used by every
    reward made here."""
    base = Path(tempfile.mkdtemp(prefix="mlx-rlaif-pch-test-"))
    base.chmod(0o755)
    mp = pytest.MonkeyPatch()
    mp.setattr(pch, "candidates", lambda world: [base / "pch"])
    yield base / "pch"
    mp.undo()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def rewards(cache: Path) -> Iterator:
    """make(mode, flags, pch=True) -> that reward, made once for the module."""
    made: dict[tuple, ExecReward] = {}

    def make(mode: str, flags: tuple[str, ...] = (), pch: bool = True) -> ExecReward:
        if mode == "bwrap" and BWRAP_SKIP:
            pytest.skip(BWRAP_SKIP)
        if (mode, flags, pch) not in made:
            kw = {"sandbox": mode, "workers": 2, "uid_base": UID_BASE, "cpp_pch": pch, **FAST,
                  **({"cpp_flags": flags} if flags else {})}
            made[mode, flags, pch] = ExecReward(ExecConfig(**kw), {"cpp"})
        return made[mode, flags, pch]

    yield make
    for r in made.values():
        r.close()


@pytest.fixture(scope="module")
def same(rewards) -> Iterator:
    """check(mode, tasks, programs, flags): the rewards with precompiled headers in `mode` are
    those without them. Without, the verdict does not depend on the mode (the same compiler
    and flags, the same runs): made once, in process mode, for both modes to compare with."""
    without: dict[tuple, tuple] = {}

    def check(mode: str, tasks: list[Task], programs: list[str],
              flags: tuple[str, ...] = ()) -> list[Reward]:
        keys = [(flags, t.id, p) for t, p in zip(tasks, programs, strict=True)]
        todo = [i for i, k in enumerate(keys) if k not in without]
        if todo:
            got = rewards("process", flags, pch=False).score([tasks[i] for i in todo],
                                                             [programs[i] for i in todo])
            without.update({keys[i]: verdict(r) for i, r in zip(todo, got, strict=True)})
        with_pch = rewards(mode, flags).score(tasks, programs)
        for k, r in zip(keys, with_pch, strict=True):
            assert verdict(r) == without[k], (k[1], k[2][:80], r.reason)
        return with_pch

    return check


def headers_of(reward: ExecReward) -> Path:
    """The reward's precompiled-header directory (prepared by a first build)."""
    reward.score_one(TASK, "#include <iostream>\n" + BODY)
    found = reward._pch[reward.toolchains["cpp"].compiler]
    assert found is not None, "no precompiled headers were made"
    return Path(found)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the same verdicts ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_edge_programs_score_the_same_with_and_without(same, mode: str) -> None:
    names = list(EDGES)
    got = same(mode, [TASK] * len(names), [EDGES[n][0] for n in names])
    assert {n: r.value for n, r in zip(names, got, strict=True)} == {
        n: v for n, (_, v) in EDGES.items()}


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_wall_werror_builds_decide_the_same(same, rewards, mode: str) -> None:
    names = list(STRICT_EDGES)
    got = same(mode, [TASK] * len(names), [STRICT_EDGES[n][0] for n in names], STRICT)
    assert {n: r.value for n, r in zip(names, got, strict=True)} == {
        n: v for n, (_, v) in STRICT_EDGES.items()}
    assert headers_of(rewards(mode, STRICT)) != headers_of(rewards(mode))  # flags: own entry


def suite_answers(suites: tuple[str, ...], broken: bool = True) -> tuple[list[Task], list[str]]:
    """The suites' C++ tasks with their reference solutions (and each with a wrong answer)."""
    tasks = [t for s in suites for t in load_tasks(f"suite:{s}", ["cpp"]) if t.meta.get("solution")]
    answers = [t.meta["solution"] for t in tasks]
    if not broken:
        return tasks, answers
    return tasks * 2, answers + ["#include <iostream>\nint main(){return 0;}\n"] * len(tasks)


def test_eval_suite_solutions_score_the_same(same) -> None:
    tasks, answers = suite_answers(("synthetic-eval",), broken=False)
    assert [r.value for r in same("process", tasks, answers)] == [1.0] * len(tasks)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_every_shipped_cpp_solution_scores_the_same(same, mode: str) -> None:
    tasks, answers = suite_answers(("synthetic-train", "synthetic-eval"))
    got = same(mode, tasks, answers)
    assert [r.value for r in got] == [1.0] * (len(tasks) // 2) + [0.1] * (len(tasks) // 2)


# --- used, and out of reach -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_the_sandboxed_compiler_uses_them(rewards, mode: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    on = rewards(mode)
    headers = headers_of(on)
    inside = "/prog" if mode == "bwrap" else str(headers)
    monkeypatch.setattr(pch, "build_args", lambda d: ["-isystem", d, "-H"])  # -H: what it read
    for h in pch.HEADERS:  # a build error after the include: the build log keeps -H's lines
        r = on.score_one(TASK, f"#include <{h}>\nint main(){{ return undefined_name; }}\n")
        assert r.parts["builds"] == 0.0
        assert f"! {inside}/{h}.gch" in r.details["build_log"].splitlines(), r.details["build_log"]
    r = on.score_one(TASK, "#define NDEBUG\n#include <bits/stdc++.h>\nint main(){ return nope; }\n")
    assert f"x {inside}/bits/stdc++.h.gch" in r.details["build_log"].splitlines()  # not valid


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_a_build_failing_over_a_pch_runs_again_without(rewards, mode: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    on = rewards(mode)
    headers_of(on)
    assert pch.blamed(b"cc1plus: fatal error: had to relocate PCH\n")  # GCC < 12, at random
    assert not pch.blamed(b"! /prog/iostream.gch\nx.cpp:1:1: error: 'y' was not declared\n")
    # stand-in for such a failure: an error that names a .gch, from options of ours
    monkeypatch.setattr(pch, "build_args", lambda d: ["-isystem", d, "-include", "/no/x.gch"])
    r = on.score_one(TASK, "#include <iostream>\n" + BODY)
    assert r.value == 1.0, r.reason


HOSTILE = r"""
#include <iostream>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
int main() {
  std::string dir; std::getline(std::cin, dir);
  std::string gch = dir + "/iostream.gch", escaped;
  auto tried = [&](bool ok, const char* what) { if (ok) escaped += std::string(what) + " "; };
  tried(open(gch.c_str(), O_WRONLY) >= 0, "open-for-writing");
  tried(open(gch.c_str(), O_RDWR | O_TRUNC) >= 0, "truncate");
  tried(open((dir + "/iostream").c_str(), O_WRONLY | O_APPEND) >= 0, "header-append");
  tried(open((dir + "/new.gch").c_str(), O_WRONLY | O_CREAT, 0644) >= 0, "create");
  int fd = open("evil.gch", O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) { if (write(fd, "x", 1) != 1) return 3; close(fd); }
  tried(rename("evil.gch", gch.c_str()) == 0, "rename-over");
  tried(link("evil.gch", (dir + "/bits/x.gch").c_str()) == 0, "link-in");
  tried(unlink(gch.c_str()) == 0, "unlink");
  tried(chmod(gch.c_str(), 0666) == 0, "chmod");
  tried(rename(dir.c_str(), "moved") == 0, "rename-dir");
  // make the compiler write there: g++ -o the cache's file
  std::string cmd = "printf '#include <cstdio>\\n' > h.hpp && g++ -x c++-header h.hpp -o '"
                    + gch + "' 2>/dev/null";
  tried(system(cmd.c_str()) == 0, "compiler-output");
  std::cout << (escaped.empty() ? "blocked" : escaped) << std::endl;
  std::cout << (open(gch.c_str(), O_RDONLY) >= 0 ? "sees it" : "unseen") << std::endl;
}
"""


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_a_program_cannot_change_the_cache(rewards, mode: str) -> None:
    on = rewards(mode)
    if mode == "process" and not on.sandbox.root:
        pytest.skip("process mode as non-root: the program has our uid (not covered, box.py)")
    headers = headers_of(on)
    before = {p: (digest(p), p.stat()) for p in headers.rglob("*") if p.is_file()}
    # the host path (process mode: readable, by design), and where builds see it under bwrap
    # (a run sees its own program at /prog; under bwrap the host path is not mounted)
    places = {str(headers): "sees it" if mode == "process" else "unseen", "/prog": "unseen"}
    task = Task(id="hostile", prompt="-", language="cpp",
                tests=tuple({"stdin": p + "\n", "stdout": f"blocked\n{seen}\n"}
                            for p, seen in places.items()))
    r = on.score_one(task, HOSTILE)
    assert r.value == 1.0, [t["message"] for t in r.details["tests"]]
    after = {p: (digest(p), p.stat()) for p in headers.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    for p, (h, st) in before.items():
        assert after[p][0] == h and after[p][1].st_ino == st.st_ino, p
    assert headers_of(on) == headers  # still the entry in use, and still used
    assert pch.load(headers.parent.parent, headers.parent.name.rsplit("-", 1)[0]) == str(headers)


def test_the_cache_is_sealed_and_keyed(rewards) -> None:
    on = rewards("process")
    headers = headers_of(on)
    entry, base = headers.parent, headers.parent.parent
    key = entry.name.rsplit("-", 1)[0]
    assert os.readlink(base / key) == entry.name
    manifest = json.loads((entry / "manifest.json").read_text())
    assert sorted(manifest["headers"]) == sorted(pch.HEADERS)
    assert any(p.endswith("/iostream") for p in manifest["deps"])  # what staleness checks
    for p in [entry, *entry.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))
        assert p.lstat().st_uid == os.geteuid()
    for h in pch.HEADERS:  # the header's own text beside its .gch (pch.py says why)
        real = manifest["headers"][h]["header"]
        assert (headers / h).read_bytes() == Path(real).read_bytes()
    assert stat.S_IMODE((base / f"{key}.lock").stat().st_mode) == 0o600


# --- the cache without a sandbox ----------------------------------------------------------------


def test_stale_or_partial_entries_are_not_used(tmp_path: Path) -> None:
    dep = tmp_path / "dep.h"
    dep.write_text("int x;\n")
    entry = tmp_path / "k-1234"
    (entry / "include").mkdir(parents=True)
    (entry / "include" / "iostream.gch").write_bytes(b"g" * 10)
    manifest = {"key": "k", "format": pch.FORMAT, "deps": {str(dep): pch._stat(str(dep))},
                "headers": {"iostream": {"bytes": 10, "header": str(dep)}}}
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert pch.load(tmp_path, "k") is None  # no link yet: not switched to
    os.symlink("k-1234", tmp_path / "k")
    assert pch.load(tmp_path, "k") == str(entry / "include")
    (entry / "include" / "iostream.gch").write_bytes(b"g" * 5)  # cut short
    assert pch.load(tmp_path, "k") is None
    (entry / "include" / "iostream.gch").write_bytes(b"g" * 10)
    dep.write_text("int y;\n")  # a header changed since (an update)
    os.utime(dep, ns=(1, 1))
    assert pch.load(tmp_path, "k") is None


def test_untrusted_or_unusable_means_no_pch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    gxx = _gcc()
    assert gxx is not None
    flags = ("-std=c++17",)
    env = {"PATH": "/usr/bin:/bin"}
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # writable by anyone, no sticky bit
    assert pch.untrusted(open_dir) is not None
    monkeypatch.setattr(pch, "candidates", lambda world: [open_dir / "pch"])
    assert pch.prepare(gxx, flags, env, world=False) is None
    assert not (open_dir / "pch").exists() or not any((open_dir / "pch").iterdir())
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        assert "belongs to uid 65534" in (pch.untrusted(theirs) or "")
    # not GCC (clang's macros), a compiler that fails, flags that ask about invalid PCHs
    fake = tmp_path / "clang++"
    fake.write_text("#!/bin/sh\necho '#define __clang__ 1'\necho '#define __GNUC__ 4'\n")
    fake.chmod(0o755)
    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\necho '#define __GNUC__ 12'\nexit 0\n")  # builds nothing
    broken.chmod(0o755)
    monkeypatch.setattr(pch, "candidates", lambda world: [tmp_path / "cache"])
    assert pch.prepare(str(fake), flags, env, world=False) is None
    assert pch.prepare(str(broken), flags, env, world=False) is None
    assert pch.prepare(gxx, (*flags, "-Winvalid-pch"), env, world=False) is None
    assert not [p for p in (tmp_path / "cache").glob("*") if p.is_dir()]  # nothing left behind
    assert any("precompiled" in r.getMessage() for r in caplog.records)


CONCURRENT = """
import sys
from pathlib import Path
from mlx_rlaif.rewards.exec import pch
pch.candidates = lambda world: [Path(sys.argv[1])]
print(pch.prepare(sys.argv[2], ["-std=c++17", "-O1", "-pipe"], {"PATH": "/usr/bin:/bin"},
                  world=False))
"""


def test_two_trainers_building_at_once_share_one_entry(tmp_path: Path) -> None:
    base = tmp_path / "pch"
    argv = [sys.executable, "-c", CONCURRENT, str(base), str(_gcc())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
        outs = [p.communicate(timeout=300)[0].strip() for p in procs]
        # the same entry: the second waited for the first one's build and took it
        assert outs[0] == outs[1] and outs[0].endswith("/include"), outs
        entries = [p for p in base.iterdir() if p.is_dir() and not p.is_symlink()]
        assert len(entries) == 1, entries
    finally:
        shutil.rmtree(base, ignore_errors=True)  # 125 MB: not left to pytest's kept tmp dirs
