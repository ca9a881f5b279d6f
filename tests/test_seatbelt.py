"""The macOS seatbelt sandbox, checked where CI runs (Linux): the rendered profile against a
committed golden file, its rules through a small parser of Apple's profile language (balanced,
`(deny default)` first, only allowed operations, every allow filtered, the Mach and sysctl
allow-lists, writes only to the box, every parameter defined, no literal over 1,025 bytes), and
the command, parameters and environment the launcher gets (the platform query stood in).

Not covered here: whether macOS enforces it as read; `mlx-rlaif doctor` on a Mac runs the hostile
self-test against it (tests/test_selftest.py runs the same self-test here in bwrap and process
mode). To accept a deliberate change of the profile: `python3 tests/test_seatbelt.py --update`.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_rlaif.sandbox import Limits, Sandbox, SandboxError, box, modes, seatbelt

GOLDEN = Path(__file__).with_name("data") / "seatbelt.sb"
N_EXEC = 3  # the golden file's: interpreter, a toolchain, its sysroot

ALLOWED_OPS = {"process-fork", "process-exec", "signal", "process-info*", "file-read-metadata",
               "file-read*", "file-map-executable", "file-write*", "file-write-data",
               "mach-lookup", "sysctl-read", "ipc-posix-sem", "system-socket"}
# no filter exists for a fork; path resolution stats every component of every path
UNFILTERED = {"process-fork", "file-read-metadata"}
MACH = {"com.apple.system.opendirectoryd.libinfo"}
SYSCTL_PREFIXES = {"hw.optional.", "hw.perflevel"}
KERN_SYSCTLS = {  # hardware (hw.*) and these: the OS's version and its fixed limits (uname(3)
    # reads kern.hostname too: os.uname and the platform module fail without it)
    "kern.argmax", "kern.hostname", "kern.maxfilesperproc", "kern.osproductversion",
    "kern.osrelease", "kern.ostype", "kern.osvariant_status", "kern.osversion",
    "kern.secure_kernel", "kern.usrstack64", "kern.version", "sysctl.proc_cputype",
    "sysctl.proc_translated"}
SECRET_PLACES = ("/Users/someone/.ssh/id_ed25519", "/Volumes/disk/x", "/Users/Shared/x",
                 "/private/var/folders/ab/cd/T/mlx-rlaif-box-other/task.json",
                 "/private/tmp/x", "/private/etc/master.passwd", "/Library/Keychains/x")


# --- a reader of the profile language: strings, symbols, lists, `;` comments ----------------


def parse(text: str) -> list:
    """The top-level forms of `text`; raises ValueError on unbalanced parentheses or an
    unterminated string. Strings come back as ("str", value)."""
    stack: list[list] = [[]]
    i = 0
    while i < len(text):
        c = text[i]
        if c == ";":
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        elif c == "(":
            stack.append([])
            i += 1
        elif c == ")":
            if len(stack) == 1:
                raise ValueError(f"unbalanced ')' at {i}")
            done = stack.pop()
            stack[-1].append(done)
            i += 1
        elif c == '"':
            j, value = i + 1, []
            while j < len(text) and text[j] != '"':
                if text[j] == "\\":
                    j += 1
                value.append(text[j])
                j += 1
            if j >= len(text):
                raise ValueError("unterminated string")
            stack[-1].append(("str", "".join(value)))
            i = j + 1
        elif c.isspace():
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in '();"':
                j += 1
            stack[-1].append(text[i:j])
            i = j
    if len(stack) != 1:
        raise ValueError("unbalanced '('")
    return stack[0]


def strings(form) -> list[str]:
    if isinstance(form, tuple):
        return [form[1]]
    if isinstance(form, list):
        return [s for x in form for s in strings(x)]
    return []


def params_used(form) -> set[str]:
    if isinstance(form, list):
        if form[:1] == ["param"]:
            return {form[1][1]}
        return {p for x in form for p in params_used(x)}
    return set()


def rule(form: list) -> tuple[str, list[str], list]:
    """(action, operations, filters) of an allow or deny form."""
    ops = [x for x in form[1:] if isinstance(x, str)]
    return form[0], ops, [x for x in form[1:] if isinstance(x, list)]


def path_of(f: list) -> tuple[str, str]:
    """(kind, path) of a path filter: a literal path, or a parameter's value."""
    arg = f[1]
    return f[0], arg[1] if isinstance(arg, tuple) else "<" + arg[1][1] + ">"


