"""Fault injection, secrets: with canary keys in ANTHROPIC_API_KEY, OPENAI_API_KEY, a custom
`api_key_env` (the one the teacher really uses) and HF_TOKEN, a run (exec + teacher, a server
whose error messages quote the key), a crash (an exception: a traceback), a `kill -9` mid-write,
then export-dataset, export-peft and fuse: no file any of them leaves behind (the run
directory, the exports, the fused model, the trainer's temporary directory) and no line they
print holds any of the keys. Figures: docs/reliability.md."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

import pytest
from fake_api import Fail, FakeAPI
from train_cli import command, run_cli

from mlx_rlaif import cli

KEYS = {name: f"canary-{name.lower()}-{secrets.token_hex(8)}" for name in
        ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CUSTOM_TEACHER_KEY", "HF_TOKEN")}


def _scan(paths: list[Path], texts: list[str]) -> list[str]:
    """Every place a key shows up: 'file: KEY' or 'log N: KEY'."""
    found = []
    for root in paths:
        for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                found += [f"{p}: {k}" for k, v in KEYS.items() if v.encode() in data]
    for i, text in enumerate(texts):
        found += [f"log {i}: {k}" for k, v in KEYS.items() if v in text]
    return found


@pytest.mark.slow
def test_no_key_in_any_file_or_log_of_a_run_a_crash_exports_and_a_fuse(
        micro_model, prompts_file, tmp_path, monkeypatch, capfd):
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    tmp = tmp_path / "tmp"  # the trainer's temporary directory: sandbox boxes, caches
    tmp.mkdir()
    if Path("/tmp/mlx").is_dir():  # MLX's compiled CPU kernels: not compiled again
        (tmp / "mlx").symlink_to("/tmp/mlx")
    run, logs = tmp_path / "run", []
    key = KEYS["CUSTOM_TEACHER_KEY"]
    with FakeAPI(api_key=key) as srv:
        n = {"i": 0}

        def responder(req):  # every 5th request fails with the key in the error message
            n["i"] += 1
            if n["i"] % 5 == 0:
                return Fail(500 if n["i"] % 2 else 429, message=f"bad request for key {key}")
            return srv.default_responder(req)

        srv.responder = responder
        teacher = ("reward.type=mix", "reward.teacher.provider=openai",
                   "reward.teacher.model=judge", f"reward.teacher.base_url={srv.openai_url}",
                   "reward.teacher.api_key_env=CUSTOM_TEACHER_KEY", "reward.teacher.max_retries=1",
                   "reward.exec.sandbox=process", "logging.tensorboard=true")
        # tasks without tests: the teacher scores them, the exec part is None (mix: the rest)
        for steps, fault, resume, rc in [(3, None, False, 0), (6, "update@2:raise", True, 1),
                                         (9, "jsonl@3", True, -signal.SIGKILL)]:
            r = run_cli(command(micro_model, prompts_file, run, steps, *teacher, resume=resume),
                        tmp_path, fault=fault, TMPDIR=str(tmp))
            logs += [r.stdout, r.stderr]
            assert r.returncode == rc, r.stderr[-2000:]
        assert "RuntimeError: injected fault at update" in logs[3]  # the crash's traceback
        assert srv.hits() > 0 and all(key in (q.headers.get("authorization") or "")
                                      for q in srv.requests)  # the key was really used
    outs = {name: tmp_path / name for name in ("dataset", "peft", "fused")}
    for argv in (["export-dataset", str(run), "--out", str(outs["dataset"])],
                 ["export-peft", str(run), "--out", str(outs["peft"])],
                 ["fuse", str(run), "--out", str(outs["fused"])]):
        assert cli.main(argv) == 0
    captured = capfd.readouterr()
    logs += [captured.out, captured.err]
    assert all(any(p.iterdir()) for p in outs.values())
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name == "teacher_cache.db" for p in files) and any("tfevents" in p.name
                                                                      for p in files)
    assert _scan([run, tmp, *outs.values()], logs) == []
    probe = tmp_path / "probe.bin"  # the scan would have found one
    probe.write_bytes(b"\0x" + KEYS["OPENAI_API_KEY"].encode())
    assert _scan([probe], ["..." + KEYS["HF_TOKEN"]]) == [f"{probe}: OPENAI_API_KEY", "log 0: HF_TOKEN"]
