"""A run on a laptop (issue 61): the ETA's arithmetic, macOS's tools parsed from fixtures, the
power policy with a fake power source, caffeinate, MLX's memory limits, the displays.

The pmset fixtures (tests/data/pmset/) are transcribed from outputs published for these macOS
versions (no Mac runs these tests): `pmset -g batt` on AC (charged, charging, held at 80% by
optimized charging), on battery, a desktop Mac (no battery line), a UPS, the wording of
macOS 10.6 ("Currently drawing from"), and output the parser does not know; `pmset -g therm`
of Intel Macs (the CPU Power notify block, throttled and not), Apple silicon (notes only), a
recorded warning level (its exact wording is an assumption: the parser takes `Thermal Warning
Level = N`, `Thermal_Level = N` and `Performance Warning Level: N` alike) and unknown output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import pytest

from mlx_rlaif.backends.mlx import memory
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.metrics.dashboard import DashboardState, plain_line
from mlx_rlaif.metrics.eta import StepClock, eta_seconds, short, step_cost
from mlx_rlaif.train import laptop, memory_plan
from mlx_rlaif.train.distributed import World
from mlx_rlaif.train.laptop import Power, PowerWatch, parse_batt, parse_therm

PMSET = Path(__file__).parent / "data" / "pmset"
GiB = 2**30


# --- the ETA -------------------------------------------------------------------------------------


def test_eta_is_the_median_step_with_the_periodic_work_spread_over_the_steps():
    times = [30.0, 10.0, 12.0, 11.0]  # a first step that compiled: the median is 11.5
    assert step_cost(times, 8.0, 4) == 11.5 + 2.0  # a checkpoint of 8 s over 4 steps
    assert eta_seconds(times, 8.0, 4, 10, None) == 135.0  # 10 steps left at 13.5 s
    # 40 s of a time budget left: the run ends at the step that passes it, ceil(40/13.5) = 3
    assert eta_seconds(times, 8.0, 4, 10, 40.0) == 3 * 13.5
    assert eta_seconds(times, 8.0, 4, None, 40.0) == 3 * 13.5  # max_minutes alone
    assert eta_seconds(times, 8.0, 4, 2, 40.0) == 27.0  # the step bound comes first
    assert eta_seconds(times, 8.0, 4, 10, -5.0) == 0.0  # the budget is spent: this step ends it
    assert eta_seconds(times, 0.0, 4, None, None) is None  # no bound
    assert eta_seconds([], 0.0, 0, 10, None) is None  # nothing measured yet


def test_step_clock_keeps_the_recent_steps_and_the_periodic_total():
    clock = StepClock()
    for t in [100.0] + [2.0] * 25:  # the compiling first step falls out of the window
        clock.step(t)
    clock.periodic(13.0)
    assert clock.median() == 2.0 and clock.steps == 26 and len(clock.recent) == 20
    assert clock.eta(4, None) == pytest.approx(4 * (2.0 + 13.0 / 26))


def test_short_durations():
    assert [short(x) for x in (None, 0, 45.4, 750, 3725, 7260)] == \
        ["-", "0s", "45s", "12m30s", "1h02m", "2h01m"]


def test_plain_line_and_dashboard_show_elapsed_eta_and_thermal_pressure():
    m = {"reward/mean": 0.5, "elapsed_s": 62.0, "time/eta_s": 750.0}
    assert plain_line(3, 10, m) == "step 3/10 | elapsed 1m02s | eta 12m30s | reward 0.5000"
    assert plain_line(3, 10, {**m, "system/thermal": 2.0}).endswith("| thermal serious")
    assert "thermal" not in plain_line(3, 10, {**m, "system/thermal": 0.0})
    s = DashboardState(total_steps=10, step=3, first_step=1, updated=1000.0,
                       metrics={"time/eta_s": 750.0})
    assert s.eta(1010.0) == 740.0  # the loop's estimate, less the time since that step
    assert s.eta(5000.0) == 0.0


# --- pmset ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,expected", [
    ("batt-10.13-ac-charged", Power("AC Power", 100.0, "charged")),
    ("batt-10.15-battery", Power("Battery Power", 85.0, "discharging")),
    ("batt-12-charging", Power("AC Power", 62.0, "charging")),
    ("batt-14-ac-not-charging", Power("AC Power", 80.0, "AC attached")),
    ("batt-15-battery-no-estimate", Power("Battery Power", 47.0, "discharging")),
    ("batt-14-desktop", Power("AC Power")),
    ("batt-10.6-ac", Power("AC Power", 100.0, "charged")),
    ("batt-13-desktop-ups", Power("UPS Power", 92.0, "discharging")),
    ("batt-unexpected", None),
])
def test_pmset_batt_fixtures(name, expected):
    got = parse_batt((PMSET / f"{name}.txt").read_text())
    assert got == expected
    if got is not None:
        assert got.on_battery == (got.source != "AC Power")


@pytest.mark.parametrize("name,level", [
    ("therm-10.13-intel-throttled", 3),  # CPU_Speed_Limit 35
    ("therm-10.15-intel-nominal", 0),  # 100
    ("therm-11-intel-fair", 1),  # 87
    ("therm-14-apple-silicon", 0),  # nothing recorded
    ("therm-warning-level", 2),
    ("therm-unexpected", None),
])
def test_pmset_therm_fixtures(name, level):
    assert parse_therm((PMSET / f"{name}.txt").read_text()) == level


def fixture_runner(batt: str, therm: str = "therm-14-apple-silicon", calls: list | None = None):
    def run(cmd: list[str]) -> str:
        if calls is not None:
            calls.append(cmd)
        name = batt if cmd[-1] == "batt" else therm
        if name == "missing":
            raise FileNotFoundError(2, "No such file or directory", cmd[0])
        return (PMSET / f"{name}.txt").read_text()
    return run


def test_the_watch_reads_metrics_and_takes_the_higher_thermal_level():
    said: list[str] = []
    w = PowerWatch("continue", said.append, fixture_runner("batt-15-battery-no-estimate",
                                                           "therm-11-intel-fair"),
                   macos=True, os_state=lambda: 2)
    assert w.read() == {"system/thermal": 2.0, "system/on_battery": 1.0,
                        "system/battery_percent": 47.0}
    assert said == []
    off = PowerWatch("pause", said.append, fixture_runner("missing"), macos=False)
    assert off.read() == {} and off.decide() == "continue" and said == []  # not macOS: nothing


def test_unexpected_or_missing_tools_are_said_once_and_the_run_goes_on():
    said: list[str] = []
    now = [0.0]
    w = PowerWatch("pause", said.append, fixture_runner("batt-unexpected", "missing"),
                   clock=lambda: now[0], macos=True, os_state=lambda: None)
    for _ in range(3):
        now[0] += laptop.POLL_S
        assert w.read() == {}
        assert w.decide() == "continue"  # an unknown power source never pauses the run
    assert len(said) == 2, said  # one line per tool, not one per reading
    assert "printed something unexpected ('Drawing power from the USB-C" in said[0]
    assert "the run goes on" in said[0] and "FileNotFoundError" in said[1]


def test_readings_are_taken_at_most_every_poll_interval():
    calls: list = []
    now = [100.0]
    w = PowerWatch("continue", print, fixture_runner("batt-12-charging", calls=calls),
                   clock=lambda: now[0], macos=True, os_state=lambda: None)
    w.read()
    w.read()
    assert len(calls) == 2  # batt and therm once
    now[0] += laptop.POLL_S
    w.read()
    assert len(calls) == 4


class FakePower:
    """A power source the test switches: the pmset runner reads it."""

    def __init__(self, source: str = "batt-12-charging") -> None:
        self.source = source

    def __call__(self, cmd: list[str]) -> str:
        name = self.source if cmd[-1] == "batt" else "therm-14-apple-silicon"
        return (PMSET / f"{name}.txt").read_text()


def test_continue_says_when_the_power_goes_and_when_it_comes_back():
    said: list[str] = []
    power, now = FakePower(), [0.0]
    w = PowerWatch("continue", said.append, power, clock=lambda: now[0], macos=True,
                   os_state=lambda: None)
    decisions = []
    for source in ("batt-12-charging", "batt-10.15-battery", "batt-10.15-battery",
                   "batt-13-desktop-ups", "batt-14-ac-not-charging", "batt-10.15-battery"):
        power.source, now[0] = source, now[0] + laptop.POLL_S
        w.read()
        decisions.append(w.decide())
    assert decisions == ["continue"] * 6
    assert [x.split(":")[0] for x in said] == [
        "on battery power (85%, discharging)", "back on AC power",
        "on battery power (85%, discharging)"]


def fake_run(step: int = 5, saved: bool = False):
    hub = SimpleNamespace(lines=[])
    hub.message = hub.lines.append
    state = SimpleNamespace(step=step, epoch=0)
    return SimpleNamespace(world=World(), state=state, saved=saved), hub


def test_pause_writes_a_checkpoint_and_waits_for_ac_power(monkeypatch):
    from mlx_rlaif.train import run as run_mod

    saves: list[str] = []
    monkeypatch.setattr(run_mod, "saved_at", lambda run, step: run.saved)
    monkeypatch.setattr(run_mod, "save", lambda run, hub, name: saves.append(name))
    power, sleeps = FakePower("batt-10.15-battery"), []

    def sleep(s: float) -> None:  # the charger comes back after three polls
        sleeps.append(s)
        if len(sleeps) == 3:
            power.source = "batt-12-charging"

    run, hub = fake_run()
    w = PowerWatch("pause", hub.message, power, macos=True, os_state=lambda: None, sleep=sleep)
    w.read()
    end, waited = laptop.boundary(run, hub, w, lambda: False, batch=3)
    assert not end and waited >= 0 and sleeps == [laptop.POLL_S] * 3
    assert saves == ["checkpoint-e1-b3-gs5"]
    assert "paused after step 5, checkpoint saved" in hub.lines[0]
    assert hub.lines[-1].startswith("back on AC power after")
    # already saved at this step (a periodic checkpoint): none written again
    run, hub = fake_run(saved=True)
    power.source, sleeps[:] = "batt-10.15-battery", []
    w = PowerWatch("pause", hub.message, power, macos=True, os_state=lambda: None, sleep=sleep)
    w.read()
    laptop.boundary(run, hub, w, lambda: False, batch=3)
    assert saves == ["checkpoint-e1-b3-gs5"] and len(sleeps) == 3


def test_ctrl_c_ends_a_pause_and_stop_ends_the_run(monkeypatch):
    from mlx_rlaif.train import run as run_mod

    monkeypatch.setattr(run_mod, "saved_at", lambda run, step: True)
    run, hub = fake_run()
    w = PowerWatch("pause", hub.message, FakePower("batt-10.15-battery"), macos=True,
                   os_state=lambda: None, sleep=lambda s: pytest.fail("no wait after Ctrl-C"))
    w.read()
    assert laptop.boundary(run, hub, w, lambda: True, batch=1) == (False, pytest.approx(0,
                                                                                      abs=1))
    assert not any(x.startswith("back on AC") for x in hub.lines)
    run, hub = fake_run()
    w = PowerWatch("stop", hub.message, FakePower("batt-10.15-battery"), macos=True,
                   os_state=lambda: None)
    w.read()
    assert laptop.boundary(run, hub, w, lambda: False, batch=1) == (True, 0.0)
    assert "the run ends after step 5 (training.on_battery: stop)" in hub.lines[0]
    w = PowerWatch("stop", hub.message, FakePower("batt-14-desktop"), macos=True,
                   os_state=lambda: None)
    w.read()
    assert laptop.boundary(run, hub, w, lambda: False, batch=1) == (False, 0.0)


def test_a_step_slowed_by_heat_is_said_once_until_the_pressure_ends():
    said: list[str] = []
    w = PowerWatch("continue", said.append, FakePower(), macos=True, os_state=lambda: None)
    w.thermal = 2
    w.slowed(10.0, 9.0)  # not slower than 1.25x the median
    w.slowed(14.0, 9.0)
    w.slowed(15.0, 9.0)
    assert len(said) == 1 and "under thermal pressure (serious)" in said[0]
    w.thermal = 0
    w.slowed(15.0, 9.0)
    w.thermal = 1
    w.slowed(15.0, 9.0)
    assert len(said) == 2


# --- caffeinate and sysctl -----------------------------------------------------------------------


def test_caffeinate_holds_the_mac_awake_for_this_process(monkeypatch):
    said, spawned = [], []

    def spawn(cmd, **kw):
        spawned.append(cmd)
        return SimpleNamespace(poll=lambda: 0)

    monkeypatch.setattr(laptop, "on_macos", lambda: False)
    assert laptop.keep_awake(True, said.append, 123, spawn) is None and not spawned
    monkeypatch.setattr(laptop, "on_macos", lambda: True)
    assert laptop.keep_awake(False, said.append, 123, spawn) is None and not spawned
    assert laptop.keep_awake(True, said.append, 123, spawn) is not None
    assert spawned == [["caffeinate", "-i", "-w", "123"]] and len(said) == 1
    assert "closed lid on battery still sleeps" in said[0]

    def missing(cmd, **kw):
        raise FileNotFoundError(2, "No such file or directory", "caffeinate")

    assert laptop.keep_awake(True, said.append, 123, missing) is None
    assert "may idle-sleep" in said[1]


def test_caffeinate_ends_with_its_process():
    """The real thing where it exists (macOS): `-w` ends it when the watched process ends."""
    import shutil

    if shutil.which("caffeinate") is None:
        pytest.skip("caffeinate is macOS's")
    sleeper = subprocess.Popen(["sleep", "30"])
    caf = subprocess.Popen(["caffeinate", "-i", "-w", str(sleeper.pid)])
    sleeper.kill()
    sleeper.wait()
    assert caf.wait(timeout=10) is not None


def test_the_machines_wired_limit_from_sysctl():
    def runner(values: dict):
        def run(cmd):
            v = values.get(cmd[-1])
            if v is None:
                raise subprocess.CalledProcessError(1, cmd)
            return v
        return run

    assert laptop.wired_sysctl(runner({}), macos=False) is None
    assert laptop.wired_sysctl(runner({"iogpu.wired_limit_mb": "0\n"}), macos=True) == \
        "iogpu.wired_limit_mb not set (0: macOS's default)"
    assert laptop.wired_sysctl(runner({"iogpu.wired_limit_mb": "28672\n"}), macos=True) == \
        "iogpu.wired_limit_mb = 28672 (28.00 GB)"
    assert laptop.wired_sysctl(runner({"debug.iogpu.wired_limit": str(24 * GiB)}),
                               macos=True) == f"debug.iogpu.wired_limit = {24 * GiB} (24.00 GB)"
    assert "unreadable" in laptop.wired_sysctl(runner({}), macos=True)


# --- MLX's memory limits -------------------------------------------------------------------------


def limits_model(wired: float = 0.0, cache: float = 0.0):
    return SimpleNamespace(wired_limit_gb=wired, cache_limit_gb=cache)


def test_memory_limits_default_from_the_plan_on_metal_and_configured_anywhere():
    plan = SimpleNamespace(peak=10 * GiB)
    got = memory_plan.device_limits(limits_model(), plan, 16 * GiB, 20 * GiB)
    assert (got.wired, got.cache) == (16 * GiB, 6 * GiB)  # the budget; budget - plan's peak
    tight = memory_plan.device_limits(limits_model(), SimpleNamespace(peak=15.9 * GiB),
                                      16 * GiB, 20 * GiB)
    assert tight.cache == int(0.1 * 16 * GiB)  # at least 10% of the budget
    got = memory_plan.device_limits(limits_model(12, 2), plan, 16 * GiB, 20 * GiB)
    assert (got.wired, got.cache) == (12 * GiB, 2 * GiB)
    assert got.line == "MLX limits: wired 12.00 GB (model.wired_limit_gb), cache 2.00 GB " \
        "(model.cache_limit_gb)"
    cpu = memory_plan.device_limits(limits_model(12, 2), plan, 16 * GiB, None)
    assert (cpu.wired, cpu.cache) == (None, 2 * GiB) and "no effect off Metal" in cpu.line
    assert memory_plan.device_limits(limits_model(), plan, 16 * GiB, None).line == ""
    with pytest.raises(ConfigError, match="iogpu.wired_limit_mb"):
        memory_plan.device_limits(limits_model(24), plan, 16 * GiB, 20 * GiB)


def test_set_wired_limit_and_set_cache_limit_get_the_configured_values(monkeypatch):
    calls: list = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: calls.append(("wired", n)) or 0)
    monkeypatch.setattr(mx, "set_cache_limit", lambda n: calls.append(("cache", n)) or 0)
    monkeypatch.setattr(memory, "recommended_working_set", lambda: 20 * GiB)  # Metal
    plan = SimpleNamespace(peak=10 * GiB)
    line = memory_plan.apply_limits(limits_model(12, 2.5), plan, 16 * GiB)
    assert calls == [("cache", int(2.5 * GiB)), ("wired", 12 * GiB)] and "12.00 GB" in line
    calls.clear()
    memory_plan.apply_limits(limits_model(), plan, 16 * GiB)
    assert calls == [("cache", 6 * GiB), ("wired", 16 * GiB)]
    calls.clear()
    monkeypatch.setattr(memory, "recommended_working_set", lambda: None)  # the CPU: cache only
    memory_plan.apply_limits(limits_model(12, 2.5), plan, 16 * GiB)
    assert calls == [("cache", int(2.5 * GiB))]


# --- the config ----------------------------------------------------------------------------------


def test_config_options_and_refusals():
    cfg = load(None, [])
    assert cfg.training.prevent_sleep is True and cfg.training.on_battery == "continue"
    assert check(load(None, ["training.on_battery=pause", "training.prevent_sleep=false",
                             "model.wired_limit_gb=8", "model.cache_limit_gb=1"]))
    with pytest.raises(ConfigError, match="continue, pause, stop"):
        load(None, ["training.on_battery=sometimes"])
    with pytest.raises(ConfigError, match="model.wired_limit_gb is MLX-only.*model.backend"):
        check(load(None, ["model.backend=torch", "model.wired_limit_gb=8"]))
    with pytest.raises(ConfigError, match="model.cache_limit_gb"):
        load(None, ["model.cache_limit_gb=-1"])


def test_doctor_prints_the_machines_limits_and_the_runs(monkeypatch, capsys):
    from mlx_rlaif.commands import doctor

    cfg, plan = load(None, []), SimpleNamespace(peak=10 * GiB)
    assert doctor.limits_report(cfg, plan, 16 * GiB)  # this machine: MLX on the CPU
    out = capsys.readouterr().out
    assert out.startswith("limits    no wired memory (MLX is not on Metal here)\n")
    assert "the run: MLX's defaults" in out
    monkeypatch.setattr(memory, "recommended_working_set", lambda: 20 * GiB)
    monkeypatch.setattr(laptop, "wired_sysctl", lambda: "iogpu.wired_limit_mb = 20480 (20.00 GB)")
    assert doctor.limits_report(cfg, plan, 16 * GiB)
    assert capsys.readouterr().out.splitlines() == [
        "limits    iogpu.wired_limit_mb = 20480 (20.00 GB); MLX's recommended working set "
        "20.00 GB",
        "          the run: wired 16.00 GB (the budget), cache 6.00 GB (what the plan leaves of "
        "the budget)"]
    assert not doctor.limits_report(load(None, ["model.wired_limit_gb=24"]), plan, 16 * GiB)
    assert "the run: REFUSED: model.wired_limit_gb = 24 is over" in capsys.readouterr().out


def test_the_dashboard_shows_elapsed_eta_and_thermal_pressure():
    import os
    import time

    from rich.console import Console

    from mlx_rlaif.metrics.dashboard import render

    s = DashboardState(total_steps=10, step=4, first_step=1, updated=time.time(),
                       started=time.time() - 125,
                       metrics={"time/eta_s": 750.0, "time/step": 9.0, "system/thermal": 3.0})
    console = Console(record=True, width=160, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(s))
    text = console.export_text()
    assert "elapsed 0:02:0" in text and "ETA 0:12:" in text
    assert "thermal pressure: critical" in text


def test_a_run_pauses_on_battery_with_a_checkpoint_and_resumes_on_ac(micro_model, prompts_file,
                                                                      tmp_path, monkeypatch):
    """The loop's wiring, in a real 3-step run: the charger is unplugged after step 1's
    reading, so the run pauses after step 1 with a checkpoint, polls until AC power is back,
    and trains on to step 3; caffeinate is not on this machine: one line says so."""
    from functools import partial

    from recording_hub import RecordingHub

    from mlx_rlaif.artifacts import checkpoint
    from mlx_rlaif.train import loop as loop_mod
    from mlx_rlaif.train import train

    power, polls = FakePower("batt-10.15-battery"), []

    def sleep(s: float) -> None:  # AC power after two polls
        polls.append(s)
        if len(polls) == 2:
            power.source = "batt-12-charging"

    monkeypatch.setattr(loop_mod, "PowerWatch", partial(PowerWatch, runner=power, macos=True,
                                                         os_state=lambda: 1, sleep=sleep))
    monkeypatch.setattr(laptop, "on_macos", lambda: True)  # caffeinate: missing here
    cfg = load(None, [
        f"model.path={micro_model}", f"data.train_file={prompts_file}",
        f"training.output_dir={tmp_path / 'run'}", "reward.type=syntax",
        "generation.max_new_tokens=4", "generation.num_samples_per_prompt=2",
        "training.batch_size=1", "training.max_steps=3", "training.on_battery=pause",
        "logging.tensorboard=false", "logging.baseline_eval_batches=0",
        "logging.collect_dataset=false", "training.save_every_epochs=0", "data.eval_file="])
    hub = RecordingHub()
    train(cfg, hub=hub)
    assert [s for s, _ in hub.steps] == [1, 2, 3] and polls == [laptop.POLL_S] * 2
    assert [(m["system/on_battery"], m["system/battery_percent"], m["system/thermal"])
            for _, m in hub.steps] == [(1.0, 85.0, 1.0), (0.0, 62.0, 1.0), (0.0, 62.0, 1.0)]
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path / "run")]
    assert "checkpoint-e1-b1-gs1" in names and "checkpoint-final-gs3" in names, names
    said = "\n".join(hub.messages)
    assert "could not start caffeinate" in said
    assert said.count("paused after step") == 1  # the reading is kept POLL_S s: one pause
    assert "back on AC power after" in said
    assert all("time/eta_s" in m for _, m in hub.steps) and hub.steps[-1][1]["time/eta_s"] == 0