def covers(kind: str, path: str, target: str) -> bool:
    if kind == "literal":
        return path == target
    return target == path or target.startswith(path.rstrip("/") + "/")


# --- the profile's text and rules ----------------------------------------------------------


def test_the_profile_matches_the_golden_file() -> None:
    assert seatbelt.profile(N_EXEC) == GOLDEN.read_text(), (
        "the seatbelt profile changed: review it, then `python3 tests/test_seatbelt.py --update`")


def test_the_parser_refuses_unbalanced_text() -> None:
    for bad in ("(allow (x)", "(allow x))", '(allow (literal "x))'):
        with pytest.raises(ValueError):
            parse(bad)


def test_rules_deny_by_default_and_allow_only_what_runs_need() -> None:
    forms = parse(seatbelt.profile(N_EXEC))
    assert forms[0] == ["version", "1"] and forms[1] == ["deny", "default"]
    rules = [rule(f) for f in forms[2:]]
    assert all(action in ("allow", "deny") for action, _, _ in rules)
    # over every allow: no hard links, no setuid bits (the last matching rule wins)
    assert [(a, ops) for a, ops, _ in rules[-2:]] == [("deny", ["file-link"]),
                                                      ("deny", ["file-write-setugid"])]
    assert all(a == "allow" for a, _, _ in rules[:-2])
    for _, ops, filters in rules[:-2]:
        assert set(ops) <= ALLOWED_OPS, ops
        assert filters or set(ops) <= UNFILTERED, f"{ops} allowed without a filter"
    for forbidden in ("network*", "network-outbound", "network-bind", "appleevent-send",
                      "lsopen", "iokit-open", "sysctl-write", "pseudo-tty", "ipc-posix-shm*",
                      "file-link", "default"):
        assert forbidden not in ALLOWED_OPS


def test_mach_sysctl_and_process_rules_are_allow_lists() -> None:
    rules = [rule(f) for f in parse(seatbelt.profile(N_EXEC))[2:]]
    by_op = {op: filters for _, ops, filters in rules for op in ops}
    assert {f[0] for f in by_op["mach-lookup"]} == {"global-name"}
    assert {f[1][1] for f in by_op["mach-lookup"]} == MACH
    for f in by_op["sysctl-read"]:
        name = f[1][1]
        assert f[0] in ("sysctl-name", "sysctl-name-prefix"), f
        assert not name.startswith("kern.proc") and not "kern.proc".startswith(name), name
        assert name.startswith("hw.") or name in KERN_SYSCTLS, name
        if f[0] == "sysctl-name-prefix":
            assert name in SYSCTL_PREFIXES
    assert "kern.procargs2" not in strings(by_op["sysctl-read"])
    for op in ("signal", "process-info*"):
        assert by_op[op] == [["target", "same-sandbox"]]
    assert by_op["ipc-posix-sem"] == [["ipc-posix-name-prefix", ("str", "/mp-")]]
    assert by_op["system-socket"] == [["socket-domain", "AF_UNIX"]]  # no bind, no connect


def test_writes_only_to_the_box_and_reads_nowhere_private() -> None:
    rules = [rule(f) for f in parse(seatbelt.profile(N_EXEC))[2:]]
    for action, ops, filters in rules:
        if action != "allow":
            continue
        paths = [path_of(f) for f in filters if f[0] in ("subpath", "literal")]
        assert len(paths) == len(filters) or not any(o.startswith("file") for o in ops), filters
        if any(o.startswith("file-write") for o in ops):
            assert paths in ([("subpath", "<BOX>")], [("literal", "/dev/null")]), paths
        if any(o.startswith(("file-read", "file-map", "process-exec")) for o in ops):
            for kind, path in paths:
                assert path.startswith(("/", "<")), path
                for place in SECRET_PLACES:
                    assert not covers(kind, path, place), f"{kind} {path} opens {place}"
        if "process-exec" in ops:  # the interpreter, toolchains and box: no system binaries
            assert all(p.startswith("<") for _, p in paths), paths


def test_every_parameter_is_defined_and_every_literal_fits() -> None:
    text = seatbelt.profile(N_EXEC)
    values = seatbelt.params("/tmp", ["/usr/lib", "/opt", "/srv"])
    assert params_used(parse(text)) == set(values) == {"BOX", "PROG", "EXEC_0", "EXEC_1",
                                                       "EXEC_2"}
    assert all(len(s.encode()) <= 1025 for s in strings(parse(text)))


