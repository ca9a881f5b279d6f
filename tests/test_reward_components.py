"""Reward components (rewards/custom/): a user's function loaded and checked before anything
runs, the contract's values, worker processes killed when a function hangs, the combination
of components, the HTTP client against the real `mlx-rlaif serve-reward` in a subprocess (ours
and OpenRLHF's forms), and the shipped examples. No model is loaded here except the reward
model example's tiny one; the training runs are in test_reward_components_train.py."""

from __future__ import annotations

import http.server
import json
import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlx_rlaif.config import check, load, reward_components
from mlx_rlaif.errors import ConfigError, RewardError
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.base import SyntaxReward
from mlx_rlaif.rewards.custom.client import ServerClient
from mlx_rlaif.rewards.custom.components import ComponentsReward, Custom
from mlx_rlaif.rewards.custom.contract import ValueProblem, check_value, units
from mlx_rlaif.rewards.custom.pool import WorkerPool
from mlx_rlaif.rewards.custom.spec import load_function

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "rewards"

FNS = '''
import asyncio, os, time

def length(completion, step, scale=1.0):
    return len(completion) * scale

def per_field(completion, difficulty):
    return {"easy": 1.0, "hard": 0.0}[difficulty]

def raises(completion, task_id):
    raise ValueError(f"no rule for {task_id}")

def forever(completion):
    if "hang" in completion:
        time.sleep(10**9)
    return 1.0

def slow_raise(completion):
    time.sleep(0.5)
    raise ValueError("no rule, slowly")

def dies(completion):
    os._exit(3)

async def slow(completion):
    await asyncio.sleep(0.5)
    return 0.5

def ranks(completions, task_ids):
    order = sorted(range(len(completions)), key=lambda i: len(completions[i]))
    return [order.index(i) / max(1, len(completions) - 1) for i in range(len(completions))]

def wrong_length(completions):
    return [1.0]

def nan(completion):
    return float("nan")

def none_for_b(completion):
    return None if completion == "b" else 1.0

def reward_func(queries, prompts, labels):  # OpenRLHF's form, unchanged
    import numpy as np
    rewards = np.array([float(len(q) - len(p)) + (labels[i] or 0) for i, (q, p) in
                        enumerate(zip(queries, prompts))])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}

def uses_exec(exec_result):
    return None if exec_result is None else float(exec_result["passed"] == exec_result["total"])
'''


@pytest.fixture
def fns(tmp_path) -> Path:
    p = tmp_path / "fns.py"
    p.write_text(FNS)
    return p


def _tasks(n: int, tid: str = "t") -> list[Task]:
    return [Task(id=tid, prompt="def f():\n", meta={"difficulty": "easy"}) for _ in range(n)]


# --- loading and the signature check -----------------------------------------------------------


@pytest.mark.parametrize("spec, match", [
    ("missing.py:fn", "file missing.py not found"),
    ("{fns}:nope", "has no attribute 'nope'"),
    ("no_such_module_xyz:fn", "module no_such_module_xyz not found"),
    ("{fns}", "write path/to/file.py:function"),
    ("{fns}:per_field", None),  # difficulty is a record field: accepted
])
def test_a_function_is_loaded_and_checked_with_one_line(fns, spec, match):
    spec = spec.format(fns=fns)
    if match is None:
        assert load_function(spec, {}, {"difficulty", "prompt"}).params == ("completion",
                                                                           "difficulty")
        return
    with pytest.raises(ConfigError, match=re.escape(match)) as e:
        load_function(spec, {}, set())
    assert "\n" not in str(e.value)


def test_a_parameter_nothing_fills_is_named(fns):
    with pytest.raises(ConfigError, match="nothing fills parameter 'difficulty'"):
        load_function(f"{fns}:per_field", {}, {"prompt"})
    assert load_function(f"{fns}:length", {"scale": 2}, set()).optional == {"scale"}
    with pytest.raises(ConfigError, match="group: true passes"):
        load_function(f"{fns}:length", {}, set(), group=True)


