"""The macOS sandbox: a default-deny seatbelt profile, its parameters, and the command that
starts one run under it (`sandbox-exec -p PROFILE -D NAME=PATH ... python -I -S -c LAUNCHER`).

The profile is fixed text: it names no path of this machine. Every path a run may touch (its
box, the interpreter's installation, the toolchains) arrives as a `-D` parameter, absolute and
`realpath()`'d (the kernel checks resolved paths: `/tmp` is `/private/tmp`, `/var` is
`/private/var`), so no path, whatever it holds (`"`, `)`, a newline), can add a rule. A profile
that fails to compile or apply fails the run (the launcher never reports ready: SandboxError);
nothing retries it unsandboxed.

What it allows, and nothing else (`(deny default)` first; the last matching rule wins):
- processes: `process-fork`; `process-exec` of the interpreter, the toolchains, the box
  (compiled programs) and the program directory (`PROG`: a stdin/stdout program's copy that
  its runs execute, runs.py; the box when there is none); `signal` and `process-info*` only
  to processes in this sandbox;
- reads (and `file-map-executable`, to load code): the interpreter's installation, the
  toolchains, the box, the program directory, the system's libraries (`/usr`, `/System/Library`, the dyld cache in
  the cryptexes, `/private/var/db/dyld`), the time zone database, a few devices
  (`/dev/null`, `/dev/zero`, `/dev/random`, `/dev/urandom`, the `/dev/fd` listing); metadata
  (`stat`) anywhere: path resolution needs it for every component of every path;
- writes: the box, and `/dev/null` (never the program directory);
- Mach: the one service `getpwuid` needs (`com.apple.system.opendirectoryd.libinfo`);
- `sysctl-read` of hardware and OS-version names only (no `kern.proc*`: no other process's
  argv or environment through `kern.procargs2`); POSIX semaphores named like Python's
  multiprocessing's (`/mp-`); creating a Unix socket (`socketpair`, asyncio's self-pipe: no
  `network-bind` or `network-outbound` is allowed, so it reaches nothing);
- then, over everything above: `(deny file-link)` (no hard link of a file outside into the
  box) and `(deny file-write-setugid)`.
Denied by `(deny default)`: every network operation (TCP, UDP, DNS, Unix sockets), AppleEvents
(`osascript`), Launch Services (`open`), every other Mach service (the pasteboard, the
keychain, launchd's `launchctl submit`), IOKit, POSIX shared memory, `sysctl-write`,
pseudo-terminals and reads anywhere else: the home directory, `/Volumes`, `/Users/Shared`, the
per-user temporary directory where the boxes of other runs live.

Where the rules come from: Apple's profile language as its own profiles in
`/System/Library/Sandbox/Profiles` use it, and the default-deny profiles of projects that run
untrusted code on macOS: OpenAI Codex (`seatbelt_base_policy.sbpl`: its sysctl allow-list and
`ipc-posix-sem` for multiprocessing), Chromium (`sandbox/policy/mac/common.sb`), Anthropic's
sandbox-runtime (no `kern.procargs2`), Nix (`sandbox-defaults.sb`) and Gemini CLI (`-D`
parameters instead of formatted paths, PR #22832). No file of theirs is copied.

Not covered: nobody runs this profile in our CI (Linux): tests/test_seatbelt.py holds its text
(a golden file) and its rules (a parser), and `mlx-rlaif doctor` on a Mac is the check that it
contains what it claims and that Python, multiprocessing and the toolchains still work in it.
Timing side channels, the CPU and memory limits (box.py), and what the kernel exposes to every
process regardless of profile (e.g. `getpid`, the load average) are outside a profile's reach.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
BOX_PARAM = "BOX"
PROG_PARAM = "PROG"  # the program directory of a stdin/stdout program's runs (runs.py)

SYSTEM_READS = ("/usr", "/System/Library", "/System/Volumes/Preboot/Cryptexes",
                "/System/Cryptexes", "/private/var/db/dyld", "/private/var/db/timezone")
DEVICE_READS = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/fd",
                "/private/etc/localtime")
MACH_SERVICES = ("com.apple.system.opendirectoryd.libinfo",)
SYSCTL_NAMES = (
    "hw.activecpu", "hw.byteorder", "hw.cachelinesize", "hw.cpufamily", "hw.cpusubtype",
    "hw.cputype", "hw.l1dcachesize", "hw.l1icachesize", "hw.l2cachesize", "hw.logicalcpu",
    "hw.logicalcpu_max", "hw.machine", "hw.memsize", "hw.model", "hw.ncpu", "hw.nperflevels",
    "hw.pagesize", "hw.physicalcpu", "hw.physicalcpu_max", "hw.tbfrequency",
    "kern.argmax", "kern.hostname", "kern.maxfilesperproc", "kern.osproductversion",
    "kern.osrelease", "kern.ostype", "kern.osvariant_status", "kern.osversion",
    "kern.secure_kernel", "kern.usrstack64", "kern.version", "sysctl.proc_cputype",
    "sysctl.proc_translated",
)
SYSCTL_PREFIXES = ("hw.optional.", "hw.perflevel")
SEMAPHORE_PREFIX = "/mp-"  # multiprocessing's SemLock names: "/mp-" + 8 random characters


def exec_param(i: int) -> str:
    """The parameter name of the i-th directory the run may read and execute from."""
    return f"EXEC_{i}"


def _lines(items: Sequence[str]) -> str:
    return "\n".join(f"  {x}" for x in items)


def profile(n_exec: int) -> str:
    """The profile's text for a run with `n_exec` interpreter and toolchain directories (the
    parameters EXEC_0 .. EXEC_{n-1}, BOX, and PROG: the program directory, read and run only).
    The same text for every run of one Sandbox."""
    code = [f'(subpath (param "{exec_param(i)}"))' for i in range(n_exec)]
    code += [f'(subpath (param "{BOX_PARAM}"))', f'(subpath (param "{PROG_PARAM}"))']
    system = [f'(subpath "{p}")' for p in SYSTEM_READS]
    devices = [f'(literal "{p}")' for p in DEVICE_READS]
    sysctls = ([f'(sysctl-name "{n}")' for n in SYSCTL_NAMES]
               + [f'(sysctl-name-prefix "{p}")' for p in SYSCTL_PREFIXES])
    mach = [f'(global-name "{s}")' for s in MACH_SERVICES]
    return f"""(version 1)