def test_the_program_directory_is_read_and_run_only(tmp_path: Path) -> None:
    """PROG (runs.py's program directory, where a stdin/stdout program's runs execute it) is in
    the exec and read rules and in no write rule; without one it is the box itself."""
    rules = [rule(f) for f in parse(seatbelt.profile(N_EXEC))[2:]]
    prog = ["subpath", ["param", ("str", "PROG")]]
    where = {op for action, ops, filters in rules if prog in filters for op in ops}
    assert where == {"process-exec", "file-read*", "file-map-executable"}, where
    assert all(action == "allow" for action, _, filters in rules if prog in filters)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "box")
    assert seatbelt.params(link, [])["PROG"] == str(tmp_path / "box")
    assert seatbelt.params(link, [], link)["PROG"] == os.path.realpath(link)


def test_paths_never_change_the_profile(tmp_path: Path) -> None:
    """A path holding `"`, `)` or a newline is a parameter's value, never profile text."""
    evil = tmp_path / 'x") (allow default) ;\n("'
    evil.mkdir()
    values = seatbelt.params(evil, [str(evil)])
    cmd = seatbelt.command(seatbelt.profile(1), values, ["/bin/true"])
    assert cmd[2] == seatbelt.profile(1) and "allow default" not in cmd[2]
    assert f"BOX={evil}" in cmd and f"EXEC_0={evil}" in cmd


# --- the launcher's command, parameters and environment under seatbelt ----------------------


@pytest.fixture()
def mac(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This machine, standing in for a Mac whose sandbox-exec works; the temporary directory
    reached through a symlink (as macOS's /var -> /private/var)."""
    monkeypatch.setattr(modes, "host_platform", lambda: "darwin")
    monkeypatch.setattr(modes, "seatbelt_problem", lambda: None)
    real = tmp_path / "private" / "var"
    real.mkdir(parents=True)
    (tmp_path / "var").symlink_to(real)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "var"))
    return real


def started(monkeypatch: pytest.MonkeyPatch, sb: Sandbox) -> dict:
    """What Sandbox.start hands Popen (the command is not run here)."""
    seen: dict = {}

    def popen(cmd, **kw):
        seen.update(kw, cmd=cmd)
        raise OSError("recorded, not run")

    monkeypatch.setattr(box.subprocess, "Popen", popen)
    with sb.box() as b, pytest.raises(SandboxError, match="recorded"):
        seen["box"] = b
        sb.start(b, [b.write("main.py", "print(1)"), "arg"], Limits(), python_file=True)
    return seen


def test_seatbelt_command_parameters_and_environment(mac: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("SSH_AUTH_SOCK", "/tmp/agent"), ("DYLD_INSERT_LIBRARIES", "/x.dylib"),
                        ("PYTHONPATH", "/evil"), ("OPENAI_API_KEY", "sk-canary")):
        monkeypatch.setenv(name, value)
    sb = Sandbox("seatbelt", slots=1)
    assert sb.mode == "seatbelt" and not sb.root  # never a uid of its own under seatbelt
    seen = started(monkeypatch, sb)
    cmd = seen["cmd"]
    assert cmd[:3] == ["/usr/bin/sandbox-exec", "-p", sb._profile]
    assert sb._profile == seatbelt.profile(len(sb._exec_dirs))
    defines = {}
    i = 3
    while cmd[i] == "-D":
        name, _, value = cmd[i + 1].partition("=")
        defines[name] = value
        i += 2
    assert params_used(parse(sb._profile)) == set(defines)
    for value in defines.values():  # absolute, canonical
        assert os.path.isabs(value) and value == os.path.realpath(value), value
    assert defines["BOX"] == os.path.realpath(seen["box"].host)
    assert defines["BOX"].startswith(str(mac)) and "/var/" not in defines["BOX"].replace(
        str(mac), "")
    assert defines["EXEC_0"] == os.path.realpath(sys.base_prefix)
    python = cmd[i:i + 4]
    assert python == [os.path.realpath(sys.executable), "-I", "-S", "-c"]
    assert cmd[i + 4] == box.BOOT and "'processes_now':" in cmd[i + 5]
    # the same code (marshal's bytes may differ: its reference flags follow refcounts)
    assert marshal.loads(bytes.fromhex(cmd[i + 6])) == marshal.loads(bytes.fromhex(
        box.precompiled(sys.executable, box.LAUNCHER, "launcher.py")))
    assert len(cmd) == i + 7
    env = seen["env"]
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL"}
    assert env["HOME"] == env["TMPDIR"] == str(seen["box"].host)
    assert not any(v in str(env) for v in ("agent", "dylib", "evil", "canary"))
    assert seen["start_new_session"] is True and seen["stdin"] == subprocess.DEVNULL
    assert seen["close_fds"] is True