def test_the_cli_refuses_a_missing_function_before_any_model_loads(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "train", "--model",
                        str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "run"),
                        "--reward", "nowhere.py:fn@0.3", "--no-dashboard"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("mlx-rlaif train: error: reward "
                                                        "function"), r.stderr
    assert "nowhere.py not found" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_reward_type_and_functions_load_as_the_equivalent_list():
    cfg = check(load(None, ["reward.type=syntax", "reward.functions=[a.py:fmt@0.3, pkg.m:g]"]))
    assert [(c.kind, c.name, c.weight) for c in reward_components(cfg.reward)] == [
        ("syntax", "syntax", 1.0), ("function", "fmt", 0.3), ("function", "g", 1.0)]
    mix = load(None, ["reward.type=mix", "reward.exec_weight=0.7", "reward.teacher_weight=0.3"])
    assert [(c.kind, c.weight) for c in reward_components(mix.reward)] == [
        ("exec", 0.7), ("teacher", 0.3)]
    for sets, match in ((["reward.functions=[a.py:f@-1]"], "weight -1.0"),
                        (["reward.type=mix", "reward.components=[{kind: exec}]"], "both set"),
                        (["reward.components=[{kind: exec, weight: 0}]"], "weight 0"),
                        (["reward.functions=[a.py:exec]"], "named 'exec' twice")):
        with pytest.raises(ConfigError, match=match):
            check(load(None, sets))


# --- the contract --------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (0.5, (0.5, {})), (1, (1.0, {})), (None, (None, {})),
    ({"a": 1.0, "b": 0.5}, (1.5, {"a": 1.0, "b": 0.5})),
    ({"score": 0.2, "x": 3.0}, (0.2, {"x": 3.0})),
])
def test_values_a_function_may_return(value, expected):
    assert check_value(value) == expected


@pytest.mark.parametrize("value, match", [
    (float("nan"), "float nan"), (math.inf, "float inf"), ("0.5", "str '0.5'"),
    ([0.5], "list"), ({"a": "x"}, r"\['a'\] str"),
])
def test_values_the_contract_refuses(value, match):
    with pytest.raises(ValueProblem, match=match):
        check_value(value)


# --- worker processes ------------------------------------------------------------------------


def test_a_function_that_sleeps_forever_is_killed_within_its_timeout(fns):
    pool = WorkerPool(f"{fns}:forever", {}, False, 2, 4, 1.5)
    try:
        t0 = time.monotonic()
        out = pool.run([{"completion": c} for c in ("a", "hang", "b", "c")], 0)
        took = time.monotonic() - t0
        assert out == [("ok", 1.0), ("timeout", None), ("ok", 1.0), ("ok", 1.0)]
        assert took < 1.5 + 10, took  # the timeout, plus a fresh worker's start
        assert pool.restarts == 1
        assert pool.run([{"completion": "x"}], 0) == [("ok", 1.0)]  # the pool works on
    finally:
        pool.close()


def test_errors_deaths_and_async_concurrency(fns):
    pool = WorkerPool(f"{fns}:raises", {}, False, 1, 4, 5.0)
    try:
        status, line = pool.run([{"completion": "x", "task_id": "t7"}], 0)[0]
        assert status == "error" and line.startswith("ValueError: no rule for t7 (fns.py:")
    finally:
        pool.close()
    pool = WorkerPool(f"{fns}:dies", {}, False, 1, 4, 5.0)
    try:
        assert pool.run([{"completion": "x"}], 0)[0] == ("error", "its worker process exited "
                                                        "(exit code 3)")
    finally:
        pool.close()
    pool = WorkerPool(f"{fns}:slow", {}, False, 1, 8, 5.0, is_async=True)
    try:
        pool.run([{"completion": "x"}], 0)  # started
        t0 = time.monotonic()
        assert pool.run([{"completion": "x"}] * 16, 0) == [("ok", 0.5)] * 16
        assert time.monotonic() - t0 < 0.5 * 16 / 2  # 8 at once: two rounds, not sixteen
    finally:
        pool.close()


