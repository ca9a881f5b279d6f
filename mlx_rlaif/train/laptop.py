"""A run on a MacBook: kept awake while it trains, minding the battery and the heat. macOS only:
elsewhere nothing here starts a process, adds a metric or prints a line.

- `keep_awake` (training.prevent_sleep, default on): `caffeinate -i -w <pid>` holds an
  idle-sleep assertion for the life of this process (caffeinate ends with it, also after
  kill -9), said once. A closed lid on battery still sleeps: that is macOS's rule, no
  assertion overrides it (docs/training.md, "On a laptop").
- `parse_batt` reads `pmset -g batt`: where the power comes from ('AC Power', 'Battery Power',
  'UPS Power'), the battery's charge and state (a desktop Mac has no battery line).
- `parse_therm` reads `pmset -g therm` (the CPU speed limit Intel Macs report, the thermal
  and performance warning levels); `os_thermal_state` the OS's own state
  (NSProcessInfo.thermalState, through the Objective-C runtime, no root). `system/thermal` is
  the higher of the two: 0 nominal, 1 fair, 2 serious, 3 critical.
- `PowerWatch`, at each step boundary: the metrics (system/thermal, system/on_battery,
  system/battery_percent), a line when the step slows under thermal pressure, and what
  training.on_battery asks when the power is lost: continue (a line when it goes and when it
  comes back), pause (the loop writes a checkpoint and waits for AC power: `wait_for_ac`),
  stop (the run ends as training.max_minutes ends it).

A tool that is missing, fails or prints something these parsers do not know: the run goes on,
one line says so (once per tool), and its readings are left out.

Not covered: Linux power management; anything that needs root (powermetrics); the lid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_S = 10.0  # seconds between readings of pmset (at step boundaries and while paused)
SLOW = 1.25  # a step this many times the median, under thermal pressure, is said once
THERMAL = ("nominal", "fair", "serious", "critical")

Runner = Callable[[list[str]], str]  # a command's stdout; OSError / CalledProcessError on failure


def on_macos() -> bool:
    return sys.platform == "darwin"


def run_tool(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout


# --- staying awake -------------------------------------------------------------------------------


def keep_awake(enabled: bool, say: Callable[[str], None], pid: int | None = None,
               spawn: Callable[..., Any] = subprocess.Popen) -> Any:
    """On macOS with training.prevent_sleep, the caffeinate process that keeps the Mac from
    idle sleep until process `pid` (this one) ends; None elsewhere or where it cannot start."""
    if not enabled or not on_macos():
        return None
    cmd = ["caffeinate", "-i", "-w", str(pid or os.getpid())]
    try:
        proc = spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    except OSError as e:
        say(f"could not start caffeinate ({e}): the Mac may idle-sleep during the run "
            "(training.prevent_sleep)")
        return None
    say("keeping the Mac awake while training (caffeinate -i; training.prevent_sleep: false "
        "allows idle sleep); a closed lid on battery still sleeps (docs/training.md, On a laptop)")
    return proc


def release(proc: Any) -> None:
    """End the caffeinate process (it would end with this process anyway)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


# --- pmset ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Power:
    """`pmset -g batt`: the source ('AC Power', 'Battery Power', 'UPS Power'), the first power
    source's charge in percent and state (the internal battery, or a UPS: 'charging',
    'discharging', 'charged', 'AC attached', ...; None without one)."""

    source: str
    percent: float | None = None
    state: str | None = None

    @property
    def on_battery(self) -> bool:
        return self.source != "AC Power"


_SOURCE = re.compile(r"(?:Now|Currently) drawing from '([^']+)'")
_BATTERY = re.compile(r"^\s*-\S.*?(\d{1,3})%;\s*([^;]*?)\s*(?:;|present:|$)", re.M)


def parse_batt(text: str) -> Power | None:
    """The power source and battery of `pmset -g batt`'s output; None where it names no source."""
    source = _SOURCE.search(text)
    if source is None:
        return None
    battery = _BATTERY.search(text)
    if battery is None:
        return Power(source.group(1))
    return Power(source.group(1), float(battery.group(1)), battery.group(2) or None)


_SPEED = re.compile(r"CPU_Speed_Limit\s*=\s*(\d+)")
_LEVEL = re.compile(r"(?:Thermal|Performance)[ _]?(?:Warning[ _]?)?Level\s*[=:]\s*(\d+)", re.I)
_NONE_RECORDED = "No thermal warning level has been recorded"


