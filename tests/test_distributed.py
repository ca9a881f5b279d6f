"""Data-parallel training on one machine: two ranks over MLX's ring backend on 127.0.0.1
(`mlx.launch -n 2`, or MLX_RANK / MLX_HOSTFILE set by hand) and over torch.distributed's gloo
(`torchrun --nproc-per-node 2`).

- the two-rank update on a batch split unevenly (different token counts per rank, and a rank
  whose groups are all dropped) equals the one-process update on the whole batch, on both
  backends (tests/dp_update.py);
- a two-rank CLI run writes one run directory, whose checkpoint mlx-lm loads, which two ranks
  resume exactly and which one process resumes;
- a rank killed mid-run ends the other with a one-line error at once; a rank that hangs ends
  it after distributed.timeout_s (the watchdog);
- the pieces by hand: shares, the launcher's environment, how metrics combine.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import TEST_DTYPE
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load as load_config
from mlx_rlaif.train import train
from mlx_rlaif.train.distributed import World, launcher
from mlx_rlaif.train.distributed_metrics import check_digests, combine, pooled_std

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAUNCH = [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; "
          "sys.exit(main())"]  # the `mlx.launch` console script
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_ports(n: int) -> int:
    """The first of n consecutive free TCP ports on 127.0.0.1."""
    for _ in range(200):
        base = random.randint(20000, 60000)
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def hostfile(tmp_path: Path, n: int = 2) -> Path:
    base = free_ports(n)
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([[f"127.0.0.1:{base + i}"] for i in range(n)]))
    return path


def spawn_rank(rank: int, hosts: Path, cmd: list[str], cwd: Path) -> subprocess.Popen:
    """One rank started by hand, as mlx.launch starts it (MLX_RANK, MLX_HOSTFILE)."""
    return subprocess.Popen(cmd, env={**env(), "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hosts)},
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- the pieces by hand ----------------------------------------------------------------------------


class _Group:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


def test_shares_are_contiguous_uneven_and_cover_the_batch():
    shares = [World(_Group(r, 3)).share(list(range(7))) for r in range(3)]
    assert shares == [[0, 1], [2, 3], [4, 5, 6]]
    assert [World(_Group(r, 2)).share([9]) for r in range(2)] == [[], [9]]
    assert World().share([1, 2]) == [1, 2] and World().rank_seed(5) == 5
    assert len({World(_Group(r, 4)).rank_seed(5) for r in range(4)}) == 4


def test_the_start_line_names_the_ranks_the_transport_and_each_share():
    assert World(_Group(0, 2), "mlx", "ring").line(4, 8) == \
        "data parallel: 2 ranks (ring), 2 prompts x 8 each per step"
    assert World(_Group(1, 2), "mlx", "ring").line(3, 4) == \
        "data parallel: 2 ranks (ring), 1-2 prompts x 4 each per step"
    assert World(_Group(0, 4), "torch", "gloo").line(2, 8) == \
        "data parallel: 4 ranks (gloo), 0-1 prompts x 8 each per step"
    assert World().line(4, 8) is None


def test_the_dashboard_and_the_summary_show_the_ranks():
    import os

    from rich.console import Console

    from mlx_rlaif.metrics import summary
    from mlx_rlaif.metrics.dashboard import DashboardState, render
    from mlx_rlaif.metrics.stats import RunStats

    def shown(ranks: float) -> str:
        console = Console(record=True, width=140, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(render(DashboardState(4, step=1, metrics={"dist/world_size": ranks})))
        return console.export_text()

    assert "mlx-rlaif (data parallel: 2 ranks)" in shown(2.0)
    assert "data parallel" not in shown(1.0)
    stats = RunStats()
    stats.observe(1, {"dist/world_size": 2.0, "reward/mean": 0.5})
    assert stats.as_dict()["world_size"] == 2
    assert "Data parallel: 2 ranks" in stats.summary_text()
    assert "Data parallel" not in RunStats().summary_text()
    assert summary.ranks([{"dist/world_size": 2.0}, {}]) == 2 and summary.ranks([{}]) == 1


class _ClosingGroup:
    rank, size = 0, 2

    def __init__(self) -> None:
        self.closed: list[bool] = []

    def close(self, clean: bool) -> None:
        self.closed.append(clean)


def test_the_group_ends_after_the_others_only_when_the_command_ended_cleanly():
    # torch's group waits at a barrier before it ends on a clean close (a rank that ended first
    # aborted its peer once in CI); after an error the others may never come to that barrier
    ok, failed = _ClosingGroup(), _ClosingGroup()
    with World(group=ok).session():
        pass
    with pytest.raises(RuntimeError), World(group=failed).session():
        raise RuntimeError("a rank failed")
    assert ok.closed == [True] and failed.closed == [False]


def test_the_launchers_environment_names_the_engine(tmp_path):
    ring = tmp_path / "ring.json"
    ring.write_text('[["127.0.0.1:1"], ["127.0.0.1:2"]]')
    one = tmp_path / "one.json"
    one.write_text("\n")  # mlx.launch's hostfile for a single host
    assert launcher({}) is None
    assert launcher({"MLX_RANK": "1", "MLX_HOSTFILE": str(ring)}) == ("mlx", "ring")
    assert launcher({"MLX_RANK": "0", "MLX_HOSTFILE": str(one)}) is None
    assert launcher({"MLX_JACCL_COORDINATOR": "10.0.0.1:1"}) == ("mlx", "jaccl")
    assert launcher({"OMPI_COMM_WORLD_SIZE": "4"}) == ("mlx", "mpi")
    assert launcher({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}) == ("torch", "")
    assert launcher({"WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}) is None


def test_metrics_combine_as_over_the_whole_batch():
    a = [1.0, 0.0, 0.5, 0.5]  # rank 0's rewards
    b = [1.0, 1.0]  # rank 1's
    ma = {"reward/mean": np.mean(a), "reward/std": np.std(a), "reward/min": 0.0,
          "reward/max": 1.0, "reward/frac_none": 0.0, "gen/tokens": 40.0, "time/step": 2.0,
          "loss/total": 0.25, "gen/truncated_frac": 0.5, "gen/tokens_per_sec": 10.0}
    mb = {"reward/mean": 1.0, "reward/std": 0.0, "reward/min": 1.0, "reward/max": 1.0,
          "reward/frac_none": 1 / 3, "gen/tokens": 30.0, "time/step": 3.0, "loss/total": 0.25,
          "gen/truncated_frac": 0.0, "gen/tokens_per_sec": 5.0}
    out = combine([(ma, 4), (mb, 3)])  # rank 1 had 3 rollouts, one unscored
    assert out["reward/mean"] == pytest.approx(np.mean(a + b))
    assert out["reward/std"] == pytest.approx(np.std(a + b))
    assert (out["reward/min"], out["reward/max"]) == (0.0, 1.0)
    assert out["reward/frac_none"] == pytest.approx(1 / 7)
    assert out["gen/truncated_frac"] == pytest.approx(2 / 7)
    assert (out["gen/tokens"], out["gen/tokens_per_sec"], out["time/step"]) == (70.0, 15.0, 3.0)
    assert out["loss/total"] == 0.25  # the update already summed it over the ranks
    assert pooled_std([(2.0, 1.0, 2), (4.0, 0.0, 2)]) == pytest.approx(np.std([1, 3, 4, 4]))
    assert math.isnan(combine([({"reward/mean": float("nan")}, 0)])["reward/mean"])


def test_ranks_whose_weights_differ_stop_the_run():
    check_digests([[1.0, 2.0], [1.0 + 1e-9, 2.0], None])
    with pytest.raises(Exception, match="weights differ"):
        check_digests([[1.0, 2.0], [1.01, 2.0]])


# --- the update: two ranks equal one process -------------------------------------------------------


# Two ranks sum in another order and pad micro-batches to other widths: float rounding, larger
# in bfloat16 and float16 (MLX_RLAIF_TEST_DTYPE, tests/test_metal_path.py): there one step is
# taken (tests/dp_update.py) and the updates compared as wholes (measured 0.3% apart in
# bfloat16; a rank's lost or doubled gradient would be tens of percent).
RTOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 1e-2}[TEST_DTYPE]


def _compare(solo: dict, two: dict) -> None:
    np.testing.assert_allclose(two["adv"], solo["adv"], rtol=0, atol=1e-12)
    for key in ("loss/total", "loss/policy", "loss/kl", "policy/entropy", "policy/clipfrac",
                "kl/mean", "optim/grad_norm", "kl/sample_train"):
        assert two["metrics"][key] == pytest.approx(
            solo["metrics"][key], rel=RTOL, abs=1e-9 if TEST_DTYPE == "float32" else RTOL / 5), key
    assert two["skipped"] == solo["skipped"] == 0
    start = {k: np.array(v) for k, v in solo["start"].items()}
    ours = {k: np.array(v) - start[k] for k, v in two["weights"].items()}
    ref = {k: np.array(v) - start[k] for k, v in solo["weights"].items()}
    assert max(float(np.abs(d).max()) for d in ref.values()) > 1e-3  # the update moved them
    if TEST_DTYPE == "float32":
        for k, v in solo["weights"].items():
            np.testing.assert_allclose(two["weights"][k], v, rtol=1e-5, atol=1e-7, err_msg=k)
        return
    off = math.sqrt(sum(float(((ours[k] - ref[k]) ** 2).sum()) for k in ref))
    assert off <= RTOL * math.sqrt(sum(float((d ** 2).sum()) for d in ref.values()))


def _solo(backend: str, model: Path, agg: str) -> dict:
    sys.path.insert(0, str(HERE))
    import dp_update

    return dp_update.scenario(World(), backend, str(model), [4], agg)


@pytest.mark.slow
def test_two_ranks_on_an_uneven_split_update_as_one_process_on_the_whole_batch(micro_model,
                                                                                tmp_path):
    out = tmp_path / "two.json"
    cmd = [*LAUNCH, "-n", "2", "-p", str(free_ports(2)), "--", sys.executable,
           str(HERE / "dp_update.py"), "mlx", str(micro_model), str(out),
           "1,3:token", "1,3:sequence", "3,1:token"]
    proc = subprocess.run(cmd, env=env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two = json.loads(out.read_text())
    assert two["size"] == 2
    r = two["results"]
    assert r["1,3:token"]["kept"] == [3, 6] and r["3,1:token"]["kept"] == [9, 0]
    for agg in ("token", "sequence"):  # rank 0: 1 group (3 + 9 + 5 tokens), rank 1: 2 kept
        _compare(_solo("mlx", micro_model, agg), r[f"1,3:{agg}"])
    _compare(_solo("mlx", micro_model, "token"), r["3,1:token"])  # rank 1 keeps nothing


@pytest.mark.slow
def test_two_torch_ranks_over_gloo_update_as_one_process(micro_model, tmp_path):
    pytest.importorskip("peft")
    out = tmp_path / "two.json"
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_ports(1)),
           str(HERE / "dp_update.py"), "torch", str(micro_model), str(out), "1,3:token",
           "3,1:token"]
    proc = subprocess.run(cmd, env=env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())["results"]
    solo = _solo("torch", micro_model, "token")
    _compare(solo, r["1,3:token"])
    _compare(solo, r["3,1:token"])


# --- the CLI ---------------------------------------------------------------------------------------


def _train_cmd(model: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mlx_rlaif.cli", "train", "--model", str(model),
            "--train-file", str(tasks), "--output-dir", str(out), "--set", "reward.type=syntax",
            "--set", "generation.max_new_tokens=8", "--set", "generation.num_samples_per_prompt=3",
            "--set", "training.batch_size=3", "--set", "rl.drop_zero_std=false",
            "--set", "rl.entropy_coef=0.05", "--set", "training.learning_rate=0.01",
            "--set", "logging.tensorboard=false", "--set", "training.num_epochs=2",
            "--eval-file", str(tasks), "--set", "data.eval_samples=2", *extra]


def _launch2(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([*LAUNCH, "-n", "2", "-p", str(free_ports(2)), "--", *cmd], env=env(),
                          cwd=cwd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _adapters(ckpt: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(ckpt / checkpoint.ADAPTERS)).items()}


QUICK = ["--set", "training.batch_size=3", "--set", "generation.num_samples_per_prompt=4",
         "--set", "generation.max_new_tokens=48", "--set", "data.eval_samples=1",
         "--set", "rl.dynamic_sampling=true", "--set", "data.curriculum=true",
         "--set", "rl.guidance=true", "--set", "data.eval_every=2", "--set", "data.eval_max_tasks=4",
         "--set", "training.save_every_batches=1", "--set", "training.save_total_limit=0",
         "--set", "logging.tensorboard=false"]  # on the quickstart: tiny-coder, exec reward


@pytest.mark.slow
def test_two_ranks_write_one_run_that_mlx_lm_loads_and_two_ranks_resume_exactly(tmp_path):
    """The quickstart's model and reward with dynamic sampling (groups exchanged between the
    ranks, carried in the checkpoint), a curriculum, off-policy guidance (each rank guides its
    own groups; the count summed) and the periodic evaluation."""
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "mlx_rlaif.cli", "train", "--output-dir"]
    proc = _launch2([*cli, str(run), "--max-steps", "3", *QUICK], tmp_path)
    assert proc.stdout.count("step 1/3 |") == 1, proc.stdout  # rank 1 prints nothing
    assert proc.stdout.count("data parallel: 2 ranks (ring), 1-2 prompts x 4 each per step"
                             ) == 1, proc.stdout
    assert "Data parallel: 2 ranks" in proc.stdout  # the end-of-run summary
    assert "Traceback" not in proc.stderr, proc.stderr
    steps = [json.loads(x) for x in (run / "batches.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["dist/world_size"] == 2 for s in steps)
    kept = [s["sample/groups_kept"] for s in steps]  # the same number on every rank
    assert sum(kept) > 0 and all(s["train/sequences"] == 4 * s["sample/groups_kept"]
                                 for s in steps)
    assert all("sample/guided" in s for s in steps)  # every rank took part in the sum
    train_records = (run / "datasets" / "train.jsonl").read_text().splitlines()
    assert len(train_records) == 4 * sum(kept)  # both ranks' completions, written by rank 0
    evals = json.loads((run / "eval.json").read_text())  # sharded: 20 tasks on each rank
    assert evals["before"]["tasks"] == evals["after"]["tasks"] == 40
    assert [json.loads(x)["eval/tasks"] for x in (run / "eval.jsonl").read_text().splitlines()
            ] == [4]
    ckpts = checkpoint.list_checkpoints(run)
    assert [checkpoint.checkpoint_step(c) for c in ckpts] == [1, 2, 3]
    assert json.loads((ckpts[-1] / "training_stats.json").read_text())["world_size"] == 2

    from mlx_lm import generate
    from mlx_lm.utils import load

    from mlx_rlaif.assets import model_source

    model, tok = load(model_source("builtin:tiny-coder"), adapter_path=str(ckpts[-1]))
    assert isinstance(generate(model, tok, "def add(a, b):", max_tokens=2), str)

    again = tmp_path / "again"  # the run as it was after step 2, resumed by two ranks
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / ckpts[-1].name)
    _launch2([*cli, str(again), "--resume", str(again), "--max-steps", "3"], tmp_path)
    resumed = checkpoint.latest_checkpoint(again)
    assert checkpoint.checkpoint_step(resumed) == 3
    a, b = _adapters(ckpts[-1]), _adapters(resumed)
    assert any(np.abs(a[k] - _adapters(ckpts[0])[k]).max() > 1e-6 for k in a)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-7)

    solo = tmp_path / "solo"  # the same checkpoint (its carried groups too), one process
    shutil.copytree(run, solo)
    shutil.rmtree(solo / "checkpoints" / ckpts[-1].name)
    cfg = load_config(solo / "config.yaml", [f"training.output_dir={solo}", "data.eval_file=",
                                             "data.eval_every=0"])
    train(cfg, resume_from=checkpoint.latest_checkpoint(solo), hub=RecordingHub())
    assert checkpoint.checkpoint_step(checkpoint.latest_checkpoint(solo)) == 3


# --- a lost rank -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_rank_ends_the_other_with_a_clear_error(micro_model, prompts_file, tmp_path):
    run = tmp_path / "run"
    hosts = hostfile(tmp_path)
    cmd = _train_cmd(micro_model, prompts_file, run, "--max-steps", "1000",
                     "--set", "training.num_epochs=500", "--set", "training.save_every_epochs=0",
                     "--set", "data.eval_file=")
    ranks = [spawn_rank(r, hosts, cmd, tmp_path) for r in range(2)]
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (run / "batches.jsonl").exists():
            time.sleep(0.2)
        assert (run / "batches.jsonl").exists(), ranks[0].communicate(timeout=5)
        ranks[1].send_signal(signal.SIGKILL)
        t0 = time.time()
        _, err = ranks[0].communicate(timeout=60)
        assert time.time() - t0 < 30
        assert ranks[0].returncode == 1, err
        line = [x for x in err.splitlines() if x.startswith("mlx-rlaif train: error:")]
        assert line and "rank 0 of 2" in line[0] and "another rank stopped" in line[0], err
    finally:
        for p in ranks:
            p.kill()
            p.communicate()


@pytest.mark.slow
def test_a_hung_rank_ends_the_other_after_the_timeout(tmp_path):
    hosts = hostfile(tmp_path)
    ranks = [spawn_rank(r, hosts, [sys.executable, str(HERE / "dp_hang.py"), "3"], tmp_path)
             for r in range(2)]
    try:
        t0 = time.time()
        out, err = ranks[0].communicate(timeout=60)
        waited = time.time() - t0
        assert ranks[0].returncode == 1, out + err
        assert "rank 0 waits" in out and "did not fire" not in out
        assert "rank 0 of 2: the exchange of records has waited" in err, err
        assert "distributed.timeout_s = 3" in err and waited < 30
    finally:
        for p in ranks:
            p.kill()
            p.communicate()
