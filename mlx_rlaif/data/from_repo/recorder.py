"""The call recorder that runs inside the sandbox, in the repository's own test process.

Standard library only: `mlx-rlaif data from-repo` writes this file into the sandbox's box as
`sitecustomize.py` and puts the box first on PYTHONPATH, so every Python process of the test
command (pytest, unittest, a worker it starts) loads it at start-up. It installs a `sys.settrace`
hook (and `threading.settrace`) that looks at each call once, and keeps a local tracer (no line
events: `f_trace_lines` off) only on the repository's module-level functions outside its tests.
For each such function it records, up to MLX_RLAIF_RECORD_MAX distinct calls:

- the arguments (positional, then keyword-only and `**kwargs` as keywords) and the return value,
  or the exception type when the call ended by an exception (a return whose last instruction is
  not a return opcode), each as a Python literal when the value is plain data whose `repr`
  reads back (None, bool, int, finite float, str, list, tuple, non-empty set, dict);
- the calls it could not keep and why (not plain data, over the bound);
- the repository's test functions that called it (module-level `test*` functions without
  parameters, found by walking up the stack to the first frame of a test file).

At exit each process writes one JSON file `record-<pid>.json` into MLX_RLAIF_RECORD_OUT (the box).
Generators, coroutines, nested functions and methods are skipped (counted as such).

What is not covered: values passed in by reference and changed by the call (the arguments are
rendered when the call starts, the result when it ends: in-place changes are not checked),
processes that end by `os._exit` (their record is lost), code run before this file loads.
"""

import ast
import atexit
import dis
import json
import math
import os
import sys
import threading

REPO = os.path.realpath(os.environ.get("MLX_RLAIF_RECORD_REPO", "/nonexistent")) + os.sep
OUT = os.environ.get("MLX_RLAIF_RECORD_OUT", "")
MAX = int(os.environ.get("MLX_RLAIF_RECORD_MAX", "20"))
MAX_REPR = 2000  # longest literal kept
RETURNS = {dis.opmap[n] for n in ("RETURN_VALUE", "RETURN_CONST") if n in dis.opmap}
SKIP_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
TEST_DIRS = {"tests", "test", "testing"}

kinds = {}  # code object -> "target" | "test" | None (decided once per code object)
functions = {}  # (file, name) -> record
skipped = {}  # reason -> count of functions


def is_test_file(path, root=None):
    """Whether `path` (real, under the repository `root`, which ends with a separator) is test
    code: test_*.py, *_test.py, conftest.py, or under a tests/test/testing directory."""
    root = REPO if root is None else root
    rel = path[len(root):] if path.startswith(root) else path
    parts = rel.split(os.sep)
    base = parts[-1]
    return (base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"
            or any(p in TEST_DIRS for p in parts[:-1]))


def module_root(path, module):
    """The sys.path entry `module` (a dotted name) was imported from, else None."""
    stem = path[:-3] if path.endswith(".py") else path
    parts = stem.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    names = module.split(".")
    if parts[-len(names):] != names:
        return None
    return os.sep.join(parts[:-len(names)]) or os.sep


def kind_of(frame):
    code = frame.f_code
    kind = kinds.get(code, 0)
    if kind != 0:
        return kind
    kind = None
    path = os.path.realpath(code.co_filename) if code.co_filename.endswith(".py") else ""
    if path.startswith(REPO):
        if is_test_file(path):
            kind = "test"
        elif getattr(code, "co_qualname", code.co_name) != code.co_name or code.co_name not in \
                frame.f_globals:
            skipped["method or nested function"] = skipped.get("method or nested function", 0) + 1
        elif code.co_flags & SKIP_FLAGS:
            skipped["generator or coroutine"] = skipped.get("generator or coroutine", 0) + 1
        elif unwrap_code(frame.f_globals.get(code.co_name)) is not code:
            skipped["not the module's own name"] = skipped.get("not the module's own name", 0) + 1
        else:
            kind = "target"
    kinds[code] = kind
    return kind


def unwrap_code(fn):
    for _ in range(10):
        if getattr(fn, "__code__", None) is not None:
            return fn.__code__
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return None
    return None


def plain(x, depth=0):
    if depth > 20:
        return False
    t = type(x)
    if x is None or t in (bool, int, str):
        return True
    if t is float:
        return math.isfinite(x)
    if t in (list, tuple):
        return all(plain(v, depth + 1) for v in x)
    if t is set:
        return len(x) > 0 and all(plain(v, depth + 1) for v in x)
    if t is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
    return False


