"""`--push REPO` on fuse, export-peft and export-gguf: huggingface_hub's real client against a
local fake of the Hub's upload API (tests/fake_hub.py), through the CLI in a subprocess.

Checked: the repo is created private unless --public; the output folder lands in it with a model
card naming the base model, the recipe, the data and the held-out pass@1 before and after; the
token travels only in the Authorization header (never in a file, the card or the output); a
refused upload is one line, exit 1, the export kept; bad flags are one line, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from adapters import write_adapters
from fake_hub import FakeHub

pytest.importorskip("huggingface_hub")
TOKEN = "hf_fake_token_0123456789"
CONFIG = """model:
  path: builtin:tiny-coder
  system_prompt: Write Python.
rl:
  advantage: grpo
  loss: ppo
reward:
  type: exec
data:
  train_file: suite:synthetic
  eval_file: suite:synthetic-eval
training:
  max_steps: 20
  learning_rate: 1.0e-05
"""
EVALS = ('{"before": {"pass@1": 0.25, "tasks": 8}, '
         '"after": {"pass@1": 0.5, "tasks": 8}}')


def cli(hub: FakeHub, *argv) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_XET="1", NO_COLOR="1")
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run of builtin:tiny-coder (Qwen2 tokenizer) with its config and held-out evals."""
    run = write_adapters("builtin:tiny-coder", tmp_path_factory.mktemp("push") / "run")
    (run / "config.yaml").write_text(CONFIG)
    (run / "eval.json").write_text(EVALS)
    return run


def assert_card(text: str, base: str) -> None:
    assert f'base_model: "{base}"' in text
    for line in ("- algorithm: `grpo`", "- reward: `exec`", "- max steps: `20`",
                 "- `suite:synthetic`", "- `suite:synthetic-eval`",
                 "| before training | 0.250 | 8 |", "| after training | 0.500 | 8 |"):
        assert line in text, line


def assert_no_token(hub: FakeHub, out: subprocess.CompletedProcess, folder: Path) -> None:
    assert {r["auth"] for r in hub.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in out.stdout + out.stderr
    for files in hub.repos.values():
        assert all(TOKEN.encode() not in data for data in files.values())
    assert all(TOKEN.encode() not in p.read_bytes() for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_export_peft_push_private_with_a_model_card(run, tmp_path):
    with FakeHub() as hub:
        out = cli(hub, "export-peft", run, "--out", tmp_path / "peft", "--push", "me/coder-peft")
    assert out.returncode == 0, out.stderr
    assert "pushed" in out.stdout and "(private)" in out.stdout
    assert [c.get("visibility", c.get("private")) for c in hub.created] in ([True], ["private"])
    files = hub.repos["me/coder-peft"]
    assert set(files) == {"adapter_model.safetensors", "adapter_config.json", "README.md"}
    assert files["adapter_model.safetensors"] == (tmp_path / "peft" /
                                                  "adapter_model.safetensors").read_bytes()
    assert_card(files["README.md"].decode(), "builtin:tiny-coder")
    assert "library_name: peft" in files["README.md"].decode()
    assert not [r for r in hub.requests if r["path"].startswith("/api/") is False]
    assert_no_token(hub, out, tmp_path / "peft")


@pytest.mark.slow
def test_export_gguf_push_public(run, tmp_path):
    pytest.importorskip("gguf")
    with FakeHub() as hub:
        out = cli(hub, "export-gguf", run, "--out", tmp_path / "g", "--type", "q8_0",
                  "--push", "me/coder-gguf", "--public")
    assert out.returncode == 0, out.stderr
    assert [c.get("visibility", c.get("private")) for c in hub.created] in ([False], ["public"])
    files = hub.repos["me/coder-gguf"]
    assert set(files) == {"tiny-coder-q8_0.gguf", "Modelfile", "README.md"}
    assert files["tiny-coder-q8_0.gguf"][:4] == b"GGUF"
    assert b'SYSTEM """Write Python."""' in files["Modelfile"]
    assert_card(files["README.md"].decode(), "builtin:tiny-coder")
    assert_no_token(hub, out, tmp_path / "g")


@pytest.mark.slow
def test_fuse_push_replaces_the_card_with_ours(run, tmp_path):
    with FakeHub() as hub:
        out = cli(hub, "fuse", run, "--out", tmp_path / "fused", "--push", "me/coder")
    assert out.returncode == 0, out.stderr
    files = hub.repos["me/coder"]
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(files)
    assert_card(files["README.md"].decode(), "builtin:tiny-coder")
    assert "library_name: mlx" in files["README.md"].decode()


@pytest.mark.slow
def test_a_refused_push_is_one_line_and_keeps_the_export(run, tmp_path):
    with FakeHub(fail_status=401) as hub:
        out = cli(hub, "export-peft", run, "--out", tmp_path / "peft", "--push", "me/x")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr and out.stderr.count("error:") == 1
    assert last.startswith("mlx-rlaif export-peft: error: push to me/x failed (HTTP 401)")
    assert "HF_TOKEN" in last
    assert (tmp_path / "peft" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("argv, says", [
    (["--public"], "--public needs --push"),
    (["--push", "no-owner"], "OWNER/NAME"),
])
@pytest.mark.parametrize("command", ["fuse", "export-peft", "export-gguf"])
def test_bad_push_flags_are_one_line(command, argv, says, tmp_path):
    with FakeHub() as hub:
        out = cli(hub, command, tmp_path, "--out", tmp_path / "o", *argv)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1
    assert hub.requests == [] and not (tmp_path / "o").exists()
