"""Hostile paths and model files on the way out (issue 57, item 3, second red-team pass): the run
directory on the dashboard and the plain lines, line separators inside a run's own JSONL files,
export commands given a bad --out or a model whose files do not hold what they claim, format
characters, the model card, stale temporary directories and the printed `ollama` hint.

Every test here failed before its fix (noted per test)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from rich.console import Console

from mlx_rlaif.errors import UsageError
from mlx_rlaif.metrics.dashboard import Dashboard, PlainPrinter
from mlx_rlaif.terminal import visible

ROOT = Path(__file__).resolve().parents[1]
OSC8 = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
FORGED = f"runs/x-{OSC8}\nerror: forged :smile:"  # a hyperlink, a line of its own, an emoji code


def forged_line(data: str) -> bool:
    return any(re.sub(r"\x1b\[[0-9;?]*[mAKlhGBCD]", "", ln).lstrip("│ ").startswith("error: forged")
               for ln in re.split(r"\r?\n|\r", data))


def test_dashboard_messages_are_one_line_of_text_and_its_own_markup_renders() -> None:
    """Failing first: the `saved` message kept the path's newline (a forged `error:` line) and
    rich turned `:smile:` into an emoji; a message printed while the live panel showed made rich
    draw the panel without markup (`mean [bold]0.303[/]`); a component named like markup made a
    hyperlink."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=250)
    board = Dashboard(3, console=console)
    board.start()
    try:
        name = "reward/[link=https://e.x]c[/link]"
        board.step(1, {"reward/mean": 0.303, f"{name}/mean": 0.5, f"{name}/seconds": 0.1},
                   None, None, None)
        board.message(f"saved {FORGED}/checkpoints/checkpoint-final-gs1")
        board.health(type("R", (), {"line": f"health: {FORGED}", "ok": True})())
    finally:
        board.close("done")
    data = out.getvalue()
    assert "\x1b]8" not in data and "😄" not in data and ":smile:" in data
    assert not forged_line(data)
    assert "[bold]" not in data and "[cyan]" not in data and "mean " in data
    assert "[link=https://e.x]c[/link]" in data  # the component's name, shown as text


def test_plain_messages_are_one_line() -> None:
    """Failing first: PlainPrinter.message kept a path's newline."""
    out = io.StringIO()
    PlainPrinter(2, 1, out).message(f"saved {FORGED}")
    assert out.getvalue().count("\n") == 1 and "\x1b" not in out.getvalue()


