"""Fault injection, bad input files: task files with malformed lines, missing or mistyped fields,
unknown languages, bad bytes, nothing in them, tasks the exec reward cannot score, prompts longer
than the model's context, and a config file with every kind of mistake. Each is one line naming
the file and line (or key) and the fix, exit code 2, before anything is written; too-long prompts
are skipped and counted when the run is set up (train/fit.py). Figures: docs/reliability.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from recording_hub import RecordingHub
from train_cli import config, env

from mlx_rlaif.config import load
from mlx_rlaif.data import load_tasks
from mlx_rlaif.errors import ConfigError, DataError
from mlx_rlaif.train import train

GOOD = '{"prompt": "Write f.", "language": "python"}\n'


@pytest.mark.parametrize("lines, words", [
    ([GOOD, GOOD, '{"prompt": "x",\n'], ":3: not valid JSON"),
    ([GOOD, "[1, 2]\n"], ":2: expected a JSON object"),
    (['"just a string"\n'], ":1: expected a JSON object"),
    ([GOOD, '{"language": "python"}\n'], ":2: missing or empty 'prompt'"),
    (['{"prompt": 7}\n'], ":1: missing or empty 'prompt'"),
    (['{"prompt": "   "}\n'], ":1: missing or empty 'prompt'"),
    (['{"prompt": "x", "tests": "assert f()"}\n'], ":1: 'tests' must be a list of objects"),
    (['{"prompt": "x", "tests": [1, 2]}\n'], ":1: 'tests' must be a list of objects"),
    (['{"prompt": "x", "entry_point": 3}\n'], ":1: 'entry_point' must be a string"),
    (['{"prompt": "x", "test": ["check"]}\n'], ":1: 'test' must be a string"),
    (['{"prompt": "x", "id": {"a": 1}}\n'], ":1: 'id' must be a string or an integer"),
    ([GOOD, '{"prompt": "x", "language": "cobol"}\n'], ":2: language 'cobol' is not one of"),
    (['{"prompt": "x", "language": 3}\n'], ":1: language '3' is not one of"),
    ([GOOD, '{"prompt": "caf\xe9"}\n'.encode("latin-1")], ":2: not valid UTF-8 (byte 0xe9"),
    ([], "no tasks"),
    (["\n", "   \n"], "no tasks"),
    (['{"id": "a", "prompt": "x"}\n', '{"id": "a", "prompt": "y"}\n'], "task id 'a' appears twice"),
])
def test_bad_task_files_are_one_line_naming_file_and_line(tmp_path, lines, words):
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(b"".join(x if isinstance(x, bytes) else x.encode() for x in lines))
    with pytest.raises(DataError) as e:
        load_tasks(str(p))
    assert words in str(e.value) and "\n" not in str(e.value)
    if words.startswith(":"):
        assert str(e.value).startswith(f"{p}{words.split(' ')[0]}")


def test_a_byte_order_mark_is_accepted(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_tasks(str(p))[0].prompt == "Write f."


def test_exec_reward_refuses_tasks_it_cannot_score_before_training(micro_model, tmp_path):
    """Seed-format lines (no tests) or tests of an unknown shape would be a None for every
    completion of the whole run: the exec reward names them at setup instead."""
    p = tmp_path / "tasks.jsonl"
    p.write_text(GOOD + json.dumps({"id": "odd", "prompt": "x", "entry_point": "f",
                                    "tests": [{"input": 1, "output": 2}]}) + "\n")
    cfg = load(None, [f"model.path={micro_model}", f"data.train_file={p}",
                      f"training.output_dir={tmp_path / 'run'}", "reward.type=exec"])
    with pytest.raises(DataError, match=r"task tasks.jsonl:1: the task has no tests .*2 of 2"):
        train(cfg, hub=RecordingHub())
    assert not (tmp_path / "run").exists()


# --- prompts longer than the model's context ---------------------------------------------------


@pytest.fixture(scope="module")
def short_context_model(micro_model, tmp_path_factory) -> Path:
    """The micro model, its config saying 64 tokens of context."""
    d = tmp_path_factory.mktemp("short") / "model"
    shutil.copytree(micro_model, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 64}))
    return d


def _tasks(path: Path, sizes: list[int]) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": "word " * n}) + "\n"
                            for i, n in enumerate(sizes)))
    return path


def test_prompts_longer_than_the_context_are_skipped_and_counted(short_context_model, tmp_path):
    tasks = _tasks(tmp_path / "tasks.jsonl", [3, 200, 4, 5, 300, 2])
    hub = RecordingHub()
    run = train(config(short_context_model, tasks, tmp_path / "run", 4), hub=hub)
    line = next(m for m in hub.messages if m.startswith("skipped"))
    assert line.startswith("skipped 2 of 6 training tasks whose prompt + "
                           "generation.max_new_tokens (8) exceed the model's context (64 tokens)")
    assert "t1 (" in line and "t4 (" in line
    ids = {s["task_id"] for s in hub.samples}
    assert ids and ids <= {"t0", "t2", "t3", "t5"}  # the long ones never reach the model
    assert (run / "checkpoints").is_dir()


def test_no_prompt_fits_is_a_data_error_before_anything_is_written(short_context_model,
                                                                   tmp_path):
    tasks = _tasks(tmp_path / "tasks.jsonl", [200, 300])
    with pytest.raises(DataError, match="skipped 2 of 2 training tasks.*none is left"):
        train(config(short_context_model, tasks, tmp_path / "run", 4), hub=RecordingHub())
    assert not (tmp_path / "run").exists()


# --- a config with every kind of mistake --------------------------------------------------------

MISTAKES = [  # (section, line in it or None for "section: 5", the words of its one-line error)
    ("model", "path: 3", "model.path must be a string, got 3: quote it"),
    ("rl", "kl_coef: 0.1", "unknown config key rl.kl_coef: did you mean rl.kl_penalty?"),
    ("rl", "kl_penalty: .inf", "rl.kl_penalty must be a finite number, got inf"),
    ("rl", "advantage: ppo", "rl.advantage = 'ppo' is not one of grpo, rloo, reinforce"),
    ("rl", "num_iterations: -1", "rl.num_iterations = -1 is out of range"),
    ("rll", "clip_low: 0.1", "unknown config key rll: did you mean rl?"),
    ("training", "batch_size: 0", "training.batch_size = 0 is out of range"),
    ("generation", "top_p: 1.5", "generation.top_p = 1.5 is out of range"),
    ("lora", "rank: true", "lora.rank must be an integer, got True"),
    ("data", "max_tasks: 2.5", "data.max_tasks must be an integer, got 2.5"),
    ("reward", "exec_weight: fast", "reward.exec_weight must be a number, got 'fast'"),
    ("logging", "dashboard: maybe", "logging.dashboard must be true or false"),
    ("metrics", None, "unknown config key metrics"),
]


def to_yaml(mistakes: list[tuple]) -> str:
    sections: dict[str, list] = {}
    for section, line, _ in mistakes:
        sections.setdefault(section, []).append(line)
    out = []
    for section, lines in sections.items():
        out += [f"{section}: 5"] if lines == [None] else [f"{section}:", *(f"  {x}" for x in lines)]
    return "\n".join(out) + "\n"


def test_every_kind_of_config_mistake_is_one_line(tmp_path):
    """One file holds all the mistakes: each load names one of them (one line); fixing it names
    the next, until none is left. Then the YAML-level ones: a key given twice, a tab, a list at
    the top, a section that is not a mapping."""
    left = list(MISTAKES)
    p = tmp_path / "bad.yaml"
    while left:
        p.write_text(to_yaml(left))
        with pytest.raises(ConfigError) as e:
            load(p)
        text = str(e.value)
        assert "\n" not in text
        hit = [m for m in left if m[2] in text]
        assert len(hit) == 1, text
        left.remove(hit[0])
    p.write_text("")
    load(p)  # all fixed: it loads
    for text, words in [
        ("reward:\n  type: exec\n  type: teacher\n", "bad.yaml:3: not valid YAML (key 'type' "
                                                     "appears twice in one section)"),
        ("model:\n  path: x\n\tlora: 1\n", "bad.yaml:3: not valid YAML"),
        ("- 1\n- 2\n", "the top level must be a mapping"),
        ("generation: 5\n", "generation: expected a mapping of keys, got int"),
    ]:
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            load(p)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_the_cli_says_one_line_and_exits_2_on_a_config_full_of_mistakes(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(to_yaml(MISTAKES))
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "train", "--config", str(p),
                        "--output-dir", str(tmp_path / "run")], capture_output=True, text=True,
                       cwd=tmp_path, env=env(), timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx-rlaif train: error: "), r.stderr
    assert any(words in lines[0] for _, _, words in MISTAKES)
    assert not (tmp_path / "run").exists()
