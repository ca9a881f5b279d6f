"""The exec reward's workers beside decoding: the cores decoding leaves free (issue 49, point 4)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from mlx_rlaif.config import Config
from mlx_rlaif.train import trainer
from mlx_rlaif.train.distributed import World, scoring_workers


@pytest.mark.parametrize(("cores", "decode", "workers"),
                         [(2, 1, 1), (10, 1, 9), (1, 1, 1), (8, 4, 4), (4, 6, 1)])
def test_the_workers_are_the_cores_decoding_leaves_free(cores, decode, workers):
    assert scoring_workers(cores, decode) == workers


def _cfg(workers: int = 0, backend: str = "mlx", device: str = "") -> Config:
    cfg = Config()
    return replace(cfg, model=replace(cfg.model, backend=backend, device=device),
                   reward=replace(cfg.reward, exec=replace(cfg.reward.exec, workers=workers)))


def test_auto_workers_take_this_ranks_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 10)
    assert World().rank_config(_cfg(), decode_threads=1).reward.exec.workers == 9
    two_here = World(group=SimpleNamespace(rank=0, size=2), local=2)
    assert two_here.rank_config(_cfg(), decode_threads=1).reward.exec.workers == 4
    assert two_here.rank_config(_cfg(), decode_threads=5).reward.exec.workers == 1


def test_workers_the_user_set_are_kept(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 10)
    assert World().rank_config(_cfg(workers=3), decode_threads=1).reward.exec.workers == 3


def test_the_teacher_budget_is_still_split_between_the_ranks():
    cfg = _cfg(workers=2)
    cfg = replace(cfg, reward=replace(cfg.reward, teacher=replace(cfg.reward.teacher,
                                                                  max_cost_usd=3.0)))
    out = World(group=SimpleNamespace(rank=1, size=3)).rank_config(cfg)
    assert out.reward.teacher.max_cost_usd == 1.0 and out.reward.exec.workers == 2


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
