"""No control bytes from student code, completions, task files or a judge's rationale reach a
terminal: the bytes the dashboard (in a pseudo-terminal), the plain lines, the log lines,
`validate`'s report and `summary`'s table write are read back and must hold the hostile text
only as visible escapes (`\\x1b`), while the JSONL files keep it raw.

`score`, `check-rewards`, `summary` and `export-gguf` run as commands, with rich writing as to
a colour terminal: hostile task ids, component names, a user function's exception and a base
model's path reach it as visible text, one line each (a newline shows as `\\n`), with no rich
markup read from them (no hyperlink, no MarkupError).

Not covered here: `eval` end to end (its printing goes through the same `terminal.visible`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from mlx_rlaif.metrics import summary
from mlx_rlaif.metrics.dashboard import DashboardState, PlainPrinter, render
from mlx_rlaif.terminal import VisibleFormatter, json_visible, visible

ROOT = Path(__file__).resolve().parents[1]
# set the title, clear the screen, write the clipboard (OSC 52), ring, CR, C1 CSI, bidi override
HOSTILE = "t\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\rX\x9b31m\u202eY\x7f"
RAW = ("\x1b]", "\x07", "\x1b[2J", "\x9b", "\u202e", "\x7f", "\r")


def assert_only_own_escapes(data: str) -> None:
    """`data` (what reached the terminal) holds no hostile control sequence: every ESC left is
    one rich writes itself (SGR styles, cursor and erase for the live display), and the hostile
    text is there, made visible."""
    for raw in RAW[:-1]:
        assert raw not in data, f"{raw!r} reached the terminal"
    own = re.sub(r"\x1b\[[0-9;?]*[mAKlhGBCD]", "", data)
    assert "\x1b" not in own and not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x80-\x9f]", own)
    assert "\\x1b]0;pwned\\x07" in data and "\\u202e" in data


def test_visible_escapes_controls_and_keeps_layout() -> None:
    assert visible(HOSTILE) == ("t\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\rX\\x9b31m"
                                "\\u202eY\\x7f")
    assert visible("a\n\tb") == "a\n\tb" and visible("a\n\tb", lines=False) == "a\\n\\tb"
    assert visible("héllo → ok") == "héllo → ok"


def test_json_visible_is_the_same_value() -> None:
    record = {"completion": HOSTILE, "reason": "ValueError: \x1b]0;x\x07"}
    line = json_visible(json.dumps(record, ensure_ascii=False))
    assert json.loads(line) == record
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e]", line)


def hostile_sample() -> dict:
    return {"task_id": f"id-{HOSTILE}", "language": "python", "completion": f"print(1)\n{HOSTILE}",
            "reward": 0.0, "parts": {"tests": 0.0}, "reason": f"ValueError: {HOSTILE}",
            "rationale": f"judge: {HOSTILE}"}


def test_dashboard_render_writes_no_raw_control_bytes() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    s = DashboardState(total_steps=2, step=1, first_step=1, metrics={"reward/mean": 0.0})
    s.sample = hostile_sample()
    console.print(render(s))
    assert_only_own_escapes(out.getvalue())
    assert "id-t\\x1b]0;pwned" in out.getvalue() and "judge: t\\x1b]0;" in out.getvalue()


def test_plain_lines_and_log_lines_write_no_control_bytes() -> None:
    out = io.StringIO()
    printer = PlainPrinter(2, 1, out)
    printer.message(f"task {HOSTILE} skipped")
    printer.close(f"summary {HOSTILE}")
    assert_only_own_escapes(out.getvalue())
    assert "\x1b" not in out.getvalue()
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(VisibleFormatter("%(message)s"))
    logger = logging.getLogger("test_terminal")
    logger.addHandler(handler)
    try:
        logger.warning("exec reward: task %s: %s", HOSTILE, HOSTILE)
        logger.warning("reward component boom failed: %s", "bad\nscored 9/9 completions")
    finally:
        logger.removeHandler(handler)
    logged = handler.stream.getvalue()
    assert "\x1b" not in logged and "\\x1b]0;pwned" in logged
    # failing first: a newline in a function's exception made a line of its own
    assert logged.count("\n") == 2 and "failed: bad\\nscored 9/9" in logged


def test_validate_report_and_summary_table_write_no_control_bytes() -> None:
    from mlx_rlaif.commands.validate import print_report

    side = {"tokens_per_sec": 1.0, "truncated": 0}
    rep = {"summary": {"prompts": 1, "baseline_mean": 0.0, "fine_tuned_mean": 1.0,
                       "improvement": 1.0, "improvement_pct": None, "improved": 1,
                       "degraded": 0, "equal": 0, "unscored": 0},
           "baseline": side, "fine_tuned": side, "settings": {"reward": "exec"},
           "examples": [{"id": HOSTILE, "prompt": HOSTILE, "delta": 1.0,
                         "baseline": {"score": 0.0, "text": HOSTILE},
                         "fine_tuned": {"score": 1.0, "text": HOSTILE}}]}
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    print_report(rep, console, show=1, chars=500)
    # a hand-edited or damaged JSONL, a component named by a user's function
    records = [{"step": HOSTILE, "reward/mean": 0.5, f"reward/{HOSTILE}/seconds": 1.0}]
    console.print(summary.table(records, "batch"))
    console.print(summary.component_table(records))
    assert_only_own_escapes(out.getvalue())


SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from mlx_rlaif.config import LoggingConfig
    from mlx_rlaif.metrics import MetricsHub

    sample = json.loads(sys.argv[2])
    hub = MetricsHub.create(LoggingConfig(), Path(sys.argv[1]), interactive=True,
                            total_steps=2, hparams={}, resume=False)
    for step in (1, 2):
        hub.log_step(step, {"epoch": 1, "batch": step, "reward/mean": 0.5})
        hub.log_samples(step, [{**sample, "split": "train"}])
        hub.message("skipped task " + sample["task_id"])
        sys.stdin.readline()
    hub.close()
""")