(deny default)

; processes: fork; exec the interpreter, the toolchains, the box's and the program directory's
(allow process-fork)
(allow process-exec
{_lines(code)})
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; reads: stat anywhere (path resolution); contents only of these
(allow file-read-metadata)
(allow file-read* file-map-executable
{_lines(code + system)})
(allow file-read*
{_lines(devices)})

; writes: the box and /dev/null
(allow file-write* (subpath (param "{BOX_PARAM}")))
(allow file-write-data (literal "/dev/null"))

; the one Mach service getpwuid needs; hardware and OS-version sysctls; multiprocessing
(allow mach-lookup
{_lines(mach)})
(allow sysctl-read
{_lines(sysctls)})
(allow ipc-posix-sem (ipc-posix-name-prefix "{SEMAPHORE_PREFIX}"))
; creating a Unix socket (socketpair: asyncio's self-pipe); binding or connecting one is denied
(allow system-socket (socket-domain AF_UNIX))

; over every allow above: no hard links, no setuid or setgid bits
(deny file-link)
(deny file-write-setugid)
"""


def params(box: str | os.PathLike, exec_dirs: Sequence[str],
           program: str | os.PathLike | None = None) -> dict[str, str]:
    """The -D parameters of one run: every path absolute and resolved (realpath). `program`:
    the program directory (runs.py), readable and runnable, never writable; without one, the
    box (which the run may read already)."""
    out = {exec_param(i): os.path.realpath(p) for i, p in enumerate(exec_dirs)}
    out[BOX_PARAM] = os.path.realpath(box)
    out[PROG_PARAM] = os.path.realpath(program if program is not None else box)
    return out


def command(text: str, values: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """`sandbox-exec` running `argv` under the profile `text` with the parameters `values`."""
    defines = [x for name, value in values.items() for x in ("-D", f"{name}={value}")]
    return [SANDBOX_EXEC, "-p", text, *defines, *argv]


def interpreter_dirs(prefix: str, executable: str) -> list[str]:
    """What the interpreter needs to read and run: its installation and, for a Homebrew Python,
    Homebrew's kegs (its C extensions link OpenSSL, SQLite, mpdecimal from there)."""
    out = [prefix]
    real = os.path.realpath(executable)
    if real.startswith("/opt/homebrew/Cellar/"):  # /usr/local's kegs are under /usr already
        out += ["/opt/homebrew/Cellar", "/opt/homebrew/opt"]
    return out


# --- toolchains: the real compilers, never the /usr/bin xcrun shims -------------------------
# A shim runs xcrun, which caches in the temporary directory and asks launchd's services: under
# this profile it cannot work. So a run builds with the compiler the shim stands for, under the
# developer directory (`xcode-select -p`, readable and executable in every run), with the SDK
# given explicitly.

XCRUN_SHIMS = {"c++": "clang++", "g++": "clang++", "clang++": "clang++", "cc": "clang",
               "gcc": "clang", "clang": "clang"}


@functools.cache
def developer_dir() -> str | None:
    """The active developer directory (Xcode's or the Command Line Tools'), None off macOS or
    without one."""
    if sys.platform != "darwin":
        return None
    try:
        r = subprocess.run(["/usr/bin/xcode-select", "-p"], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = r.stdout.strip()
    return os.path.realpath(path) if r.returncode == 0 and os.path.isdir(path) else None


def real_compiler(exe: str, dev: str | None) -> str:
    """The compiler a /usr/bin xcrun shim (`g++`, `clang++`, `cc`...) runs, else `exe`."""
    name = os.path.basename(exe)
    if dev is None or name not in XCRUN_SHIMS or os.path.dirname(
            os.path.realpath(exe)) != "/usr/bin":
        return exe
    for d in (f"{dev}/Toolchains/XcodeDefault.xctoolchain/usr/bin", f"{dev}/usr/bin"):
        if os.access(f"{d}/{XCRUN_SHIMS[name]}", os.X_OK):
            return f"{d}/{XCRUN_SHIMS[name]}"
    return exe


def sdk_path(dev: str) -> str | None:
    for sdk in (f"{dev}/SDKs/MacOSX.sdk",
                f"{dev}/Platforms/MacOSX.platform/Developer/SDKs/MacOSX.sdk"):
        if os.path.isdir(sdk):
            return os.path.realpath(sdk)
    return None


def mac_build(language: str, compiler: str, dev: str | None
              ) -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(compiler, extra flags, build environment) for a build under the profile: for C++ the
    compiler a shim stands for with `-isysroot SDK`; for Rust, that clang as rustc's linker and
    SDKROOT set (rustc asks xcrun for it otherwise). A compiler outside /usr/bin (a Homebrew
    keg) is kept as it is; without a developer directory nothing changes."""
    if dev is None:
        return compiler, (), ()
    sdk = sdk_path(dev)
    env = (("SDKROOT", sdk),) if sdk else ()
    if language == "cpp":
        return real_compiler(compiler, dev), ("-isysroot", sdk) if sdk else (), env
    clang = real_compiler("/usr/bin/clang", dev)
    return compiler, ("-C", f"linker={clang}") if clang != "/usr/bin/clang" else (), env


def processes_of(uid: int) -> int:
    """How many processes `uid` runs (RLIMIT_NPROC counts them all; the launcher cannot run
    `ps` under the profile, so the trusted side counts)."""
    try:
        out = subprocess.run(["/bin/ps", "-A", "-o", "uid="], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for x in out.split() if x == str(uid))
