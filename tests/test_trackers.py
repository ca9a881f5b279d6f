"""logging.wandb and logging.trackio, with the real packages, offline: W&B in WANDB_MODE=offline
(its run file read back record by record: the LevelDB-style log W&B writes, each record its
protobuf), trackio in its local SQLite store (TRACKIO_DIR). Both must receive TensorBoard's keys
and values, the config and the samples table; a missing package is one line; a training run
from the CLI leaves an offline W&B run directory with its metrics.

Not covered: W&B or trackio servers (never the network).
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_metrics import make_hub, read_events, run_two_epochs, scalars

from mlx_rlaif.errors import UsageError

BLOCK = 32768  # W&B's run file: LevelDB's log format, 32 KiB blocks, 7-byte record headers


def wandb_records(path: Path) -> list:
    """Every record of a .wandb run file, parsed (wandb_internal_pb2.Record)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # the rest of a block is padding
            pos += left - 7
            continue
        chunk, pos = data[pos:pos + n], pos + n
        if kind in (1, 2):  # full, first
            buf = chunk
        else:  # middle, last
            buf += chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def finished_wandb_records(path: Path, timeout_s: float = 120.0) -> list:
    """The records of a run file once W&B has written its last (`exit`) record.

    `run.finish()` returns before W&B's service has written the run file out: it only tells
    the service the run is over (`inform_finish`, fire and forget), and the service flushes and
    closes the file after. A loaded machine read it half written (CI: no history records).
    """
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = wandb_records(path)
            if records and records[-1].WhichOneof("record_type") == "exit":
                return records
        except DecodeError:  # a record cut where the flush stopped
            pass
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.1)


def wandb_history(run_dir: Path) -> tuple[dict[int, dict], dict]:
    """step -> {key: value} of the one offline W&B run under run_dir, and its config."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows, config = {}, {}
    for rec in finished_wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
                   for i in rec.history.item}
            rows[row["_step"]] = row
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            config["_project"], config["_name"] = rec.run.project, rec.run.display_name
    return rows, config


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_gets_tensorboards_keys_config_and_samples(offline, tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    hub = make_hub(run_dir, wandb=True, tracker_project="p52", tracker_run_name="r1")
    run_two_epochs(hub)
    hub.log_eval(4, {"eval/pass@1": 0.5, "eval/reward_mean": 0.25, "step": 4})
    hub.close()
    rows, config = wandb_history(run_dir)
    assert sorted(rows) == [1, 2, 3, 4]
    tb = scalars(read_events(run_dir / "tensorboard"))
    at3 = {tag: by_step[3] for tag, by_step in tb.items() if 3 in by_step}
    got3 = {k: v for k, v in rows[3].items() if not k.startswith("_")}
    assert set(got3) == set(at3)  # step 3 ends no epoch: TensorBoard's step scalars only
    assert all(got3[k] == pytest.approx(v, rel=1e-6) for k, v in at3.items())
    assert rows[4]["eval/pass@1"] == 0.5 and rows[4]["epoch"] == 2
    assert rows[4]["Epoch/AvgReward"] == pytest.approx(tb["Epoch/AvgReward"][2])
    assert rows[4]["samples/_type"] == "table-file" and rows[4]["samples/nrows"] == 12
    (table,) = run_dir.glob("wandb/offline-run-*/files/media/table/samples_*.table.json")
    t = json.loads(table.read_text())
    assert t["columns"] == ["step", "split", "task_id", "reward", "completion"]
    assert t["data"][0][:4] == [1, "train", "t1", 0.5] and t["data"][1][3] is None
    assert config["_project"] == "p52" and config["_name"] == "r1"
    assert config["rl"]["advantage"] == "grpo"  # make_hub's hparams: the default config


def test_the_run_file_is_read_once_wandb_has_written_it_out(offline, tmp_path):
    """Failing first (CI, stop 54): the reader saw a run file W&B's service had not yet flushed."""
    pytest.importorskip("wandb")
    hub = make_hub(tmp_path / "run", wandb=True)
    run_two_epochs(hub)
    hub.close()
    (path,) = (tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb")
    whole = finished_wandb_records(path)
    data = path.read_bytes()
    late = tmp_path / "late" / "wandb" / "offline-run-x" / "run-x.wandb"
    late.parent.mkdir(parents=True)
    late.write_bytes(data[:len(data) // 3])  # the header and a record cut in two

    def flush() -> None:
        time.sleep(0.5)
        with late.open("ab") as f:
            f.write(data[len(data) // 3:])

    writer = threading.Thread(target=flush)
    writer.start()
    rows, _ = wandb_history(tmp_path / "late")
    writer.join()
    assert sorted(rows) == [1, 2, 3, 4] and len(finished_wandb_records(late)) == len(whole)


def test_trackio_local_store_gets_the_same(offline, tmp_path):
    pytest.importorskip("trackio")
    hub = make_hub(tmp_path / "run", trackio=True, tracker_project="p52")
    run_two_epochs(hub)
    hub.close()
    db = sqlite3.connect(tmp_path / "trackio" / "p52.db")
    rows = [(step, json.loads(m)) for step, m in
            db.execute("select step, metrics from metrics order by id")]
    tb = scalars(read_events(tmp_path / "run" / "tensorboard"))
    step3 = [m for s, m in rows if s == 3]
    assert len(step3) == 1 and set(step3[0]) == {k for k, v in tb.items() if 3 in v}
    assert step3[0]["reward/mean"] == pytest.approx(0.3)
    table = next(m["samples"] for _, m in rows if "samples" in m)
    assert table["_type"] == "trackio.table" and len(table["_value"]) == 12
    assert table["_value"][0]["task_id"] == "t1"
    (config,) = [json.loads(c) for (c,) in db.execute("select config from configs")]
    assert config["rl"]["advantage"] == "grpo"
    assert [r for (r,) in db.execute("select distinct run_name from metrics")] == ["run"]


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_a_missing_package_is_one_line(name, monkeypatch, tmp_path):
    real = builtins.__import__

    def without(mod, *a, **k):
        if mod == name:
            raise ImportError(f"No module named {name!r}")
        return real(mod, *a, **k)

    monkeypatch.setattr(builtins, "__import__", without)
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(UsageError) as e:
        make_hub(tmp_path / "run", **{name: True})
    assert f"pip install 'mlx-rlaif[{name}]'" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.slow
def test_a_training_run_leaves_an_offline_wandb_run(tmp_path):
    pytest.importorskip("wandb")
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
               MLX_RLAIF_SMOKE="2")
    env.pop("WANDB_API_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "mlx_rlaif.cli", "train", "--output-dir", str(tmp_path / "run"),
         "--no-dashboard", "--set", "logging.wandb=true"],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows, config = wandb_history(tmp_path / "run")
    assert sorted(rows) == [1, 2]
    assert {"reward/mean", "loss/total", "kl/mean", "Train/AvgReward"} <= set(rows[2])
    assert config["_name"] == "run" and config["logging.wandb"] is True  # flattened