def speed_level(limit: int) -> int:
    """A CPU speed limit in percent as a thermal level: 100 nominal, 80+ fair, 50+ serious."""
    return 0 if limit >= 100 else 1 if limit >= 80 else 2 if limit >= 50 else 3


def parse_therm(text: str) -> int | None:
    """The thermal level (0-3) of `pmset -g therm`'s output; None where it says nothing known.
    A warning level above 0 (IOPM's danger 5, crisis 10) is serious, 10 or more critical."""
    speeds = [int(x) for x in _SPEED.findall(text)]
    levels = [int(x) for x in _LEVEL.findall(text)]
    if not speeds and not levels and _NONE_RECORDED not in text:
        return None
    level = speed_level(speeds[-1]) if speeds else 0
    warn = max(levels, default=0)
    if warn:
        level = max(level, 3 if warn >= 10 else 2)
    return level


def os_thermal_state() -> int | None:
    """NSProcessInfo.processInfo.thermalState (0 nominal .. 3 critical) through the Objective-C
    runtime; None off macOS or where it cannot be read."""
    if not on_macos():
        return None
    try:
        objc = ctypes.CDLL("/usr/lib/libobjc.A.dylib")
        ctypes.CDLL("/System/Library/Frameworks/Foundation.framework/Foundation")
    except OSError:
        return None
    ptr = ctypes.c_void_p
    objc.objc_getClass.restype, objc.objc_getClass.argtypes = ptr, [ctypes.c_char_p]
    objc.sel_registerName.restype, objc.sel_registerName.argtypes = ptr, [ctypes.c_char_p]
    send_id = ctypes.CFUNCTYPE(ptr, ptr, ptr)(("objc_msgSend", objc))
    send_long = ctypes.CFUNCTYPE(ctypes.c_long, ptr, ptr)(("objc_msgSend", objc))
    cls = objc.objc_getClass(b"NSProcessInfo")
    info = send_id(cls, objc.sel_registerName(b"processInfo")) if cls else None
    state = send_long(info, objc.sel_registerName(b"thermalState")) if info else -1
    return int(state) if 0 <= state < len(THERMAL) else None


def wired_sysctl(runner: Runner = run_tool, macos: bool | None = None) -> str | None:
    """macOS's own limit on wired GPU memory: `iogpu.wired_limit_mb` (macOS 14 and later) or
    `debug.iogpu.wired_limit` (bytes, macOS 13), where set (0 is macOS's default: the
    recommended working set); None off macOS."""
    if not (on_macos() if macos is None else macos):
        return None
    for key, unit in (("iogpu.wired_limit_mb", 2**20), ("debug.iogpu.wired_limit", 1)):
        try:
            value = int(runner(["sysctl", "-n", key]).strip())
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if value <= 0:
            return f"{key} not set (0: macOS's default)"
        return f"{key} = {value} ({value * unit / 2**30:.2f} GB)"
    return "iogpu.wired_limit_mb unreadable (sysctl)"


# --- the watch at step boundaries ----------------------------------------------------------------