def literal(x):
    """`repr(x)` when it reads back as an equal value, else None."""
    if not plain(x):
        return None
    text = repr(x)
    if len(text) > MAX_REPR:
        return None
    try:
        if ast.literal_eval(text) != x:
            return None
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return None
    return text


def arguments(frame):
    code, loc = frame.f_code, frame.f_locals
    n = code.co_argcount
    names = code.co_varnames
    args = [loc[v] for v in names[:n]]
    kwargs = {v: loc[v] for v in names[n:n + code.co_kwonlyargcount]}
    k = n + code.co_kwonlyargcount
    if code.co_flags & 0x04:  # *args
        args.extend(loc[names[k]])
        k += 1
    if code.co_flags & 0x08:  # **kwargs
        kwargs.update(loc[names[k]])
    return args, kwargs


def record_for(frame):
    code = frame.f_code
    key = (code.co_filename, code.co_name)
    rec = functions.get(key)
    if rec is None:
        path = os.path.realpath(code.co_filename)
        module = frame.f_globals.get("__name__", "")
        rec = functions[key] = {
            "file": path[len(REPO):], "name": code.co_name, "module": module,
            "root": module_root(path, module), "line": code.co_firstlineno, "calls": [],
            "seen": 0, "dropped": {}, "tests": []}
        rec["_keys"] = set()
        rec["_tests"] = set()
    return rec


def calling_test(frame):
    """(module, root, name) of the test function this call came from, or None."""
    f, depth = frame.f_back, 0
    while f is not None and depth < 200:
        if kind_of(f) == "test":
            code = f.f_code
            name = code.co_name
            ok = (name.startswith("test") and code.co_argcount == 0
                  and not code.co_kwonlyargcount and not code.co_flags & 0x0C
                  and getattr(code, "co_qualname", name) == name
                  and unwrap_code(f.f_globals.get(name)) is code)
            if not ok:
                return None
            module = f.f_globals.get("__name__", "")
            path = os.path.realpath(code.co_filename)
            return module, module_root(path, module), name, path[len(REPO):]
        f, depth = f.f_back, depth + 1
    return None


def drop(rec, why):
    rec["dropped"][why] = rec["dropped"].get(why, 0) + 1


def tracer(frame, event, arg):
    if event != "call" or kind_of(frame) != "target":
        return None
    rec = record_for(frame)
    rec["seen"] += 1
    test = calling_test(frame)
    if test is not None and test[:3] not in rec["_tests"] and len(rec["_tests"]) < 50:
        rec["_tests"].add(test[:3])
        rec["tests"].append(list(test))
    if len(rec["calls"]) >= MAX:
        drop(rec, "over the bound")
        return None
    try:
        args, kwargs = arguments(frame)
        a, k = literal(tuple(args)), literal(kwargs)
    except Exception:  # noqa: BLE001 - a repr that raises: not recordable
        a = k = None
    if a is None or k is None:
        drop(rec, "arguments are not plain data")
        return None
    frame.f_trace_lines = False
    state = {"exc": None}

    def local(fr, ev, value):
        if ev == "exception":
            state["exc"] = value[0].__name__ if isinstance(value, tuple) else None
        elif ev == "return":
            finish(rec, fr, a, k, value, state["exc"])
        return local

    return local


def finish(rec, frame, args, kwargs, value, exc):
    returned = frame.f_code.co_code[frame.f_lasti] in RETURNS
    if returned:
        try:
            out = literal(value)
        except Exception:  # noqa: BLE001
            out = None
        if out is None:
            drop(rec, "return value is not plain data")
            return
        call = {"args": args, "kwargs": kwargs, "returns": out}
    elif exc:
        call = {"args": args, "kwargs": kwargs, "raises": exc}
    else:
        drop(rec, "ended without a value or an exception")
        return
    key = (args, kwargs)
    if key in rec["_keys"]:
        return
    rec["_keys"].add(key)
    rec["calls"].append(call)


def write():
    sys.settrace(None)
    threading.settrace(None)
    if not OUT:
        return
    out = []
    for rec in functions.values():
        out.append({k: v for k, v in rec.items() if not k.startswith("_")})
    data = {"functions": out, "skipped": skipped, "pid": os.getpid(),
            "python": sys.version.split()[0]}
    try:
        with open(os.path.join(OUT, f"record-{os.getpid()}.json"), "w") as f:
            json.dump(data, f)
    except OSError:
        pass


if OUT:
    atexit.register(write)
    threading.settrace(tracer)
    sys.settrace(tracer)