def test_a_function_that_hangs_on_every_call_ends_the_step_within_its_timeout(fns):
    """Issue 57: 32 completions, 2 workers, a function that hangs on every call. The old pool
    waited out each call's timeout in turn (32 x 2 s / 2 workers, plus a restart per call);
    on_error stop ends at the first timeout, unscorable once more than max_error_frac of the
    batch has failed, and the pool scores the next batch with fresh workers."""
    from mlx_rlaif.rewards.build import build_reward

    timeout_s = 2.0
    for on_error, bound in (("stop", timeout_s + 10), ("unscorable", 3 * timeout_s + 10)):
        cfg = check(load(None, [f"reward.components=[{{kind: function, fn: '{fns}:forever', "
                                f"weight: 0.3, timeout_s: {timeout_s:g}}}]",
                                "reward.workers=2", f"reward.on_error={on_error}"]))
        reward = build_reward(cfg)
        try:
            reward.score(_tasks(1), ["warm"])  # the workers started
            t0 = time.monotonic()
            with pytest.raises(RewardError, match=r"timed out after 2 s \(its worker was killed"
                                                  if on_error == "stop" else
                               r"failed on [45] of 32 completions, above reward.max_error_frac "
                               r"0.1 \(the other \d+ not tried\)"):
                reward.score(_tasks(32), ["hang"] * 32)
            took = time.monotonic() - t0
            print(f"{on_error}: {took:.1f} s")
            assert took < bound, (on_error, took)  # the old pool: 33.9 s measured (stop)
            assert [r.value for r in reward.score(_tasks(2), ["a", "b"])] == [0.3, 0.3]
        finally:
            reward.close()


def test_on_error_stop_cancels_at_the_first_error_not_after_every_call(fns):
    """An error (not a hang) stops the batch too: a function that takes 0.5 s and raises, 16
    completions on one worker, gives up after its first answer (the old pool: 8 s)."""
    reward = ComponentsReward([], [_function(fns, "slow_raise")])
    try:
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="no rule, slowly"):
            reward.score(_tasks(16), ["a"] * 16)
        assert time.monotonic() - t0 < 4
    finally:
        reward.close()


def test_the_step_a_function_receives_is_the_step_of_batches_jsonl():
    """Issue 57: a training step's batch is numbered in batches.jsonl after its update (1 for
    the first step); the functions got the count before it (0, 1, 2 for steps 1, 2, 3), so
    they could not tell the first step from `score`'s documented 0."""
    from types import SimpleNamespace

    from mlx_rlaif.records import Reward, Rollout
    from mlx_rlaif.train.step import score

    class Seen:
        step: int | None = None
        steps: list[int | None] = []

        def score(self, tasks, texts):
            self.steps.append(self.step)
            return [Reward(1.0) for _ in texts]

    seen = Seen()
    cfg = SimpleNamespace(generation=SimpleNamespace(max_turns=1, num_samples_per_prompt=1),
                          rl=None)
    task = Task(id="t", prompt="p")
    rollouts = [Rollout(task, (1,), (2,), (0.0,), "x", "stop", 1.0)]
    for done in range(3):  # run.state.step: the steps done before this one
        score(SimpleNamespace(reward_fn=seen, cfg=cfg, state=SimpleNamespace(step=done)),
              rollouts)
    assert seen.steps == [1, 2, 3]


# --- combining components ----------------------------------------------------------------


def _function(fns: Path, name: str, weight: float = 1.0, batched: bool = False,
              group: bool = False, timeout_s: float = 5.0) -> Custom:
    spec = f"{fns}:{name}"
    fn = load_function(spec, {}, None, group)
    pool = WorkerPool(spec, {}, group, 1, 4, timeout_s, fn.is_async)
    return Custom(name, weight, pool.run, spec, fn.batched, group, timeout_s, pool.close)