def test_a_profile_that_fails_fails_the_run_and_nothing_runs_unsandboxed(
        mac: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """sandbox-exec refusing (here: a stand-in that exits 1, as it does on a profile error)
    is our failure, SandboxError; the program is never run another way."""
    monkeypatch.setattr(seatbelt, "SANDBOX_EXEC", "/bin/false")
    sb = Sandbox("seatbelt", slots=1)
    marker = tmp_path / "ran-unsandboxed"
    with sb.box() as b:
        path = b.write("main.py", f"open({str(marker)!r}, 'w').write('x')\n")
        with pytest.raises(SandboxError, match="did not start"):
            sb.run(b, [path], Limits(timeout_s=20), python_file=True)
    assert not marker.exists()


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    GOLDEN.write_text(seatbelt.profile(N_EXEC))
    print(f"wrote {GOLDEN}")


# --- toolchains: the real compilers, not the xcrun shims -----------------------------------


@pytest.fixture()
def developer(tmp_path: Path) -> Path:
    """A Command Line Tools layout: usr/bin/clang, clang++ and SDKs/MacOSX.sdk."""
    dev = tmp_path / "CommandLineTools"
    (dev / "usr" / "bin").mkdir(parents=True)
    for name in ("clang", "clang++"):
        (dev / "usr" / "bin" / name).write_text("#!/bin/sh\n")
        (dev / "usr" / "bin" / name).chmod(0o755)
    (dev / "SDKs" / "MacOSX.sdk").mkdir(parents=True)
    return dev


def test_builds_use_the_real_compiler_and_the_sdk(developer: Path) -> None:
    sdk = str(developer / "SDKs" / "MacOSX.sdk")
    shim = "/usr/bin/" + next(n for n in ("g++", "c++", "cc", "gcc") if os.path.exists(
        f"/usr/bin/{n}"))
    compiler, flags, env = seatbelt.mac_build("cpp", shim, str(developer))
    assert compiler.startswith(str(developer / "usr" / "bin" / "clang"))
    assert flags == ("-isysroot", sdk) and env == (("SDKROOT", sdk),)
    rustc = "/home/u/.rustup/toolchains/stable/bin/rustc"
    assert seatbelt.mac_build("rust", rustc, str(developer)) == (
        rustc, ("-C", f"linker={developer}/usr/bin/clang"), (("SDKROOT", sdk),))
    keg = "/opt/homebrew/Cellar/gcc/14.2.0/bin/g++-14"  # a Homebrew g++: kept as configured
    assert seatbelt.mac_build("cpp", keg, str(developer))[0] == keg
    assert seatbelt.mac_build("cpp", shim, None) == (shim, (), ())  # off macOS: unchanged


def test_the_developer_directory_is_a_parameter(mac: Path, developer: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seatbelt, "developer_dir", lambda: str(developer))
    sb = Sandbox("seatbelt", slots=1)
    defines = started(monkeypatch, sb)["cmd"]
    assert f"EXEC_{len(sb._exec_dirs) - 1}={developer}" in defines


# --- one sandbox start per completion under seatbelt (runs.py), and the fallback ----------
# sandbox-exec stood in by a script that drops the profile and runs the command: the launcher's
# portable path, the stream socket and the parameters run here as they would on a Mac (not the
# profile's enforcement: `mlx-rlaif doctor` on a Mac).

STAND_IN = """#!/bin/sh
[ "$1" = -p ] && shift 2
while [ "$1" = -D ]; do shift 2; done
{refuse}
exec "$@"
"""


@pytest.fixture()
def stand_in(mac: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A seatbelt Sandbox whose sandbox-exec is a stand-in (`refuse`: a shell line run first);
    the starts it made (their -D parameters and spec) are recorded."""
    from mlx_rlaif.sandbox import runs

    monkeypatch.setattr(runs, "_REFUSED", [])
    starts: list[dict] = []
    popen = box.subprocess.Popen

    def record(cmd, **kw):
        if cmd[0] == seatbelt.SANDBOX_EXEC:
            starts.append({"D": dict(cmd[i + 1].split("=", 1) for i, x in enumerate(cmd)
                                     if x == "-D"), "runs": "'runs':" in " ".join(cmd)})
        return popen(cmd, **kw)

    monkeypatch.setattr(box.subprocess, "Popen", record)

    def make(refuse: str = "") -> tuple[Sandbox, list[dict]]:
        exe = tmp_path / "sandbox-exec"
        exe.write_text(STAND_IN.format(refuse=refuse))
        exe.chmod(0o755)
        monkeypatch.setattr(seatbelt, "SANDBOX_EXEC", str(exe))
        return Sandbox("seatbelt", slots=1), starts

    return make


def _each(sb: Sandbox, n: int) -> list:
    from mlx_rlaif.sandbox.runs import run_each

    code = "n = int(input())\nprint(n * n)\n"
    with sb.box() as b:
        b.write("main.py", code)
        return list(run_each(sb, b, "main.py", [f"{i}\n".encode() for i in range(n)],
                             Limits(timeout_s=20), python_file=True))


def test_seatbelt_serves_every_test_from_one_start(stand_in) -> None:
    from mlx_rlaif.sandbox import runs

    sb, starts = stand_in()
    assert runs.portable(sb) and runs.reuses_sandbox(sb)
    out = _each(sb, 5)
    assert [r.stdout for r in out] == [f"{i * i}\n".encode() for i in range(5)]
    assert [s["runs"] for s in starts] == [True]  # one sandbox start for the five tests
    prog, box_dir = starts[0]["D"]["PROG"], starts[0]["D"]["BOX"]
    assert prog != box_dir and os.path.basename(prog).startswith("mlx-rlaif-prog-")
    assert prog == os.path.realpath(prog) and not runs._REFUSED


@pytest.mark.parametrize("how", ["start", "files"])
def test_seatbelt_falls_back_to_a_sandbox_per_test_once(
        stand_in, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        how: str) -> None:
    """The session cannot start (`start`: sandbox-exec refuses it) or the run's fds do not
    arrive (`files`: the launcher answers `E ...`): the test runs in a sandbox of its own, one
    warning, and from then on every test does; scoring is not broken."""
    from mlx_rlaif.sandbox import runs

    sb, starts = stand_in(refuse="""case "$*" in *"'runs':"*) exit 1;; esac"""
                          if how == "start" else "")
    if how == "files":
        monkeypatch.setattr(runs.Session, "_send", lambda self, files: self.sock.send(b"T"))
    with caplog.at_level("WARNING", logger="mlx_rlaif.sandbox.runs"):
        out = _each(sb, 4)
        assert [r.stdout for r in out] == [f"{i * i}\n".encode() for i in range(4)]
        assert [s["runs"] for s in starts] == [True, False, False, False, False]
        assert not runs.reuses_sandbox(sb)
        again = _each(sb, 2)
    assert [r.stdout for r in again] == [b"0\n", b"1\n"]
    assert [s["runs"] for s in starts[5:]] == [False, False]  # no session tried again
    warned = [r.getMessage() for r in caplog.records if "could not serve" in r.getMessage()]
    assert len(warned) == 1, warned
    assert ("did not start" if how == "start" else "did not arrive") in warned[0]
    # only the portable path is given up: Linux's own (pidfd) path is unaffected
    linux = Sandbox("process", slots=1)
    assert runs.portable(linux) == (not runs._pidfds()) and (
        runs.reuses_sandbox(linux) == runs._pidfds())


def test_a_program_error_under_seatbelt_is_not_a_refused_session(stand_in) -> None:
    from mlx_rlaif.sandbox import runs

    sb, starts = stand_in()
    with sb.box() as b:
        b.write("prog", b"\x7fELF not really", 0o755)
        with pytest.raises(SandboxError, match="exec"):
            list(runs.run_each(sb, b, "prog", [b"", b""], Limits(timeout_s=20)))
    assert not runs._REFUSED and runs.reuses_sandbox(sb)