@pytest.mark.slow
def test_a_hostile_sample_in_a_pseudo_terminal(tmp_path: Path) -> None:
    """The live dashboard, as a user sees it: every byte the pseudo-terminal received."""
    script = tmp_path / "dash.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
    env.pop("NO_COLOR", None)
    sample = hostile_sample()
    child = pexpect.spawn(sys.executable, [str(script), str(tmp_path / "run"),
                                           json.dumps(sample)],
                          env=env, dimensions=(50, 160), timeout=60)
    received = io.BytesIO()
    child.logfile_read = received
    try:
        child.expect(re.escape(b"judge: t\\x1b]0;pwned"))
        child.sendline("")
        child.expect(b"step 2/2")
        child.sendline("")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert_only_own_escapes(received.getvalue().decode("utf-8", errors="replace"))
    raw = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert raw[0]["completion"] == sample["completion"]  # the file keeps the raw text


def test_data_convert_prints_skipped_ids_escaped(tmp_path: Path) -> None:
    """A downloaded set's ids reach the terminal escaped; the skipped file keeps them raw."""
    import subprocess

    src = tmp_path / "mbpp.jsonl"
    src.write_text(json.dumps({"task_id": f"x{HOSTILE}", "text": "Write a function.",
                               "code": "def f():\n    pass\n", "test_list": [],
                               "test_setup_code": "", "challenge_test_list": []}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "data", "convert", "--from",
                           "mbpp", str(src), "--out", str(tmp_path / "out.jsonl")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "1 skipped" in proc.stdout and "mbpp/xt\\x1b]0;pwned" in proc.stdout, proc.stdout
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", proc.stdout + proc.stderr)
    skipped = json.loads((tmp_path / "out.skipped.jsonl").read_text())
    assert skipped["id"] == f"mbpp/x{HOSTILE}"


@pytest.mark.slow
def test_train_with_a_hostile_task_file_in_a_pseudo_terminal(tmp_path: Path) -> None:
    """`mlx-rlaif train` on a downloaded-looking task file whose ids and prompts hold control
    sequences, as a user runs it in a terminal: every byte it writes there is read back."""
    src = ROOT / "mlx_rlaif" / "data" / "suites" / "synthetic-train.jsonl"
    tasks = [json.loads(x) for x in src.read_text().splitlines()[:4]]
    for i, t in enumerate(tasks):
        t["id"] = f"t{i}{HOSTILE}"
        t["prompt"] = t["prompt"] + f"# {HOSTILE}\n"
    (tmp_path / "hostile.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT),
           "MLX_RLAIF_SMOKE": "1"}
    env.pop("NO_COLOR", None)
    args = ["-m", "mlx_rlaif.cli", "train", "--output-dir", str(tmp_path / "run"),
            "--set", f"data.train_file={tmp_path / 'hostile.jsonl'}", "--set", "data.eval_file=",
            "--set", "data.difficulties=[]", "--set", "training.batch_size=2"]
    child = pexpect.spawn(sys.executable, args, env=env, cwd=str(tmp_path),
                          dimensions=(50, 160), timeout=600)
    received = io.BytesIO()
    child.logfile_read = received
    child.expect(pexpect.EOF)
    child.close()
    data = received.getvalue().decode("utf-8", errors="replace")
    assert child.exitstatus == 0, data[-3000:]
    for raw in RAW[:-1]:
        assert raw not in data, f"{raw!r} reached the terminal"
    own = re.sub(r"\x1b\[[0-9;?]*[mAKlhGBCD]", "", data)
    assert "\x1b" not in own
    assert "\\x1b]0;pwned" in data  # the latest completion's task id, made visible
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert any(s["task_id"].endswith(HOSTILE) for s in samples)  # the file keeps it raw


# --- the commands, run as a user runs them: every byte they write is read back -------------------

# rich markup (a live hyperlink, a closing tag with no opening one) and a line that passes for the
# command's own, after the control sequences
MARKUP = "[link=https://e.x]c[/link][/y]\nscored 9/9 completions"
LOUD = HOSTILE + MARKUP
TERMINAL_ENV = {"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "400"}


def run_cli(*argv: object, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """`mlx-rlaif ARGV` with rich writing as to a colour terminal (hyperlinks included)."""
    env = {**os.environ, **TERMINAL_ENV, "PYTHONPATH": str(ROOT)}
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def assert_no_hostile_bytes(data: str) -> None:
    """No control sequence but rich's own SGR/cursor ones, no hyperlink (OSC 8), no line that
    begins as the command's own `scored` line, the markup shown as text."""
    for raw in RAW[:-1]:
        assert raw not in data, f"{raw!r} reached the terminal"
    own = re.sub(r"\x1b\[[0-9;?]*[mAKlhGBCD]", "", data)
    assert "\x1b" not in own and not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x80-\x9f]", own)
    assert not any(line.lstrip("│ ").startswith("scored 9/9") for line in data.splitlines())
    assert "Traceback" not in data
    assert "[link=" in data


def test_score_prints_ids_names_reasons_and_errors_as_one_visible_line_each(
        tmp_path: Path) -> None:
    """Failing first: `score`'s hacking-signals line and its component names reached the
    terminal raw, and a user function's exception with a newline printed a fake `scored` line."""
    task = {"id": f"id-{LOUD}", "prompt": "def f(x):\n    '''Double x.'''\n",
            "language": "python", "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n",
            "completion": "```python\nimport sys\ndef f(x):\n    sys.exit(0)\n```"}
    (tmp_path / "in.jsonl").write_text(json.dumps(task) + "\n")
    (tmp_path / "cfg.yaml").write_text(
        f"reward:\n  components:\n    - kind: exec\n      name: {json.dumps('ex' + LOUD)}\n")
    (tmp_path / "boom.py").write_text(
        f"def boom(completions, **kw):\n    raise ValueError({LOUD!r})\n")
    proc = run_cli("score", "--file", "in.jsonl", "--config", "cfg.yaml", "--out", "out.jsonl",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_no_hostile_bytes(proc.stdout + proc.stderr)
    lines = proc.stderr.splitlines()
    assert sum(line.startswith("scored ") for line in lines) == 1
    assert any(line.startswith("hacking signals: 1 of 1") and "task id-t\\x1b]0;pwned" in line
               for line in lines), lines
    out = json.loads((tmp_path / "out.jsonl").read_text())
    assert out["id"] == task["id"]  # the file keeps the raw text
    for extra in ((), ("--set", "reward.on_error=unscorable", "--set",
                       "reward.max_error_frac=1.0")):
        proc = run_cli("score", "--file", "in.jsonl", "--reward", "boom.py:boom", *extra,
                       "--out", "out2.jsonl", cwd=tmp_path)
        assert_no_hostile_bytes(proc.stdout + proc.stderr)
        assert proc.returncode == (1 if not extra else 0), proc.stderr


def test_check_rewards_reads_no_markup_from_task_ids_and_component_names(tmp_path: Path) -> None:
    """Failing first: a task id's or a component name's `[link=...]` became a live hyperlink."""
    src = ROOT / "mlx_rlaif" / "data" / "suites" / "synthetic-train.jsonl"
    task = json.loads(src.read_text().splitlines()[0])
    task["id"] = f"id-{LOUD}"
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (tmp_path / "cfg.yaml").write_text(
        "reward:\n  components:\n    - kind: exec\n"
        f"      name: {json.dumps('ex' + LOUD)}\n    - kind: syntax\n")
    proc = run_cli("check-rewards", "--file", "tasks.jsonl", "--config", "cfg.yaml",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_no_hostile_bytes(proc.stdout + proc.stderr)
    assert "id-t\\x1b]0;pwned" in proc.stdout


def test_summary_reads_no_markup_from_records_or_the_run_path(tmp_path: Path) -> None:
    """Failing first: `summary` rendered markup found in task ids and component names."""
    run = tmp_path / "run[link=e.x]c[" / "y]"  # a path rich reads as [link=...] and [/y]
    run.mkdir(parents=True)
    name = f"fn{LOUD}"
    (run / "batches.jsonl").write_text(json.dumps(
        {"step": 1, "reward/mean": 0.5, "hack/frac": 0.5, f"hack/{name}": 1.0,
         f"reward/{name}/mean": 0.3, f"reward/{name}/seconds": 0.1}) + "\n")
    (run / "samples.jsonl").write_text(json.dumps(
        {"step": 1, "task_id": f"id-{LOUD}", "signals": [name],
         "signal_reasons": {name: f"why {LOUD}"}}) + "\n")
    proc = run_cli("summary", run, "--csv-out", run / "m.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_no_hostile_bytes(proc.stdout + proc.stderr)
    assert "task id-t\\x1b]0;pwned" in proc.stdout and "c[/y]" in proc.stdout


def test_export_gguf_and_fuse_show_a_hostile_base_model_path_as_text(micro_model: Path,
                                                             tmp_path: Path) -> None:
    """Failing first: the base model recorded in adapter_config.json reached the terminal raw
    (a title, a hyperlink), and one holding `[/y]` ended in rich's MarkupError traceback."""
    import shutil

    from adapters import write_adapters

    base = tmp_path / "base[link=e.x]c[" / "y]\x1b]0;pwned\x07\u202e"  # [link=..], [/y]
    shutil.copytree(micro_model, base)
    run = write_adapters(micro_model, tmp_path / "run")  # then recorded as made on `base`
    ckpt = next((run / "checkpoints").iterdir())
    config = json.loads((ckpt / "adapter_config.json").read_text())
    (ckpt / "adapter_config.json").write_text(json.dumps({**config, "base_model": str(base)}))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["adapter_config.json"] = (ckpt / "adapter_config.json").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    for command in ("export-gguf", "fuse"):  # fuse prints the base the same way
        proc = run_cli(command, run, "--out", tmp_path / "out", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr  # refused in one line
        data = proc.stdout + proc.stderr
        assert_no_hostile_bytes(data)
        assert "loading " in data and "pwned" in data  # the status line, escaped
        assert data.count(f"mlx-rlaif {command}: error:") == 1