def run_cli(*argv: object, cwd: Path, timeout: int = 300,
            color: bool = True) -> subprocess.CompletedProcess:
    """`mlx-rlaif ARGV`; with `color` rich writes as to a colour terminal (hyperlinks too), else
    as to a pipe (no spinner lines: one error line is one line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    env.pop("NO_COLOR", None)
    if color:
        env["FORCE_COLOR"] = "1"
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


SEPARATORS = "\u2028\u2029\x85"  # str.splitlines splits on these, JSON does not escape them


def test_a_run_with_line_separators_in_its_tasks_under_a_hostile_output_dir(
        tmp_path: Path) -> None:
    """Failing first: `train --no-dashboard` printed the run directory's newline raw in its
    `saved` and `run directory:` lines; a task prompt holding U+2028 made the run's own
    datasets/*.jsonl unreadable to its readers (train exited 2 after training, export-dataset
    failed)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({
        "id": f"t{i}", "prompt": f'def add_seven(x):\n    """Return x plus 7.{SEPARATORS}"""\n',
        "entry_point": "add_seven", "tests": [{"args": [1], "expected": 8}]}) + "\n"
        for i in range(4)))
    od = tmp_path / f"run-{OSC8}\nerror: forged"
    proc = run_cli("train", "--train-file", tasks, "--eval-file", tasks, "--output-dir", od,
                   "--max-steps", "1", "--no-dashboard", "--set", "reward.exec.sandbox=process",
                   cwd=tmp_path)
    data = proc.stdout + proc.stderr
    assert proc.returncode == 0, data[-3000:]
    assert not forged_line(data) and "\x1b]8" not in data
    assert "run directory: " in proc.stdout and "saved " in proc.stdout
    raw = (od / "datasets" / "train.jsonl").read_bytes()
    assert not any(s.encode() in raw for s in SEPARATORS)  # written escaped
    rows = [json.loads(x) for x in raw.split(b"\n") if x]
    assert rows and all(SEPARATORS in r["prompt"] for r in rows)  # the same value
    proc = run_cli("train", "--resume", od, "--max-steps", "2", "--no-dashboard", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not forged_line(proc.stdout + proc.stderr) and "resuming from " in proc.stdout
    proc = run_cli("export-dataset", od, "--out", tmp_path / "ds", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ds" / "train.jsonl").is_file()


def test_jsonl_readers_split_on_newlines_only(tmp_path: Path) -> None:
    """Failing first: read_jsonl split a file written by another tool (U+2028 raw) into broken
    records."""
    from mlx_rlaif.metrics.jsonl import dumps, read_jsonl

    path = tmp_path / "a.jsonl"
    record = {"prompt": f"a{SEPARATORS}b", "n": 1}
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n" + dumps(record) + "\n")
    assert read_jsonl(path) == [record, record]
    assert not any(s in dumps(record) for s in SEPARATORS)


def test_export_dataset_leaves_no_half_written_directory(tmp_path: Path) -> None:
    """Failing first: an error while exporting left `--out` behind with some split files."""
    run = tmp_path / "run"
    (run / "datasets").mkdir(parents=True)
    (run / "datasets" / "train.jsonl").write_text('{"prompt": "a"}\n')
    (run / "datasets" / "validation.jsonl").write_text('{"prompt": "a"}\nnot json\n{}\n')
    proc = run_cli("export-dataset", run, "--out", tmp_path / "ds", cwd=tmp_path)
    assert proc.returncode == 2 and "validation.jsonl:2" in proc.stderr, proc.stderr
    assert not (tmp_path / "ds").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


# --- export commands: bad --out paths and a model's own files ----------------------------------

def bad_outs(tmp_path: Path) -> list[Path]:
    (tmp_path / "afile").write_text("x")
    return [tmp_path / "afile" / "sub", tmp_path / ("out-" + "x" * 300), Path("/proc/self/x")]


def test_check_out_dir_refuses_paths_it_cannot_create_in_one_line(tmp_path: Path) -> None:
    """Failing first: FileExistsError, ENAMETOOLONG and FileNotFoundError tracebacks."""
    from mlx_rlaif.artifacts import atomic

    for out in bad_outs(tmp_path):
        with pytest.raises(UsageError, match=r"^--out .*: cannot write"):
            atomic.check_out_dir(out)
        with pytest.raises(UsageError), atomic.atomic_dir(out):
            pass


@pytest.mark.parametrize("command", ["export-gguf", "fuse", "export-peft"])
def test_export_commands_refuse_a_bad_out_in_one_line(command: str, micro_model: Path,
                                                      tmp_path: Path) -> None:
    from adapters import write_adapters

    run = write_adapters(micro_model, tmp_path / "run")
    for out in bad_outs(tmp_path):
        proc = run_cli(command, run, "--out", out, cwd=tmp_path, color=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from adapters import write_adapters

    from mlx_rlaif.assets import resolve_model

    root = tmp_path_factory.mktemp("tiny-run")
    tiny = Path(resolve_model("builtin:tiny-coder"))
    return write_adapters(tiny, root / "run"), tiny


def model_copy(tiny: Path, to: Path, file: str, edit) -> Path:
    shutil.copytree(tiny, to)
    path = to / file
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return to


def set_eos(value):
    return lambda cfg: cfg.__setitem__("eos_token_id", value)


def rename_added(tok: dict) -> None:
    tok["added_tokens"][-1]["content"] = "<|renamed|>"


@pytest.mark.parametrize(("file", "edit", "named"), [
    ("config.json", set_eos(-1), "config.json: eos_token_id -1"),
    ("config.json", set_eos("2\nADAPTER x"), "config.json: eos_token_id '2\\nADAPTER x'"),
    ("config.json", set_eos(10**9), "config.json: eos_token_id 1000000000"),
    ("tokenizer.json", rename_added, "tokenizer.json: added_tokens"),
])
def test_export_gguf_names_the_file_and_field_a_model_gets_wrong(
        tiny_run, tmp_path: Path, file: str, edit, named: str) -> None:
    """Failing first: tracebacks from mlx-lm's config check, gguf's special-token writer and its
    `Expected the 1 added token ID(s) to be sequential`."""
    run, tiny = tiny_run
    model = model_copy(tiny, tmp_path / "m", file, edit)
    proc = run_cli("export-gguf", run, "--model", model, "--out", tmp_path / "out", cwd=tmp_path,
                   color=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert named in proc.stderr and not (tmp_path / "out").exists()


def test_export_gguf_names_a_lone_surrogate_in_tokenizer_config(tiny_run, tmp_path: Path) -> None:
    """Failing first: a lone surrogate in tokenizer_config.json was blamed on the checkpoint."""
    run, tiny = tiny_run
    model = shutil.copytree(tiny, tmp_path / "m")
    path = model / "tokenizer_config.json"
    path.write_text(path.read_text().replace('"eos_token": "', '"eos_token": "\\ud800', 1))
    proc = run_cli("export-gguf", run, "--model", model, "--out", tmp_path / "out", cwd=tmp_path,
                   color=False)
    assert proc.returncode == 2, proc.stderr
    assert "tokenizer_config.json" in proc.stderr and "checkpoint" not in proc.stderr
    assert proc.stderr.count("\n") == 1


# --- format characters, the model card, stale temporary directories, the ollama hint -----------

def test_visible_escapes_every_format_character() -> None:
    """Failing first: zero-width characters (U+200B, U+FEFF, ...) reached the terminal raw."""
    cf = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    shown = visible("".join(cf), lines=False)
    assert not any(unicodedata.category(c) == "Cf" for c in shown)
    assert visible("a\u200bb\ufeffc\u2060") == "a\\u200bb\\ufeffc\\u2060"
    assert visible("\U000e0041") == "\\U000e0041"


def test_model_card_keeps_a_hostile_base_path_in_its_code_span() -> None:
    """Failing first: a base path with newlines wrote front matter and headings into the body."""
    from mlx_rlaif.artifacts import hub_push

    base = 'mq"\nlicense: mit\n---\n# Injected heading `x`\n'
    card = hub_push.model_card("gguf", base, {"data": {"train_file": "a\n# B"}}, {},
                               ["m\n# C.gguf"])
    body = card.split("---\n", 2)[2]
    assert not any(ln.startswith(("#", "license:", "---")) for ln in body.splitlines()
                   if not ln.startswith(("# Gguf", "# GGUF", "## ")))
    assert "Injected heading" in body and "\\n" in body


def test_atomic_dir_removes_stale_temporary_dirs_of_dead_processes(tmp_path: Path) -> None:
    """Failing first: a `.OUT.tmp-PID/` left by kill -9 stayed for ever."""
    from mlx_rlaif.artifacts.atomic import atomic_dir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.tmp-{dead.pid}"
    (stale / "sub").mkdir(parents=True)
    alive = tmp_path / f".out.tmp-{os.getppid()}"  # a live process's: kept
    alive.mkdir()
    other = tmp_path / f".other.tmp-{dead.pid}"  # another output's: kept
    other.mkdir()
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("x")
    assert not stale.exists() and alive.exists() and other.exists()
    assert (tmp_path / "out" / "f").read_text() == "x"


def test_the_ollama_hint_is_shell_quoted() -> None:
    """Failing first: `ollama create NAME -f <out>/Modelfile` printed the path unquoted."""
    from mlx_rlaif.commands.export_gguf import ollama_hint

    hint = ollama_hint(Path("my out;rm -rf ~"))
    assert hint == "ollama create NAME -f 'my out;rm -rf ~/Modelfile' && ollama run NAME"


def test_export_dataset_into_a_folder_with_files_replaces_them_or_nothing(tmp_path: Path) -> None:
    """A folder already holding files: an error leaves every file as it was; a good export
    replaces the split files and the card, and keeps the user's own files."""
    from mlx_rlaif.metrics import dataset

    run, out = tmp_path / "run", tmp_path / "ds"
    (run / "datasets").mkdir(parents=True)
    out.mkdir()
    (out / "train.jsonl").write_text('{"old": 1}\n')
    (out / "notes.txt").write_text("mine")
    (run / "datasets" / "train.jsonl").write_text('{"prompt": "a"}\nnot json\n{}\n')
    with pytest.raises(UsageError, match="train.jsonl:2"):
        dataset.export(run, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "run"]
    assert (out / "train.jsonl").read_text() == '{"old": 1}\n'
    (run / "datasets" / "train.jsonl").write_text('{"prompt": "a"}\n')
    assert dataset.export(run, out) == {"train": 1}
    assert (out / "train.jsonl").read_text() == '{"prompt": "a"}\n'
    assert (out / "notes.txt").read_text() == "mine" and (out / "README.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "run"]