def test_weighted_sum_none_left_out_and_metrics(fns):
    reward = ComponentsReward([("syntax", 1.0, SyntaxReward())],
                              [_function(fns, "none_for_b", 0.5), _function(fns, "length", 0.0)])
    try:
        reward.score(_tasks(3), ["a", "b", "c"])  # no step set: a held-out evaluation
        assert reward.metrics() == {}  # its completions stay out of the step's statistics
        reward.step = 4
        out = reward.score(_tasks(3), ["a", "b", "def ("])
        assert [r.value for r in out] == [1.5, 1.0, 0.5]  # b: syntax alone; length: weight 0
        assert out[0].parts == {"syntax": 1.0, "syntax/parses": 1.0, "none_for_b": 1.0,
                                "length": 1.0}
        m = reward.metrics()
        assert m["reward/none_for_b/frac_none"] == pytest.approx(1 / 3)
        assert m["reward/length/mean"] == pytest.approx(7 / 3)
        assert m["reward/syntax/errors"] == 0 and m["reward/length/seconds"] > 0
        assert reward.metrics() == {}  # reset: a step's metrics are that step's
    finally:
        reward.close()


def test_every_trained_component_none_is_unscorable_and_normalize_works(fns):
    reward = ComponentsReward([], [_function(fns, "none_for_b"), _function(fns, "length", 0)],
                              aggregation="normalize")
    try:
        out = reward.score(_tasks(3), ["b", "a", "b"])
        assert out[0].value is None and out[2].value is None
        assert out[1].value == 0.0  # alone in its group: no spread
        out = ComponentsReward([], [_function(fns, "length")], "normalize").score(
            _tasks(2), ["aa", "a"])
        assert [r.value for r in out] == pytest.approx([1.0, -1.0])
    finally:
        reward.close()


def test_an_error_stops_with_the_function_and_task_or_is_counted(fns):
    reward = ComponentsReward([], [_function(fns, "raises")])
    with pytest.raises(RewardError, match=r"reward component raises \(.*fns.py:raises\) on task "
                                          r"t: ValueError: no rule for t \(fns.py:\d+\)"):
        reward.score(_tasks(2), ["a", "b"])
    reward.close()
    reward = ComponentsReward([], [_function(fns, "nan"), _function(fns, "length")],
                              on_error="unscorable", max_error_frac=1.0)
    try:
        reward.step = 0
        out = reward.score(_tasks(2), ["a", "bb"])
        assert [r.value for r in out] == [1.0, 2.0] and out[0].parts["nan"] is None
        assert "returned float nan" in out[0].reason
        assert reward.metrics()["reward/nan/errors"] == 2
        reward.max_error_frac = 0.5
        with pytest.raises(RewardError, match=r"failed on 2 of 2 completions, above "
                                              r"reward.max_error_frac 0.5"):
            reward.score(_tasks(2), ["a", "b"])
    finally:
        reward.close()


def test_functions_of_lists_get_the_batch_or_each_group(fns):
    tasks = _tasks(2, "p") + _tasks(2, "q")
    reward = ComponentsReward([], [_function(fns, "ranks", batched=True, group=True)])
    try:
        assert [r.value for r in reward.score(tasks, ["aaa", "a", "b", "bbbb"])] == \
            [1.0, 0.0, 0.0, 1.0]  # ranked within each prompt's group
    finally:
        reward.close()
    reward = ComponentsReward([], [_function(fns, "wrong_length", batched=True)])
    try:
        with pytest.raises(RewardError, match="returned 1 values for 4 completions"):
            reward.score(tasks, ["a"] * 4)
    finally:
        reward.close()


def test_a_function_gets_the_exec_result(fns):
    from mlx_rlaif.config import ExecConfig
    from mlx_rlaif.rewards.exec import ExecReward

    task = Task(id="add", prompt="def add(a, b):\n", entry_point="add",
                tests=({"args": [1, 2], "expected": 3}, {"args": [0, 0], "expected": 0}))
    reward = ComponentsReward([("exec", 1.0, ExecReward(ExecConfig(workers=1)))],
                              [_function(fns, "uses_exec", 0.0)])
    try:
        out = reward.score([task, task], ["def add(a, b):\n    return a + b\n",
                                          "def add(a, b):\n    return a - b\n"])
        assert [r.parts["uses_exec"] for r in out] == [1.0, 0.0]
        assert out[0].details["all_passed"] is True and out[1].details["all_passed"] is False
    finally:
        reward.close()


