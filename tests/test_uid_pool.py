"""Sandbox uids as root are the machine's, not the process's (issue 56): two trainers started with
the same `reward.exec.uid_base` get disjoint uids, so neither kills the other's runs (runs are
killed by uid) and a seeded run's verdicts do not follow another run's timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_rlaif.errors import ConfigError
from mlx_rlaif.sandbox.modes import UidPool

CHILD = """
import sys, time
from pathlib import Path
from mlx_rlaif.sandbox.modes import UidPool
pool = UidPool(int(sys.argv[1]), 2, Path(sys.argv[2]))
print(*pool.uids, flush=True)
sys.stdin.read()  # hold them until told
"""


def test_two_pools_with_one_base_get_disjoint_uids(tmp_path: Path) -> None:
    a = UidPool(64900, 3, tmp_path)
    b = UidPool(64900, 3, tmp_path)
    assert a.uids == (64900, 64901, 64902) and b.uids == (64903, 64904, 64905)
    a.close()
    c = UidPool(64900, 2, tmp_path)  # given back: taken again
    assert c.uids == (64900, 64901)


def test_another_process_holding_the_uids_is_skipped_until_it_ends(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "64910", str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = tuple(map(int, child.stdout.readline().split()))
        assert held == (64910, 64911)
        assert not set(UidPool(64910, 2, tmp_path).uids) & set(held)
    finally:
        child.kill()  # kill -9: the kernel drops its locks
        child.wait()
    assert UidPool(64910, 2, tmp_path).uids == held


def test_a_sandbox_takes_its_uids_from_the_machine_wide_pool() -> None:
    if os.geteuid() != 0:
        pytest.skip("uids per slot are used as root only")
    from mlx_rlaif.sandbox.box import Sandbox

    first = Sandbox("process", slots=2, uid_base=64920)
    second = Sandbox("process", slots=2, uid_base=64920)
    assert not set(first._uids.uids) & set(second._uids.uids)


def test_no_free_uids_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx_rlaif.sandbox.modes as modes

    monkeypatch.setattr(modes, "UID_SPAN", 3)
    held = UidPool(64930, 2, tmp_path)
    with pytest.raises(ConfigError, match="no 2 free sandbox uids from 64930 to 64932"):
        UidPool(64930, 2, tmp_path)
    assert held.uids == (64930, 64931)
