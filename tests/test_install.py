"""The install routes: pyproject's dependencies resolved through MLX's own extras (the metadata of
the installed `mlx`) for each platform and extra, so the CUDA routes never bring MLX's CPU build
(both install mlx/lib/libmlx.so); the check that names a mixed or missing build; the device as
doctor and the memory budget see it, with a CUDA device monkeypatched in."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from mlx_rlaif import install
from mlx_rlaif.backends.mlx import device, memory

ROOT = Path(__file__).resolve().parent.parent
LINUX = {"sys_platform": "linux", "platform_system": "Linux"}
DARWIN = {"sys_platform": "darwin", "platform_system": "Darwin"}
MLX_BUILDS = {"mlx-cpu", "mlx-cuda-12", "mlx-cuda-13", "mlx-metal"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def applies(req: Requirement, env: dict, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**env, "extra": extra})


def resolve_mlx(extras: set[str], env: dict) -> set[str]:
    """The distributions `mlx[extras]` brings on `env`, from the installed mlx's metadata."""
    out = set()
    for line in metadata.requires("mlx") or []:
        req = Requirement(line)
        if any(applies(req, env, e) for e in extras | {""}):
            out.add(req.name)
    return out


def route(extras: set[str], env: dict) -> set[str]:
    """The names `pip install 'mlx-rlaif[extras]'` asks for on `env`: our requirements, and
    MLX's backend builds through mlx's own extras."""
    p = project()
    reqs = [Requirement(r) for r in p["dependencies"]]
    for e in extras:
        reqs += [Requirement(r) for r in p["optional-dependencies"][e]]
    names = set()
    for req in reqs:
        if not applies(req, env):
            continue
        names.add(req.name)
        if req.name == "mlx":
            names |= resolve_mlx(set(req.extras), env)
    return names


@pytest.mark.parametrize("extra, build", [("cuda13", "mlx-cuda-13"), ("cuda12", "mlx-cuda-12"),
                                          ("cpu", "mlx-cpu")])
def test_each_linux_route_brings_exactly_one_build(extra: str, build: str) -> None:
    for extras in ({extra}, {extra, "dev"}, {extra, "torch"}):
        assert route(extras, LINUX) & MLX_BUILDS == {build}, extras


def test_the_cuda_routes_never_resolve_the_cpu_build() -> None:
    for extra in ("cuda12", "cuda13"):
        assert "mlx-cpu" not in route({extra, "dev", "torch", "cuda"}, LINUX)


def test_macos_takes_metal_whatever_the_extra() -> None:
    assert route(set(), DARWIN) & MLX_BUILDS == {"mlx-metal"}
    assert route({"cpu", "dev"}, DARWIN) & MLX_BUILDS == {"mlx-metal"}


def test_no_extra_but_a_backend_one_brings_a_build() -> None:
    backends = {"cpu", "cuda12", "cuda13"}
    for extra in set(project()["optional-dependencies"]) - backends:
        assert route({extra}, LINUX) & MLX_BUILDS == set(), extra


def test_mixed_and_missing_builds_are_named_with_the_fix() -> None:
    both = {"mlx-cpu": "0.32.4", "mlx-cuda-13": "0.32.4"}
    line = install.backend_problem(both, "linux")
    assert "mlx-cpu 0.32.4 and mlx-cuda-13 0.32.4" in line and "pip uninstall -y" in line
    assert install.mixed_builds(both) == line
    assert "pip install 'mlx-rlaif[cpu]'" in install.backend_problem({}, "linux")
    assert install.backend_problem({"mlx-cuda-13": "0.32.4"}, "linux") is None
    assert install.backend_problem({"mlx-metal": "0.32.4"}, "darwin") is None
    assert install.mixed_builds({"mlx-cpu": "0.32.4"}) is None


def test_this_environment_holds_one_build() -> None:
    assert install.backend_problem(install.installed_backends()) is None


H200 = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 150_000_000_000,
        "free_memory": 140_000_000_000, "compute_capability_major": 9,
        "compute_capability_minor": 0}


def test_a_cuda_device_is_named_with_its_memory() -> None:
    d = device.current(H200, "cuda", own=2_000_000_000)
    assert d.kind == "cuda" and d.capability == "9.0"
    assert d.free == 142_000_000_000  # what this process's MLX holds counts as free to it
    line = device.describe(d)
    assert line.startswith("CUDA: NVIDIA H200 (compute capability 9.0), 139.7 GB")
    assert "132.2 GB free" in line
    assert device.describe(device.current({"device_name": "AMD EPYC"}, "cpu")) == "CPU: AMD EPYC"
    metal = device.current({"device_name": "Apple M2", "max_recommended_working_set_size":
                            22 * 2**30}, "metal")
    assert device.describe(metal) == "Metal: Apple M2, recommended working set 22.0 GB"


def test_the_budget_is_the_gpus_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = device.current(H200, "cuda", own=0)
    monkeypatch.setattr(device, "current", lambda: cuda)
    budget, source = memory.device_budget()
    assert budget == int(memory.HEADROOM * 140_000_000_000)
    assert source == f"{memory.HEADROOM:.0%} of the free memory of NVIDIA H200"
    assert memory.device_budget(3.0) == (3 * memory.GiB, "training.max_memory_gb")


def test_the_budget_on_the_cpu_is_the_available_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_ram", lambda: 10 * memory.GiB)
    budget, source = memory.device_budget()
    assert budget == int(memory.HEADROOM * 10 * memory.GiB)
    assert source.endswith("of the available RAM")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's install routes")
def test_the_cli_names_the_install_when_mlx_cannot_load(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    import builtins

    from mlx_rlaif import cli

    real = builtins.__import__

    def no_mlx(name: str, *a, **k):
        if name == "mlx.core":
            raise ImportError("libmlx.so: cannot open shared object file")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mlx)
    monkeypatch.setattr(install, "installed_backends", lambda: {})
    assert cli.main(["--version"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mlx-rlaif: error: no MLX backend is installed")
    assert "'mlx-rlaif[cuda13]'" in err


def test_quantized_models_are_refused_on_cuda_builds_with_the_qmm_fault() -> None:
    """ml-explore/mlx#3487 (an illegal memory access in the CUDA quantized matmul, the issue's
    4-bit crash at the 0.5B shape) is fixed from mlx 0.32.0 (#3509): older CUDA builds are
    refused with the fix; other backends and fixed builds pass."""
    line = device.quantized_problem("cuda", "0.31.2")
    assert line is not None and "mlx >= 0.32.0" in line and "#3487" in line
    assert "pip install -U" in line and "\n" not in line
    for kind, version in (("cuda", "0.32.0"), ("cuda", "0.32.4"), ("cuda", "0.33.0.dev0"),
                          ("metal", "0.31.2"), ("cpu", "0.20.0"), ("cuda", "dev")):
        assert device.quantized_problem(kind, version) is None, (kind, version)


def test_load_refuses_a_quantized_model_on_a_faulting_cuda_build(
        monkeypatch: pytest.MonkeyPatch, micro_model: Path) -> None:
    import mlx.core as mx

    from mlx_rlaif.backends.mlx import policy
    from mlx_rlaif.errors import UsageError

    monkeypatch.setattr(policy, "kind_of", lambda: "cuda")
    monkeypatch.setattr(mx, "__version__", "0.31.2")
    with pytest.raises(UsageError, match=r"need mlx >= 0\.32\.0"):
        policy.load_policy(str(micro_model), quantize=4)
    assert policy.load_policy(str(micro_model)).model is not None  # unquantized: runs
