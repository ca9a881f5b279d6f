"""The launcher starts from its code object, compiled ahead by the interpreter that runs it
(box.py `precompiled`, `launcher_argv`), and from its text where that cannot be made."""

from __future__ import annotations

import marshal
import os
import shutil
import subprocess
import sys

import pytest

from mlx_rlaif.sandbox import Limits, Sandbox, box


def test_the_launcher_runs_from_the_code_object_our_interpreter_compiled():
    argv = box.launcher_argv(sys.executable, {"x": 1})
    assert argv[:4] == [sys.executable, "-I", "-S", "-c"]
    assert argv[4] == box.BOOT and argv[5] == "{'x': 1}"
    code = marshal.loads(bytes.fromhex(argv[6]))
    assert code.co_filename == "launcher.py"
    assert len(argv[6]) < box.MAX_ARG


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3") or os.path.realpath(
    "/usr/bin/python3") == os.path.realpath(sys.executable), reason="needs a second python3")
def test_another_interpreter_compiles_its_own_code_object():
    other = os.path.realpath("/usr/bin/python3")
    hexed = box.precompiled(other, "print('made by', __import__('sys').version)", "t.py")
    assert hexed is not None
    boot = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv.pop())))"
    out = subprocess.run([other, "-I", "-S", "-c", boot, hexed], capture_output=True,
                         text=True, check=True).stdout
    version = subprocess.run([other, "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"made by {version.strip()}"


def test_an_interpreter_that_cannot_compile_gets_the_launchers_text(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    assert box.precompiled(str(fake), box.LAUNCHER, "launcher.py") is None
    argv = box.launcher_argv(str(fake), {"x": 1})
    assert argv[4] == box.LAUNCHER and argv[5] == "{'x': 1}" and len(argv) == 6


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_runs_start_from_the_code_object_and_from_the_text(mode, monkeypatch):
    if mode == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bwrap not installed")
    sb = Sandbox(mode, slots=1, uid_base=64750)
    for precompiled in (True, False):
        if not precompiled:
            monkeypatch.setattr(box, "precompiled", lambda *a: None)
        with sb.box() as b:
            path = b.write("main.py", "import sys\nprint(sys.argv[1:], 6 * 7)\n")
            r = sb.run(b, [path], Limits(), python_file=True)
        assert r.ok and r.stdout == b"[] 42\n", r
