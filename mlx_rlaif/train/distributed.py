"""Data-parallel training over several processes (ranks), launched by `mlx.launch` (MLX's
distributed engine: ring over Ethernet or Thunderbolt, MPI, JACCL) or, for the torch backend,
by `torchrun` (torch.distributed: gloo, NCCL). No transport of our own: every byte goes through
the engine's collectives (backends/mlx/parallel.py, backends/torch/parallel.py).

`World` is the group as the loop sees it; with one process (`World()`) every method is the
identity and no collective runs. What each rank does (docs/distributed.md):

- it runs rank 0's config (`first`) with the same seed for the LoRA init and the task order;
- it takes its `share` of each step's prompts (contiguous, so every group of G completions is
  on one rank and group baselines need no communication), samples them with its own seed
  (`rank_seed`), and scores them with its own sandbox workers and teacher client (a teacher
  budget is split evenly: `rank_config`);
- batch-level statistics and the loss divisor's counts are summed (`sum`), the gradients once
  per optimizer step (`shard`: backends/parallel.py), metrics and records gathered
  (distributed_metrics.py); rank 0 alone writes the run directory, checkpoints, TensorBoard and
  the dashboard, and other ranks print nothing but errors (`session`);
- an error on any rank in a phase every rank passes (`agreed`) stops all of them there.

Every collective runs under a `Watchdog`: one that has not returned after
`distributed.timeout_s` (a rank hung, or a machine gone without closing its connections) ends
the process with a one-line error. A rank that dies closes its connections, so the others'
next collective fails at once; that becomes a one-line `DistributedError` (`guard`).

Not covered: elastic membership (a lost rank ends the run; resume from the last checkpoint),
ranks with different hardware speeds (each waits for the slowest at every reduction).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .. import cpu, errors
from ..backends.ops import connect_group
from ..backends.parallel import Shard
from ..config import Config
from ..cpu.blas import default_threads, openblas_thread_fns
from ..errors import ConfigError, DistributedError, RlaifError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 1800.0  # until the config is known (distributed.timeout_s)
_SEED_STRIDE = 0x9E3779B1  # rank r samples with seed + r * this (mod 2**31)


class Watchdog:
    """Ends the process with a one-line error (exit code 1) when a collective has been waiting
    for more than `timeout_s`: a blocked collective never raises by itself. A daemon thread
    checks about ten times per timeout (at least once a second)."""

    def __init__(self, timeout_s: float, label: str = "") -> None:
        self.timeout_s, self.label = timeout_s, label
        self._since: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="mlx-rlaif-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 10))
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self._expire(time.monotonic() - since)

    def _expire(self, waited: float) -> None:
        sys.stderr.write(
            f"mlx-rlaif: error: {self.label}: the {self._what} has waited {waited:.0f} s for "
            f"the other ranks (distributed.timeout_s = {self.timeout_s:g}): a rank hung, stopped "
            "or lost the network; ending this rank (resume from the last checkpoint)\n")
        sys.stderr.flush()
        os._exit(1)


@dataclass
class World:
    """The ranks of a run (one process: `World()`); see the module docstring."""

    group: Any = None  # a backend's group (backends/*/parallel.py); None: one process
    engine: str = ""  # "mlx" or "torch": which engine launched the ranks
    backend: str = ""  # its transport: ring, mpi, jaccl, nccl (mlx); gloo, nccl (torch)
    watchdog: Watchdog | None = None
    local: int = 1  # ranks on this machine (they share its cores: `share_cores`)
    _temp: list[Path] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.group.rank if self.group is not None else 0

    @property
    def size(self) -> int:
        return self.group.size if self.group is not None else 1

    @property
    def label(self) -> str:
        return f"rank {self.rank} of {self.size}"

    def line(self, prompts: int, group_size: int) -> str | None:
        """The start line of a run on several ranks (None on one process): `data parallel: 2
        ranks (ring), 2 prompts x 8 each per step` (`prompts` a step in all, `group_size`
        completions each)."""
        if self.size == 1:
            return None
        lo, hi = prompts // self.size, -(-prompts // self.size)
        each = f"{lo}" if lo == hi else f"{lo}-{hi}"
        return (f"data parallel: {self.size} ranks ({self.backend or self.engine}), {each} "
                f"prompt{'' if each == '1' else 's'} x {group_size} each per step")

    # --- what differs per rank ------------------------------------------------------------------

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous part of `items` (sizes differ by at most one; may be empty)."""
        n, r, k = len(items), self.rank, self.size
        return list(items[r * n // k: (r + 1) * n // k])

    def rank_seed(self, seed: int) -> int:
        """The sampling seed of this rank: rank 0 keeps `seed`."""
        return (seed + self.rank * _SEED_STRIDE) % 2**31

    def rank_config(self, cfg: Config) -> Config:
        """The config this rank's reward is built with: a teacher budget split evenly between
        the ranks (the run stops for all when one rank's share is spent: `agreed` stops)."""
        t = cfg.reward.teacher
        if self.size == 1 or not t.max_cost_usd:
            return cfg
        teacher = replace(t, max_cost_usd=t.max_cost_usd / self.size)
        return replace(cfg, reward=replace(cfg.reward, teacher=teacher))

    @property
    def cores(self) -> int:
        """This rank's share of the machine's cores (`local` ranks share it)."""
        return max(1, (os.cpu_count() or 1) // self.local)

    # --- collectives ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """A collective under the watchdog; a failure (a rank gone) as a one-line error."""
        dog = self.watchdog.waiting(what) if self.watchdog else contextlib.nullcontext()
        with dog:
            try:
                yield
            except RuntimeError as e:
                raise DistributedError(
                    f"{self.label}: the {what} failed ({e}): another rank stopped or the network "
                    "failed; that rank's own error, if any, says why") from None

    def gather(self, obj: Any, what: str = "exchange of records") -> list[Any]:
        """Every rank's `obj` (JSON data), in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(json.dumps(obj, default=_plain).encode(), dtype=np.uint8)
        with self.guard(what):
            sizes = self.group.all_gather(_as_bytes(np.array([len(data)], dtype=np.int64)))
            sizes = sizes.copy().view(np.int64)[:, 0]
            padded = np.zeros(int(sizes.max()), dtype=np.uint8)
            padded[: len(data)] = data
            rows = self.group.all_gather(padded)
        return [json.loads(rows[i, : sizes[i]].tobytes()) for i in range(self.size)]

    def gather_flat(self, items: list[Any], what: str = "exchange of records") -> list[Any]:
        """Every rank's list, concatenated in rank order."""
        return [x for part in self.gather(items, what) for x in part]

    def sum(self, values: Any, what: str = "sum of batch statistics") -> np.ndarray:
        """float64 `values` (the same length on every rank) summed over the ranks, in rank
        order, so every rank gets the same bits."""
        x = np.ascontiguousarray(values, dtype=np.float64)
        if self.size == 1:
            return x
        with self.guard(what):
            rows = self.group.all_gather(_as_bytes(x.reshape(-1)))
        return rows.copy().view(np.float64).sum(axis=0).reshape(x.shape)

    def sum_dict(self, values: Mapping[str, float], what: str = "sum of loss terms"
                 ) -> dict[str, float]:
        """Named numbers summed over the ranks (a key missing on a rank counts 0)."""
        if self.size == 1:
            return dict(values)
        parts = self.gather({k: float(v) for k, v in values.items()}, what)
        keys = sorted({k for p in parts for k in p})
        return {k: float(sum(p.get(k, 0.0) for p in parts)) for k in keys}

    @property
    def reduce(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """`sum` for the batch statistics of algo/ (None with one process)."""
        return self.sum if self.size > 1 else None

    def shard(self, lengths: Sequence[int]) -> Shard | None:
        """The update's view of the step from this rank's kept completion lengths (None with
        one process): the global counts, the sum of the loss's aux terms, and the gradient
        all-reduce under the watchdog."""
        if self.size == 1:
            return None
        sequences, tokens = self.sum([len(lengths), sum(lengths)], "count of trained tokens")

        def reduce_grads(grads: Any) -> Any:
            with self.guard("all-reduce of the gradients"):
                return self.group.reduce_grads(grads)

        return Shard(int(sequences), int(tokens), self.sum_dict, reduce_grads)

    def digest(self, policy: Any) -> list[float] | None:
        """A fingerprint of the trainable weights (None with one process: nothing to check)."""
        if self.size == 1:
            return None
        with self.guard("fingerprint of the weights"):
            return self.group.digest(policy)

    def first(self, fn: Callable[[], T], what: str = "exchange of rank 0's setup") -> T:
        """`fn()` run on rank 0 only; its JSON result on every rank. An RlaifError raised there
        is raised on every rank."""
        if self.size == 1:
            return fn()
        out = None
        if self.rank == 0:
            try:
                out = {"value": fn()}
            except RlaifError as e:
                out = {"error": type(e).__name__, "message": str(e)}
        out = self.gather(out, what)[0]
        if "error" in out:
            raise _error(out["error"], out["message"])
        return out["value"]

    def agreed(self, fn: Callable[[], T], what: str) -> T:
        """`fn()` on every rank; if it raised an RlaifError on any rank, the first such error
        is raised on every rank (named by its rank on the others), so that all of them stop at
        the same point."""
        if self.size == 1:
            return fn()
        try:
            value, failure = fn(), None
        except RlaifError as e:
            value, failure = None, {"error": type(e).__name__, "message": str(e)}
        failures = self.gather(failure, what)
        for r, f in enumerate(failures):
            if f is not None:
                msg = f["message"] if r == self.rank else f"rank {r}: {f['message']}"
                raise _error(f["error"], msg)
        return value  # type: ignore[return-value]

    def copy_dir(self, path: Path | None) -> Path | None:
        """Rank 0's directory `path` (a checkpoint: plain files) on every rank: the others get
        a copy in a temporary directory (removed by `close`), sent through the collectives, so
        a resume needs the checkpoint on rank 0's machine only."""
        if self.size == 1 or path is None:
            return path
        listing = self.first(lambda: sorted((p.name, p.stat().st_size) for p in Path(path).iterdir()
                                            if p.is_file()), "listing of the checkpoint")
        target = Path(path)
        if self.rank:
            self._temp.append(Path(tempfile.mkdtemp(prefix="mlx-rlaif-ckpt-")))
            target = self._temp[-1] / Path(path).name
            target.mkdir()
        for name, size in listing:
            data = (np.fromfile(Path(path) / name, dtype=np.uint8) if self.rank == 0
                    else np.zeros(size, dtype=np.uint8))
            with self.guard(f"copy of {name} from rank 0"):
                data = self.group.broadcast(data)
            if self.rank:
                data.tofile(target / name)
        return target

    # --- the process ------------------------------------------------------------------------------

    def set_timeout(self, timeout_s: float) -> None:
        if self.watchdog is not None:
            self.watchdog.timeout_s = timeout_s

    def check_engine(self, backend: str) -> None:
        """The launcher must match model.backend (mlx.launch for mlx, torchrun for torch)."""
        if self.size > 1 and backend != self.engine:
            launcher = {"mlx": "mlx.launch", "torch": "torchrun"}
            raise ConfigError(f"model.backend is {backend} but the ranks were started by "
                              f"{launcher[self.engine]}: launch the {backend} backend with "
                              f"{launcher[backend]}")

    @contextlib.contextmanager
    def session(self) -> Iterator[World]:
        """The command's lifetime: ranks other than 0 print nothing but errors (stdout to
        /dev/null, our logger at WARNING); temporary copies removed at the end."""
        quiet = open(os.devnull, "w") if self.rank else None  # noqa: SIM115
        log = logging.getLogger("mlx_rlaif")
        level = log.level
        clean = False
        try:
            with contextlib.redirect_stdout(quiet) if quiet else contextlib.nullcontext():
                if quiet:
                    log.setLevel(logging.WARNING)
                yield self
            clean = True
        finally:
            log.setLevel(level)
            if quiet:
                quiet.close()
            self.close(clean)

    def close(self, clean: bool = True) -> None:
        """Remove the temporary copies; end the group (torch.distributed's process group),
        after every rank has reached here when `clean` (not after an error: the others may
        never come)."""
        getattr(self.group, "close", lambda clean: None)(clean)
        for p in self._temp:
            shutil.rmtree(p, ignore_errors=True)
        self._temp.clear()


def launcher(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(engine, backend) of the launcher that started this process with more than one rank,
    from the environment it sets, or None: torchrun (WORLD_SIZE, MASTER_ADDR), mlx.launch's
    ring (MLX_HOSTFILE, MLX_RANK; a one-host hostfile is empty), JACCL
    (MLX_JACCL_COORDINATOR), NCCL (MLX_WORLD_SIZE) or mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE)."""
    if "MASTER_ADDR" in env and "WORLD_SIZE" in env:
        return ("torch", "") if int(env["WORLD_SIZE"]) > 1 else None
    if env.get("MLX_JACCL_COORDINATOR"):
        return "mlx", "jaccl"
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile and "MLX_RANK" in env:
        path = Path(hostfile)
        return ("mlx", "ring") if path.is_file() and path.read_text().strip() else None
    if int(env.get("MLX_WORLD_SIZE", "1")) > 1:
        return "mlx", "nccl"
    if int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", "1"))) > 1:
        return "mlx", "mpi"
    return None


def connect(env: Mapping[str, str] | None = None) -> World:
    """The world this process was launched into (`World()` when not launched as several
    ranks). Connecting waits for every rank, under the watchdog."""
    found = launcher(os.environ if env is None else env)
    if found is None:
        return World()
    engine, backend = found
    dog = Watchdog(DEFAULT_TIMEOUT_S, f"{engine} {backend or 'torch.distributed'} rank")
    with dog.waiting("connection to the other ranks"):
        try:
            group = connect_group(engine, backend, DEFAULT_TIMEOUT_S)
        except RuntimeError as e:
            raise DistributedError(f"could not connect to the other ranks ({e}): check the "
                                   "hostfile and that every host runs the command") from None
    world = World(group, engine, transport(engine, backend), dog)
    dog.label = world.label
    if world.size == 1:
        return World()
    world.local = share_cores(world)
    return world


def transport(engine: str, backend: str) -> str:
    """The collectives' transport: the launcher's (mlx.launch's environment names it), or for
    torchrun the process group's (gloo or nccl)."""
    if backend or engine != "torch":
        return backend
    import torch.distributed as dist

    return str(dist.get_backend())


def share_cores(world: World) -> int:
    """Ranks on the same machine split its cores between their BLAS threads (MLX's Linux CPU
    build with OpenBLAS, whose idle threads spin: two ranks on 2 cores each using both made the
    update 15x slower here); returns the number of ranks on this machine."""
    hosts = world.gather(socket.gethostname(), "exchange of host names")
    local = hosts.count(hosts[world.rank])
    if local > 1:
        cores = max(1, (os.cpu_count() or 1) // local)
        os.environ.setdefault("MLX_RLAIF_TRAIN_THREADS", str(cores))
        fns = openblas_thread_fns()
        if fns is not None and cpu.active():
            fns[1](default_threads(cores))
    return local


def _as_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


def _plain(obj: Any) -> Any:
    """JSON for numpy scalars and arrays (records may hold them)."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def _error(name: str, message: str) -> RlaifError:
    cls = getattr(errors, name, None)
    return (cls if isinstance(cls, type) and issubclass(cls, RlaifError) else RlaifError)(message)