def test_units_carry_every_field_of_the_record():
    task = Task(id="t", prompt="p", entry_point="f", meta={"solution": "s", "label": 3})
    (u,) = units([task], ["```python\nx = 1\n```"], [None])
    assert u["code"] == "x = 1" and u["record"] == {"id": "t", "prompt": "p",
                                                    "language": "python", "entry_point": "f",
                                                    "solution": "s", "label": 3}


# --- the reward server -------------------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    """`mlx-rlaif serve-reward` on a free port of 127.0.0.1: its URL."""
    p = tmp_path / "server_fns.py"
    p.write_text("def score(completion, label=None, bonus=0.0):\n"
                 "    if completion == 'boom':\n        raise RuntimeError('bad input')\n"
                 "    return {'score': len(completion) + bonus, 'label': label or 0}\n")
    proc = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward",
                             f"{p}:score", "--port", "0", "--kwarg", "bonus=0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert m, line
    yield m.group(0)
    proc.terminate()
    proc.wait(30)


def test_the_client_against_the_real_server(served):
    tasks = _tasks(2)
    args = units(tasks, ["ab", "abcd"], [None, None])
    client = ServerClient(served, "mlx-rlaif", {}, 30)
    out = client.score(args, 3)
    assert [check_value(v) for _, v in out] == [(2.5, {"label": 0.0}), (4.5, {"label": 0.0})]
    # OpenRLHF's form: query = prompt + completion, labels from the record
    client = ServerClient(served, "openrlhf", {}, 30)
    tasks = [Task(id="t", prompt="P:", meta={"label": 1})]
    assert client.score(units(tasks, ["xyz"], [None]), 0) == [("ok", {"score": 3.5,
                                                                      "label": 1})]
    status, line = ServerClient(served, "mlx-rlaif", {}, 30).score(
        units(_tasks(1), ["boom"], [None]), 0)[0]
    assert status == "error" and line.startswith(f"{served} answered HTTP 422: ") \
        and "RuntimeError: bad input" in line