class PowerWatch:
    """Readings at step boundaries (at most every POLL_S seconds) and what training.on_battery
    asks of the loop. `runner`, `clock`, `macos`, `os_state` and `sleep` (the pause's) are
    parameters for the tests."""

    def __init__(self, on_battery: str, say: Callable[[str], None], runner: Runner = run_tool,
                 clock: Callable[[], float] = time.monotonic, macos: bool | None = None,
                 os_state: Callable[[], int | None] = os_thermal_state,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.policy, self.say, self.runner, self.clock = on_battery, say, runner, clock
        self.os_state, self.sleep = os_state, sleep
        self.active = on_macos() if macos is None else macos
        self.power: Power | None = None
        self.thermal: int | None = None
        self._read_at = -float("inf")
        self._said: set[str] = set()  # tools whose failure was said
        self._lost = False  # the battery line was said for this loss of power
        self._slow_said = False

    def _tool(self, name: str, cmd: list[str], parse: Callable[[str], Any]) -> Any:
        try:
            out = self.runner(cmd)
        except (OSError, subprocess.SubprocessError) as e:
            return self._once(name, f"`{' '.join(cmd)}` failed ({type(e).__name__}: {e})")
        value = parse(out)
        if value is None:
            first = out.strip().splitlines()[0][:80] if out.strip() else "nothing"
            return self._once(name, f"`{' '.join(cmd)}` printed something unexpected "
                                    f"({first!r})")
        return value

    def _once(self, name: str, what: str) -> None:
        if name not in self._said:
            self._said.add(name)
            effect = ("the power source is unknown: training.on_battery has no effect"
                      if name == "batt" else "system/thermal comes from the OS alone")
            self.say(f"{what}: {effect}; the run goes on")
        return None

    def read(self) -> dict[str, float]:
        """The metrics of the latest readings (read again after POLL_S seconds); {} off macOS."""
        if not self.active:
            return {}
        now = self.clock()
        if now - self._read_at >= POLL_S:
            self._read_at = now
            self.power = self._tool("batt", ["pmset", "-g", "batt"], parse_batt)
            therm = self._tool("therm", ["pmset", "-g", "therm"], parse_therm)
            os_level = self.os_state()
            known = [x for x in (therm, os_level) if x is not None]
            self.thermal = max(known) if known else None
        out: dict[str, float] = {}
        if self.thermal is not None:
            out["system/thermal"] = float(self.thermal)
        if self.power is not None:
            out["system/on_battery"] = float(self.power.on_battery)
            if self.power.percent is not None:
                out["system/battery_percent"] = self.power.percent
        return out

    def slowed(self, step_s: float, median_s: float | None) -> None:
        """Say once (until the pressure ends) that a step slowed under thermal pressure."""
        if not self.thermal:
            self._slow_said = False
            return
        if median_s and step_s > SLOW * median_s and not self._slow_said:
            self._slow_said = True
            self.say(f"the step took {step_s:.1f} s (median {median_s:.1f} s) under thermal "
                     f"pressure ({THERMAL[self.thermal]}): the Mac is throttling; cooler air "
                     "or a stand helps")

    def decide(self) -> str:
        """"continue", "pause" or "stop" at this step boundary (from the latest reading)."""
        p = self.power
        if p is None or not p.on_battery:
            if self._lost and p is not None and self.policy == "continue":
                self.say("back on AC power")
            self._lost = False
            return "continue"
        if self.policy == "continue" and not self._lost:
            self.say(f"on battery power{charge(p)}: the run goes on (training.on_battery: "
                     "continue; pause or stop to spare the battery)")
        self._lost = True
        return self.policy

    def on_ac(self) -> bool:
        """Read the power source now (while paused): AC power, or unknown (then the run goes
        on rather than wait for a reading that never comes)."""
        self._read_at = -float("inf")
        self.read()
        return self.power is None or not self.power.on_battery


def charge(p: Power) -> str:
    return f" ({p.percent:.0f}%, {p.state})" if p.percent is not None else ""


def wait_for_ac(on_ac: Callable[[], bool], stop: Callable[[], bool],
                sleep: Callable[[float], None]) -> float:
    """Wait until `on_ac()` or `stop()` (Ctrl-C), polling every POLL_S seconds; returns the
    seconds waited."""
    start = time.monotonic()
    while not stop() and not on_ac():
        sleep(POLL_S)
    return time.monotonic() - start


def boundary(run: Any, hub: Any, watch: PowerWatch, stopped: Callable[[], bool],
             batch: int) -> tuple[bool, float]:
    """What training.on_battery asks after this step, rank 0's power source deciding for every
    rank: (end the run now, as training.max_minutes does; seconds paused). A pause writes a
    checkpoint first (`batch`: the step's batch in its epoch, for its name) and waits for AC
    power or Ctrl-C."""
    from ..artifacts import checkpoint
    from ..metrics.eta import short
    from .run import save, saved_at

    if watch.policy == "continue":  # lines only: no rank waits on another's power source
        watch.decide()
        return False, 0.0
    action = run.world.first(watch.decide, "exchange of the power source")
    step, p = run.state.step, watch.power
    where = charge(p) if p is not None else ""
    if action == "stop":
        hub.message(f"on battery power{where}: the run ends after step {step} "
                    "(training.on_battery: stop)")
        return True, 0.0
    if action != "pause":
        return False, 0.0
    if not saved_at(run, step):
        save(run, hub, checkpoint.checkpoint_name(run.state.epoch + 1, batch, step))
    hub.message(f"on battery power{where}: paused after step {step}, checkpoint saved; training "
                "resumes on AC power (training.on_battery: pause; Ctrl-C stops the run)")
    waited = wait_for_ac(lambda: run.world.first(watch.on_ac, "exchange of the power source"),
                         lambda: run.world.first(stopped, "exchange of a stop"), watch.sleep)
    if not stopped():
        hub.message(f"back on AC power after {short(waited)} paused: training resumes")
    return False, waited
