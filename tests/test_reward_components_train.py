"""Your own rewards in real runs of the CLI (subprocesses): two steps with the exec reward, the
shipped examples (a format reward at weight 0.3, a length penalty, a reward on the exec result)
and a reward server (the reward model example served by `mlx-rlaif serve-reward`), each
component's metrics in batches.jsonl, its values in samples.jsonl and `export-dataset`, its
row in `summary`; a function that raises stops the run with one line and the last checkpoint
loads; a function that sleeps forever is killed and the run goes on; `score --reward`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.artifacts.integrity import problem

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "rewards"
STATS = ("mean", "std", "frac_none", "errors", "timeouts", "seconds")

FNS = '''
import time

def raises_late(completion, step):
    if step >= 2:
        raise ValueError("the rule broke")
    return 0.5

def step_seen(completion, step):
    return float(step)

def forever(completion):
    time.sleep(10**9)

def half(completion, task_id):
    return 0.5 if task_id == "add-7" else None

def loud(completion):
    print("hello from the function")
    return 1.0
'''


def cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def train(out: Path, *extra: str, steps: int = 2) -> subprocess.CompletedProcess:
    return cli("train", "--model", "builtin:tiny-coder", "--train-file", "suite:synthetic-train",
               "--output-dir", str(out), "--max-steps", str(steps), "--no-dashboard",
               "--set", "data.difficulties=[easy]", "--set", "data.languages=[python]",
               "--set", "data.eval_file=", "--set", "training.batch_size=2",
               "--set", "generation.num_samples_per_prompt=2",
               "--set", "generation.max_new_tokens=24", "--set", "logging.tensorboard=false",
               *extra, cwd=out.parent)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def fns(tmp_path) -> Path:
    p = tmp_path / "fns.py"
    p.write_text(FNS)
    return p


@pytest.fixture
def reward_server(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward",
                             f"{EXAMPLES / 'reward_model.py'}:score", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert m, line
    yield m.group(0)
    proc.terminate()
    proc.wait(30)


@pytest.mark.slow
def test_two_steps_with_exec_the_examples_and_a_server(tmp_path, reward_server):
    out = tmp_path / "run"
    components = (
        "reward.components=[{kind: exec}, "
        f"{{kind: function, fn: '{EXAMPLES / 'length_penalty.py'}:length_penalty', "
        "weight: 0.1, kwargs: {free_chars: 20, max_chars: 80}}, "
        f"{{kind: function, fn: '{EXAMPLES / 'clean_pass.py'}:clean_pass', weight: 0.5}}, "
        f"{{kind: server, url: '{reward_server}', name: rm, weight: 0.2}}]")
    r = train(out, "--reward", f"{EXAMPLES / 'format_reward.py'}:one_fence@0.3",
              "--set", components)
    assert r.returncode == 0, r.stderr[-3000:]
    names = ("exec", "length_penalty", "clean_pass", "rm", "one_fence")
    steps = jsonl(out / "batches.jsonl")
    assert len(steps) == 2
    for m in steps:
        for name in names:
            assert all(f"reward/{name}/{s}" in m for s in STATS), (name, sorted(m))
            assert m[f"reward/{name}/errors"] == 0 and m[f"reward/{name}/timeouts"] == 0
        assert 0 < m["reward/rm/mean"] <= 1 and m["reward/length_penalty/mean"] <= 0
    samples = jsonl(out / "samples.jsonl")
    for s in samples:
        assert set(names) <= set(s["parts"]), s["parts"]
        trained = {"exec": 1.0, "length_penalty": 0.1, "clean_pass": 0.5, "rm": 0.2,
                   "one_fence": 0.3}
        assert s["reward"] == pytest.approx(sum(w * s["parts"][n] for n, w in trained.items()
                                                if s["parts"][n] is not None))
    assert checkpoint.latest_checkpoint(out) is not None
    summary = cli("summary", str(out), cwd=tmp_path)
    assert summary.returncode == 0 and "reward components" in summary.stdout
    assert all(n in summary.stdout for n in names)
    exported = cli("export-dataset", str(out), "--out", str(tmp_path / "ds"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    row = jsonl(tmp_path / "ds" / "train.jsonl")[0]
    assert set(names) <= set(row["scoring_breakdown"])


@pytest.mark.slow
def test_a_raising_function_stops_the_run_and_the_last_checkpoint_loads(tmp_path, fns):
    out = tmp_path / "run"
    r = train(out, "--reward", f"{fns}:raises_late@0.3", "--reward", f"{fns}:step_seen@0",
              "--set", "training.save_every_batches=1", steps=3)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"mlx-rlaif train: error: reward component raises_late \(.*fns\.py:"
                        r"raises_late\) on task \S+: ValueError: the rule broke \(fns\.py:\d+\): "
                        r"fix it, or set reward.on_error unscorable", last), last
    assert "Traceback" not in r.stderr
    (first,) = jsonl(out / "batches.jsonl")  # the second step never updated
    assert first["step"] == 1 and first["reward/step_seen/mean"] == 1.0  # the same number
    ckpt = checkpoint.latest_checkpoint(out)
    assert ckpt is not None and problem(ckpt) is None
    assert checkpoint.load_state(ckpt).step == 1


@pytest.mark.slow
def test_a_function_that_sleeps_forever_is_killed_and_the_run_goes_on(tmp_path, fns):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = train(out, "--set", f"reward.components=[{{kind: exec}}, {{kind: function, "
              f"fn: '{fns}:forever', weight: 0.3, timeout_s: 2}}]",
              "--set", "reward.on_error=unscorable", "--set", "reward.max_error_frac=1",
              steps=1)
    assert r.returncode == 0, r.stderr[-2000:]
    (m,) = jsonl(out / "batches.jsonl")
    assert m["reward/forever/timeouts"] == 4 and m["reward/forever/frac_none"] == 1.0
    assert m["reward/exec/frac_none"] == 0.0  # exec alone scores the step
    assert time.monotonic() - t0 < 300


COMPLETIONS = [
    {"id": "add-7", "prompt": "def add_seven(x):\n", "entry_point": "add_seven",
     "tests": [{"args": [1], "expected": 8}], "completion": "def add_seven(x):\n    return x + 7\n"},
    {"id": "add-8", "prompt": "def add_eight(x):\n", "entry_point": "add_eight",
     "tests": [{"args": [1], "expected": 9}], "completion": "def add_eight(x):\n    return x\n"},
]


def test_score_with_a_function_and_a_hung_one_stopped(tmp_path, fns):
    src = tmp_path / "completions.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in COMPLETIONS))
    r = cli("score", "--reward", "exec", "--reward", f"{fns}:half@0.5", "--file", str(src),
            "--out", str(tmp_path / "scored.jsonl"), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = jsonl(tmp_path / "scored.jsonl")
    assert [x["parts"]["half"] for x in lines] == [0.5, None]
    assert [x["reward"] for x in lines] == pytest.approx([1.0 + 0.25, 0.1])
    assert "with exec + half" in r.stderr
    t0 = time.monotonic()
    r = cli("score", "--file", str(src), "--out", str(tmp_path / "hung.jsonl"), "--set",
            f"reward.components=[{{kind: exec}}, {{kind: function, fn: '{fns}:forever', "
            "timeout_s: 2}]", cwd=tmp_path, timeout=300)
    assert r.returncode == 1
    assert re.search(r"error: reward component forever \(.*\) on task add-\d: timed out after "
                     r"2 s \(its worker was killed\)", r.stderr.strip().splitlines()[-1]), r.stderr
    assert time.monotonic() - t0 < 60 and not (tmp_path / "hung.jsonl").exists()


RANK_FNS = '''
import os

def rank_one_breaks(completion, step):
    if step >= 2 and os.environ.get("MLX_RANK") == "1":  # the second step
        raise ValueError("rank 1's rule broke")
    return 0.5
'''


@pytest.mark.slow
def test_two_ranks_score_their_shares_and_an_error_on_one_stops_both(tmp_path):
    """Under mlx.launch each rank scores its own share with its own workers; the function's
    error on rank 1 at the second step ends both ranks with the line naming it."""
    from test_distributed import LAUNCH, env, free_ports

    (tmp_path / "rank_fns.py").write_text(RANK_FNS)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", "builtin:tiny-coder",
           "--train-file", "suite:synthetic-train", "--output-dir", str(out), "--max-steps", "3",
           "--no-dashboard", "--set", "data.difficulties=[easy]", "--set",
           "data.languages=[python]", "--set", "data.eval_file=", "--set",
           "training.batch_size=2", "--set", "generation.num_samples_per_prompt=2", "--set",
           "generation.max_new_tokens=16", "--set", "logging.tensorboard=false",
           "--reward", f"{tmp_path / 'rank_fns.py'}:rank_one_breaks@0.3"]
    proc = subprocess.run([*LAUNCH, "-n", "2", "-p", str(free_ports(2)), "--", *cmd], env=env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=400)
    # mlx.launch itself exits 0: each rank's exit code is in its warning (the launcher may
    # end the second rank with SIGTERM once the first exits, after both printed their line)
    codes = dict(re.findall(r"Node with rank (\d) exited with code (-?\d+)", proc.stderr))
    assert set(codes) == {"0", "1"} and "0" not in codes.values(), proc.stderr
    (step,) = jsonl(out / "batches.jsonl")  # the first step, scored on both ranks
    assert step["dist/world_size"] == 2 and step["reward/rank_one_breaks/mean"] == 0.5
    lines = [x for x in proc.stderr.splitlines() if x.startswith("mlx-rlaif train: error:")]
    assert len(lines) == 2, proc.stderr  # each rank ends with one line
    assert all("reward component rank_one_breaks" in x and "rank 1's rule broke" in x
               for x in lines), lines
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_eval_with_a_function(tmp_path):
    """`eval --reward`: the function joins the mean reward; pass@1 stays the tests' verdict."""
    r = cli("eval", "--model", "builtin:tiny-coder", "--suite", "synthetic-eval", "--max-tasks",
            "2", "--max-new-tokens", "16", "--reward",
            f"{EXAMPLES / 'length_penalty.py'}:length_penalty@0", "--out",
            str(tmp_path / "ev.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = jsonl(tmp_path / "ev.jsonl")
    assert len(rows) == 2 and all(len(x["rewards"]) == 1 for x in rows)
    assert all((x["correct"] == 1) == x["passed"][0] for x in rows)
    assert "pass@1" in r.stdout


def test_check_rewards_prints_a_table_of_every_component(tmp_path, fns):
    """Reference solutions and a wrong answer of 2 tasks, each component a column; the exec
    reward tells them apart, a function that pays everything the same does not."""
    r = cli("check-rewards", "--set", "data.train_file=suite:synthetic-train", "--tasks", "2",
            "--reward", f"{EXAMPLES / 'clean_pass.py'}:clean_pass@0.5", cwd=tmp_path,
            timeout=300)
    assert r.returncode == 0, r.stderr
    head = next(x for x in r.stdout.splitlines() if "answer" in x)
    assert all(c in head for c in ("task", "exec", "clean_pass", "reward"))
    rows = [x for x in r.stdout.splitlines() if "│ reference" in x or "│ wrong" in x]
    assert len(rows) == 4
    assert all("1.000" in x for x in rows if "reference" in x)
    assert r.stdout.strip().endswith("the wrong answer scores at least the reference on 0 of 2 "
                                     "tasks")
    r = cli("check-rewards", "--set", "data.train_file=suite:synthetic-train", "--tasks", "1",
            "--set", f"reward.components=[{{kind: function, fn: '{fns}:raises_late'}}]",
            cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr  # step 0: raises_late pays 0.5 to both answers
    assert "on 1 of 1 tasks: synthetic/train/python/0000" in r.stdout


def test_what_a_function_prints_goes_to_stderr(tmp_path, fns):
    """`score` without --out writes JSON lines to stdout: a function's prints must not mix in."""
    src = tmp_path / "completions.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in COMPLETIONS))
    r = cli("score", "--reward", "syntax", "--reward", f"{fns}:loud", "--file", str(src),
            cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["parts"]["loud"] for x in r.stdout.splitlines()] == [1.0, 1.0]
    assert "hello from the function" in r.stderr