def test_openrlhf_requests_answered_in_their_form(served):
    import urllib.request

    body = json.dumps({"query": ["P:ab"], "prompts": ["P:"], "labels": [None]}).encode()
    req = urllib.request.Request(served, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # as OpenRLHF's requests.post(json=)
        answer = json.loads(r.read())
    assert answer == {"rewards": [{"score": 2.5, "label": 0}],
                      "scores": [{"score": 2.5, "label": 0}], "extra_logs": {}}


def test_retries_only_connection_errors_and_5xx():
    hits: list[int] = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(1)
            code, body = (503, b"{}") if len(hits) < 3 else (200, b'{"rewards": [1, 2]}')
            if self.path == "/short":
                code, body = 200, b'{"rewards": [1]}'
            if self.path == "/bad":
                code, body = 400, b'{"error": "no items"}'
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    slept: list[float] = []
    args = units(_tasks(2), ["a", "b"], [None, None])
    try:
        client = ServerClient(url + "/", "mlx-rlaif", {}, 10, sleep=slept.append)
        assert client.score(args, 0) == [("ok", 1), ("ok", 2)] and slept == [0.5, 1.0]
        hits.clear()
        slept.clear()
        out = ServerClient(url + "/bad", "mlx-rlaif", {}, 10, sleep=slept.append).score(args, 0)
        assert out[0] == ("error", f"{url}/bad answered HTTP 400: no items") and not slept
        out = ServerClient(url + "/short", "mlx-rlaif", {}, 10, sleep=slept.append).score(args, 0)
        assert out[0] == ("error", f"{url}/short returned 1 rewards for 2 completions")
    finally:
        server.shutdown()
        server.server_close()
    out = ServerClient(url + "/", "mlx-rlaif", {}, 10, sleep=slept.append).score(args, 0)
    assert out[0][0] == "error" and out[0][1].startswith(f"{url}/ unreachable after 4 tries")
    assert slept == [0.5, 1.0, 2.0]


# --- the shipped examples ---------------------------------------------------------------------


def _example(name: str, fn: str):
    return load_function(f"{EXAMPLES / name}:{fn}", {}, None).fn


def test_the_format_reward():
    one_fence = _example("format_reward.py", "one_fence")
    assert one_fence("```python\nx = 1\n```", "python") == 1.0
    assert one_fence("Here:\n```python\nx = 1\n```", "python") == 0.5
    assert one_fence("```rust\nfn main() {}\n```", "python") == 0.0
    assert one_fence("```python\na\n```\n```python\nb\n```", "python") == 0.0
    assert one_fence("x = 1", "python") == 0.0


def test_the_length_penalty_and_the_clean_pass():
    length_penalty = _example("length_penalty.py", "length_penalty")
    assert length_penalty("x" * 400) == 0.0
    assert length_penalty("x" * 1000) == pytest.approx(-0.5)
    assert length_penalty("x" * 5000) == -1.0
    clean_pass = _example("clean_pass.py", "clean_pass")
    passed = {"passed": 2, "total": 2}
    assert clean_pass("return 1", passed)["score"] == 1.0
    assert clean_pass("print(1)\nreturn 1", passed)["score"] == 0.0
    assert clean_pass("return 1", {"passed": 1, "total": 2})["score"] == 0.0
    assert clean_pass("return 1", None) is None and clean_pass("x", {"passed": 0, "total": 0}) \
        is None


def test_the_reward_model_example_scores_in_zero_one():
    score = _example("reward_model.py", "score")
    out = score(["def add(a, b):\n"] * 2, ["    return a + b\n", "zzzz qqqq"])
    assert all(0 < v <= 1 for v in out) and out[0] != out[1]


def test_ranks_sum_component_errors_and_wait_for_the_slowest():
    from mlx_rlaif.train.distributed_metrics import combine

    out = combine([({"reward/f/errors": 1.0, "reward/f/timeouts": 0.0, "reward/f/seconds": 0.2,
                     "reward/f/mean": 0.5}, 4),
                   ({"reward/f/errors": 2.0, "reward/f/timeouts": 1.0, "reward/f/seconds": 0.5,
                     "reward/f/mean": 1.0}, 4)])
    assert out == {"reward/f/errors": 3.0, "reward/f/timeouts": 1.0, "reward/f/seconds": 0.5,
                   "reward/f/mean": 0.75}


def test_the_dashboard_shows_each_component():
    from mlx_rlaif.metrics.dashboard import component_cell
    from mlx_rlaif.metrics.stats import components

    m = {"reward/mean": 0.5, "reward/fmt/mean": 0.62, "reward/fmt/std": 0.31,
         "reward/fmt/frac_none": 0.25, "reward/fmt/errors": 0.0, "reward/fmt/timeouts": 2.0,
         "reward/fmt/seconds": 0.01, "reward/exec/seconds": 0.2}
    assert components([m]) == ["fmt", "exec"]
    assert component_cell(m, "fmt") == "fmt 0.62±0.31 none 25% timeouts 2"


def test_exec_the_judge_and_a_function_as_components(fns, tmp_path, monkeypatch):
    """The teacher as one component of the list, against the fake OpenAI server: its value
    (0.55 from the fake judge's scores) joins exec and a function in the weighted sum."""
    from fake_api import FakeAPI

    from mlx_rlaif.rewards.build import build_reward

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    task = Task(id="add", prompt="def add(a, b):\n", entry_point="add",
                tests=({"args": [1, 2], "expected": 3},))
    with FakeAPI() as server:
        cfg = check(load(None, [
            "reward.teacher.provider=openai", "reward.teacher.model=judge",
            f"reward.teacher.base_url={server.openai_url}", "reward.teacher.reference=false",
            "reward.exec.workers=1", f"reward.components=[{{kind: exec}}, {{kind: teacher, "
            f"weight: 0.5, name: judge}}, {{kind: function, fn: '{fns}:length', weight: 0.1}}]"]))
        reward = build_reward(cfg, tmp_path, {"python"}, {"prompt"})
        try:
            (out,) = reward.score([task], ["def add(a, b):\n    return a + b\n"])
        finally:
            reward.close()
    assert out.parts["exec"] == 1.0 and out.parts["judge"] == pytest.approx(0.55)
    assert out.value == pytest.approx(1.0 + 0.5 * 0.55 + 0.1 * out.parts["length"])
    assert "judge/correctness" in out.parts


def test_tensorboard_gets_each_component():
    from mlx_rlaif.metrics.stats import RunStats
    from mlx_rlaif.metrics.tensorboard import step_scalars

    m = {"reward/mean": 0.5, "reward/fmt/mean": 0.62, "reward/fmt/errors": 1.0,
         "reward/fmt/std": float("nan")}
    out = step_scalars(m, RunStats())
    assert out["reward/fmt/mean"] == 0.62 and out["reward/fmt/errors"] == 1.0
    assert "reward/fmt/std" not in out  # NaN (no value that step) is left out, not written


def test_an_openrlhf_reward_func_file_runs_unchanged(fns):
    tasks = [Task(id="a", prompt="P:", meta={"label": 10}), Task(id="b", prompt="P:")]
    reward = ComponentsReward([], [_function(fns, "reward_func", batched=True)])
    try:
        assert [r.value for r in reward.score(tasks, ["xy", "xyz"])] == [12.0, 3.0]
    finally:
        reward.close()


def test_a_server_that_does_not_answer_in_time_is_named(tmp_path):
    import socket

    from mlx_rlaif.rewards.build import build_reward

    silent = socket.socket()  # accepts connections (the backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
    cfg = check(load(None, [f"reward.components=[{{kind: syntax}}, {{kind: server, url: '{url}', "
                            "timeout_s: 1}]"]))
    reward = build_reward(cfg)
    try:
        with pytest.raises(RewardError, match=re.escape(f"reward component server ({url}) on "
                                                        f"task t: {url} did not answer within 1 s")):
            reward.score(_tasks(1), ["x = 1"])
    finally:
        reward.close()
        silent.close()


def test_serve_reward_refuses_a_missing_function_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward", "nowhere.py:fn"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "mlx-rlaif serve-reward: error: reward function nowhere.py:fn: file nowhere.py not "
        "found: give the path of a .py file (relative to where you run mlx-rlaif)"), r.stderr


