"""The exec reward's pool beside decoding (issue 49, point 4): while a group is scored as the
next one decodes, only the cores decoding leaves free; after, every core (rewards/exec/cores.py)."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

from mlx_rlaif.config import Config
from mlx_rlaif.rewards.exec.cores import Cores, free_cores
from mlx_rlaif.train import trainer
from mlx_rlaif.train.distributed import World


@pytest.mark.parametrize(("cores", "decode", "free"),
                         [(2, 1, 1), (10, 1, 9), (1, 1, 1), (8, 4, 4), (4, 6, 1)])
def test_decoding_leaves_the_other_cores(cores, decode, free):
    assert free_cores(cores, decode) == free


def test_the_limit_follows_decoding():
    c = Cores(10, decode=1)
    assert c.limit == 10
    with c.decoding():
        assert c.limit == 9
        with c.decoding():  # nested (chunks of a step): still decoding until the outer one ends
            pass
        assert c.limit == 9
    assert c.limit == 10


def test_a_completion_waits_for_a_free_core_while_decoding_and_goes_when_it_ends():
    c = Cores(2, decode=1)
    got, done = threading.Event(), threading.Event()

    def second() -> None:
        with c.slot():
            got.set()
            done.wait(10)

    with c.decoding():
        with c.slot():  # the one core decoding leaves
            t = threading.Thread(target=second)
            t.start()
            assert not got.wait(0.3)  # a second completion waits while decoding runs
        assert got.wait(10)  # the first one ended: the free core is its
        assert c.limit == 1
    with c.slot():  # decoding over: both cores, while the second still holds one
        assert c.limit == 2
    done.set()
    t.join(10)


def _cfg(workers: int = 0, backend: str = "mlx", device: str = "") -> Config:
    cfg = Config()
    return replace(cfg, model=replace(cfg.model, backend=backend, device=device),
                   reward=replace(cfg.reward, exec=replace(cfg.reward.exec, workers=workers)))


def test_train_gives_the_exec_reward_this_ranks_cores_unless_workers_are_set(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 10)
    monkeypatch.setattr("mlx_rlaif.cpu.on_cpu", lambda: False)  # a GPU decodes: 1 core busy
    cores = trainer.scoring_cores(_cfg(), World())
    assert (cores.total, cores.decode) == (10, 1)
    two_here = World(group=SimpleNamespace(rank=0, size=2), local=2)
    assert trainer.scoring_cores(_cfg(), two_here).total == 5
    assert trainer.scoring_cores(_cfg(workers=3), World()) is None


def test_an_exec_reward_with_workers_set_keeps_them(monkeypatch):
    from mlx_rlaif.rewards.exec import ExecReward

    cfg = _cfg(workers=3).reward.exec
    r = ExecReward(replace(cfg, sandbox="process", uid_base=64770), {"python"},
                   cores=Cores(8, 1))
    try:
        assert r.workers == 3 and r.cores.total == 3
    finally:
        r.close()
    r = ExecReward(replace(_cfg().reward.exec, sandbox="process", uid_base=64770), {"python"},
                   cores=Cores(8, 1))
    try:
        assert r.workers == 8 and r.cores.decode == 1
    finally:
        r.close()


def test_decoding_keeps_one_core_busy_on_a_gpu_and_its_blas_threads_on_the_cpu(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setattr("mlx_rlaif.cpu.on_cpu", lambda: False)  # Metal (or MLX's CUDA build)
    assert trainer.decode_threads(_cfg(), 10) == 1
    monkeypatch.setattr("mlx_rlaif.cpu.on_cpu", lambda: True)
    assert trainer.decode_threads(_cfg(), 10) == 5  # cpu/blas.default_threads: half
    assert trainer.decode_threads(_cfg(), 1) == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert trainer.decode_threads(_cfg(), 10) == 3
    assert trainer.decode_threads(_cfg(backend="torch", device="cuda"), 10) == 1
    assert trainer.decode_threads(_cfg(backend="torch", device="cpu"), 10) == 5
