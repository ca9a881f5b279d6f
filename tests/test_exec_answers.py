"""Each distinct answer scored once, and no test run that cannot change the reward
(mlx_rlaif/rewards/exec/reward.py): identical answers in one call or in flight share a result,
the bounded cache serves them across calls (never a timeout or a sandbox error), and with
`tests_credit: all` a completion's tests stop at the first failure while fraction credit and
multi-turn feedback run them all.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest

from mlx_rlaif.config import ExecConfig
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.exec import ExecReward
from mlx_rlaif.rewards.exec.reward import answer_key

FAST = {"timeout_s": 2.0, "cpu_s": 2, "sandbox": "process", "uid_base": 64700}
SQUARE = Task(id="sq", prompt="Write f(x) = x * x.", entry_point="f",
              tests=tuple({"args": [x], "expected": x * x} for x in range(5)))
DOUBLE = Task(id="dbl", prompt="Read n, print 2n.", tests=tuple(
    {"stdin": f"{n}\n", "stdout": f"{2 * n}\n"} for n in range(6)))
GOOD = "def f(x):\n    return x * x\n"
WRONG_AT_1 = "def f(x):\n    return x if x != 1 else 0\n"  # right on 0 only


def reward(**kw) -> ExecReward:
    return ExecReward(ExecConfig(**{**FAST, **kw}), {"python"})


def runs(r: ExecReward) -> float:
    m = r.metrics()
    return m["exec/completions"] - m["exec/shared"] - m["exec/cached"]


def test_identical_answers_in_one_call_run_once() -> None:
    r = reward()
    try:
        out = r.score([SQUARE] * 5 + [DOUBLE], [
            GOOD, GOOD + "   \n\n", f"```python\n{GOOD}```", WRONG_AT_1,
            "def f(x):  \n    return x * x   \n", "print(2 * int(input()))\n"])
        m = r.metrics()
    finally:
        r.close()
    assert [o.value for o in out[:5]] == [1.0, 1.0, 1.0, pytest.approx(0.1 + 0.9 / 5), 1.0]
    assert out[5].value == 1.0
    assert runs(r) == 3.0 and m["exec/shared"] == 3.0 and m["exec/completions"] == 6.0
    assert [o.details.get("served") for o in out] == [None, "shared", "shared", None, "shared",
                                                      None]
    assert out[1].details["tests"] == out[0].details["tests"]
    assert m["reward/exec_served_frac"] == pytest.approx(3 / 6)


def test_the_same_code_of_another_task_is_another_answer() -> None:
    other = Task(id="sq", prompt="Write f(x) = x * x.", entry_point="f",
                 tests=({"args": [3], "expected": 10},))  # same id and prompt, other tests
    assert answer_key(SQUARE, GOOD, False) != answer_key(other, GOOD, False)
    assert answer_key(SQUARE, GOOD, False) != answer_key(SQUARE, GOOD, True)
    assert answer_key(SQUARE, GOOD, False) == answer_key(SQUARE, GOOD + "\n  \n", False)
    assert answer_key(SQUARE, GOOD, False) != answer_key(SQUARE, GOOD.replace("x *", "x*"), False)
    r = reward()
    try:
        a, b = r.score([SQUARE, other], [GOOD, GOOD])
    finally:
        r.close()
    assert (a.value, b.value) == (1.0, pytest.approx(0.1))


def test_cache_across_calls_bounded_and_off() -> None:
    r = reward(cache_size=2)
    try:
        first = r.score([SQUARE], [GOOD])[0]
        again = r.score([SQUARE], [GOOD])[0]
        assert again.details["served"] == "cached" and again.value == first.value
        assert r.metrics()["exec/cached"] == 1.0
        r.score([SQUARE, SQUARE], [WRONG_AT_1, "def f(x):\n    return 0\n"])  # evicts GOOD
        r.score([SQUARE], [GOOD])
        assert r.metrics()["exec/cached"] == 1.0 and runs(r) == 4.0
    finally:
        r.close()
    off = reward(cache_size=0)
    try:
        off.score([SQUARE], [GOOD])
        off.score([SQUARE], [GOOD])
        assert off.metrics()["exec/cached"] == 0.0 and runs(off) == 2.0
    finally:
        off.close()


def test_timeouts_and_sandbox_errors_are_never_cached(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    r = reward(timeout_s=1.0)
    spin = "def f(x):\n    while True:\n        pass\n"
    try:
        for _ in range(2):
            out = r.score([SQUARE], [spin])[0]
            assert {t["reason"] for t in out.details["tests"]} == {"timeout"}
        assert r.metrics()["exec/cached"] == 0.0 and runs(r) == 2.0
        with monkeypatch.context() as m:
            m.setattr(tempfile, "tempdir", str(tmp_path / "missing"))  # no box: our failure
            assert r.score([SQUARE], [GOOD])[0].value is None
        good = r.score([SQUARE], [GOOD])[0]
        assert good.value == 1.0 and "served" not in good.details
    finally:
        r.close()


def test_answers_in_flight_are_shared_between_calls() -> None:
    """Score-while-decoding scores groups from several threads at once: the same answer in two
    groups runs once."""
    slow = "import time\ntime.sleep(0.5)\ndef f(x):\n    return x * x\n"
    r = reward(workers=2)
    out: list = []
    try:
        threads = [threading.Thread(target=lambda: out.extend(r.score([SQUARE], [slow])))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = r.metrics()
    finally:
        r.close()
    assert [o.value for o in out] == [1.0] * 3
    assert runs(r) == 1.0 and m["exec/shared"] + m["exec/cached"] == 2.0


@pytest.mark.parametrize("mode", ["process", "bwrap"])
def test_all_credit_stops_at_the_first_failure(mode: str) -> None:
    from test_exec_reward import BWRAP_SKIP

    if mode == "bwrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    wrong_stdio = "n = int(input())\nprint(2 * n if n != 1 else 0)\n"
    everything = reward(sandbox=mode)
    decided = reward(sandbox=mode, tests_credit="all")
    try:
        frac = everything.score([SQUARE, DOUBLE], [WRONG_AT_1, wrong_stdio])
        stop = decided.score([SQUARE, DOUBLE], [WRONG_AT_1, wrong_stdio])
        full = decided.score([SQUARE, DOUBLE], [WRONG_AT_1, wrong_stdio], every_test=True)
    finally:
        everything.close()
        decided.close()
    for f in frac:
        assert "not_run" not in {t["reason"] for t in f.details["tests"]}
    for s, n in zip(stop, (5, 6), strict=True):
        reasons = [t["reason"] for t in s.details["tests"]]
        assert reasons == ["passed", "wrong_answer"] + ["not_run"] * (n - 2)
        assert s.value == pytest.approx(0.1) and s.parts["tests"] == pytest.approx(1 / n)
    for f, a in zip(frac, full, strict=True):  # every test reported when asked (feedback)
        assert [t["reason"] for t in a.details["tests"]] == [
            t["reason"] for t in f.details["tests"]]
        assert a.value == pytest.approx(0.1)
    r = reward(tests_credit="all")
    try:
        ok = r.score([SQUARE, DOUBLE], [GOOD, "print(2 * int(input()))\n"])
    finally:
        r.close()
    assert [o.value for o in ok] == [1.0, 1.0]


def test_multiturn_feedback_asks_for_every_visible_test() -> None:
    from mlx_rlaif.train.multiturn import responder

    seen: list = []

    class Scorer:
        name = "exec"

        def score(self, tasks, texts, *, every_test=False):
            seen.append(every_test)
            from mlx_rlaif.records import Reward

            return [Reward(1.0, {}, "", {"tests": [{"passed": True}]}) for _ in tasks]

    class Gen:
        visible_tests = 0.5
        feedback_chars = 600

    from mlx_rlaif.records import Rollout

    respond = responder(Scorer(), None, Gen(), False)
    rollout = Rollout(SQUARE, (1,), (2,), (0.0,), GOOD, "stop", 1.0)
    respond(1, [rollout])
    assert seen == [True]


def test_all_credit_stops_humaneval_checks_at_the_first_failing_unit() -> None:
    task = Task(id="he-sq", prompt='def sq(x):\n    """Square x."""\n', entry_point="sq",
                test="def check(candidate):\n    assert candidate(0) == 0\n"
                     "    assert candidate(1) == 1\n    assert candidate(2) == 4\n"
                     "    assert candidate(3) == 9\n")
    wrong = "    return x if x < 2 else 0\n"  # right on 0 and 1 only
    decided, everything = reward(tests_credit="all"), reward()
    try:
        stop, = decided.score([task], [wrong])
        full, = decided.score([task], [wrong], every_test=True)
        frac, good = everything.score([task] * 2, [wrong, "    return x * x\n"])
    finally:
        decided.close()
        everything.close()
    assert [t["reason"] for t in stop.details["tests"]] == [
        "passed", "passed", "wrong_answer", "not_run"]
    assert stop.value == pytest.approx(0.1) and stop.parts["tests"] == pytest.approx(0.5)
    assert [t["reason"] for t in full.details["tests"]] == [
        t["reason"] for t in frac.details["tests"]] == [
        "passed", "passed", "wrong_answer", "wrong_answer"]
    assert good.value == 1.0