# --- hostile values (red-team pass 1 of issue 57: B1-B4 and the minor findings) --------------

HOSTILE = '''
import sys, time

def bigint(completion):
    return 10**400

class Slow(float):
    def __float__(self):
        time.sleep(3600)
        return 0.5

def slow_float(completion):
    return Slow(0.5)

class Own(float):
    pass

def own_float(completion):
    return Own(0.25)

class Evil:
    def __reduce__(self):
        return (time.sleep, (3600,))

class SlowMap(dict):
    def items(self):
        time.sleep(3600)

def slow_map(completion):
    return SlowMap(a=1.0)

def evil_reduce(completion):
    return Evil()

class Boom(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.b = b

def raises_own(completion):
    raise Boom("x\\nscored 9/9", 1)

def prints(completion):
    print("\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\nscored 9/9 completions with fake: mean reward 1")
    sys.stderr.write("\\x1b[31mRED\\x1b[0m\\n")
    return 0.5
'''


@pytest.fixture
def hostile(tmp_path) -> Path:
    p = tmp_path / "hostile.py"
    p.write_text(HOSTILE)
    return p


@pytest.mark.parametrize("value, match", [
    (10**400, "int of 401 digits"), ({"score": 0.5, "x": 10**400}, r"\['x'\] int"),
    (True, "bool True"), ({"a": False}, r"\['a'\] bool"), ({}, "an empty dict"),
    (1e308, None), ({"a": 1e300, "b": 1e300}, "above 1e\\+100"),
    (1e101, "above 1e\\+100"),
], ids=["bigint", "dict-bigint", "true", "dict-false", "empty-dict", "1e308", "dict-sum",
        "1e101"])
def test_huge_bool_and_empty_values_are_refused_in_one_line(value, match):
    """B1 and the minor findings: an int too large for a float raised OverflowError (a
    traceback, even under on_error unscorable), a bool read as 1.0 / 0.0 and an empty dict was
    silently None; a value whose sums and squares can overflow (past 1e100) is refused."""
    if match is None:  # 1e308 is finite but past the bound too
        match = "above 1e\\+100"
    with pytest.raises(ValueProblem, match=match):
        check_value(value)


def _fixed(name: str, value, weight: float = 1.0) -> Custom:
    """A component whose every completion gets `value` (no worker)."""
    return Custom(name, weight, lambda units, step, give_up: [("ok", value)] * len(units),
                  name)


def test_a_weighted_value_or_a_total_that_is_not_finite_is_refused_naming_the_component():
    """B2: a finite value x its weight (1e308 x 2) overflowed to inf: score wrote `"reward":
    Infinity` and training logged NaN losses. The weighted value is checked as the value is
    (finite, within 1e100: a batch's sums and squares stay finite), and so is the total of the
    components."""
    reward = ComponentsReward([], [_fixed("big", 1e100, weight=1e250)])
    with pytest.raises(RewardError, match=r"reward component big \(big\) on task t: weighted "
                                          r"by 1e\+250 .* not finite"):
        reward.score(_tasks(1), ["a"])
    reward = ComponentsReward([], [_fixed("a", 1e100), _fixed("b", 1e100)])
    with pytest.raises(RewardError, match=r"reward on task t: the total of the components a, b "
                                          r"is 2e\+100, above 1e\+100 in size"):
        reward.score(_tasks(1), ["a"])
    reward = ComponentsReward([], [_fixed("big", 1e100, weight=1e250)], on_error="unscorable",
                              max_error_frac=1.0)
    [r] = reward.score(_tasks(1), ["a"])
    assert r.value is None and "not finite" in r.reason


def test_a_returned_value_crosses_to_the_trainer_as_plain_data_under_the_timeout(hostile):
    """B3: the trainer unpickled what a function returned, outside the timeout: an own-class
    float was ModuleNotFoundError (a traceback), an object whose __reduce__ sleeps hung the
    trainer past timeout_s. The worker converts the value (float, None, dict of str -> float)
    under the timeout and sends JSON text; anything else is an error line. A float subclass is
    read as the float it is (its own `__float__`, which sleeps, is never called); a dict whose
    `items()` sleeps is converted in the worker, so it is a timeout, not a hung trainer."""
    for name, expect in (("own_float", ("ok", 0.25)), ("bigint", "error"),
                         ("evil_reduce", "error"), ("slow_float", ("ok", 0.5)),
                         ("slow_map", ("timeout", None)),
                         ("raises_own", "error")):
        pool = WorkerPool(f"{hostile}:{name}", {}, False, 1, 1, 2.0)
        try:
            t0 = time.monotonic()
            [out] = pool.run([{"completion": "x"}], 0)
            assert time.monotonic() - t0 < 2.0 + 10, name
            if expect == "error":
                assert out[0] == "error" and isinstance(out[1], str), out
            else:
                assert out == expect, (name, out)
        finally:
            pool.close()


def test_a_functions_prints_reach_the_terminal_only_sanitized_and_prefixed(hostile):
    """B4: a function's prints reached the terminal raw (OSC 52, clear screen, a fake `scored
    9/9` line). Each line of its stdout and stderr is relayed through terminal.visible, on one
    line, after the function's name."""
    code = ("import sys, time\n"
            "from mlx_rlaif.rewards.custom.pool import WorkerPool\n"
            f"p = WorkerPool({str(hostile) + ':prints'!r}, {{}}, False, 1, 1, 10.0)\n"
            "print(p.run([{'completion': 'x'}], 0), file=sys.stderr)\n"
            "time.sleep(0.5)\np.close()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "[('ok', 0.5)]" in r.stderr, out
    assert "\x1b" not in out and "\x07" not in out, out
    for line in out.splitlines():
        assert not line.startswith("scored"), line
    relayed = [ln for ln in out.splitlines() if "hostile.py:prints" in ln]
    assert any("\\x1b]52;c;" in ln for ln in relayed) and any("RED" in ln for ln in relayed), out
