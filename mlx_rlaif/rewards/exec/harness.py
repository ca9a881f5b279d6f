"""The code the exec reward runs inside its sandboxes, and the wire format between them.

Standard library only: the launcher runs this file by path in the sandbox's interpreter.

    harness.py serve SOLUTION ENTRY REQ_FD RESP_FD
        The student's "function server" (runs with the student's code, untrusted after start):
        imports SOLUTION as a module named `solution`, then answers each call request on REQ_FD
        with one JSON line on RESP_FD. ENTRY is a function name, or `Class.method` (called on one
        instance of Class, as LeetCode calls `Solution`).
    harness.py check TASK_JSON REQ_FD RESP_FD VERDICT_FD
        The trusted test side of a HumanEval task, in a sandbox of its own: runs the task's
        prompt and instrumented `check` with `candidate` a proxy that forwards each call to the
        student's server, and writes one JSON verdict line per test unit to VERDICT_FD.

Wire format. A request is one line, a Python literal `(id, args, kwargs)` written by trusted code
(the checker or the trainer) and read by the student with `eval` and no builtins. A response is
one JSON line `[id, true, VALUE]` or `[id, false, "ExceptionType", "message"]`, decoded by trusted
code with `decode_response`, which accepts only plain data: null, bool, numbers, strings, lists,
and the tagged objects `{"__tuple__": [...]}`, `{"__set__": [...]}`, `{"__dict__": [[k, v], ...]}`.
So whatever the student sends, the verdict compares plain values: an object whose `__eq__` always
returns True cannot cross, and neither can exit codes, printed markers or patched modules.
"""

import os
import sys

TAGS = ("__tuple__", "__set__", "__dict__")
MAX_LINE = 16 << 20  # longest response line accepted (bytes)


# --- trusted side: requests and responses -------------------------------------------------------


class ProtocolError(Exception):
    """The student's process sent something that is not a valid response."""


def plain(x, depth=0):
    """Whether `x` is plain data that a request may carry (checked before sending)."""
    if depth > 100:
        return False
    if x is None or type(x) in (bool, int, float, str):
        return True
    if type(x) in (list, tuple, set, frozenset):
        return all(plain(v, depth + 1) for v in x)
    if type(x) is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
    return False


def encode_request(call_id, args, kwargs):
    """One request line. Raises TypeError when an argument is not plain data."""
    if not (plain(list(args)) and plain(kwargs)):
        raise TypeError("arguments must be plain data (None, bool, int, float, str, list, tuple, "
                        "dict, set)")
    return (repr((call_id, tuple(args), dict(kwargs))) + "\n").encode()


def _untag(obj):
    if len(obj) != 1:
        raise ValueError("untagged JSON object")
    ((tag, v),) = obj.items()
    if type(v) is not list:
        raise ValueError(f"{tag} needs a list")
    try:
        if tag == "__tuple__":
            return tuple(v)
        if tag == "__set__":
            return set(v)
        if tag == "__dict__" and all(type(p) is list and len(p) == 2 for p in v):
            return {p[0]: p[1] for p in v}
    except TypeError as e:  # unhashable set item or dict key
        raise ValueError(str(e)) from None
    raise ValueError(f"unknown tag {tag!r}")


def decode_response(line, call_id):
    """(ok, value) for ok responses, (False, (type_name, message)) for errors.

    Raises ProtocolError for anything else (bad JSON, wrong id, untagged objects, too long)."""
    import json

    if len(line) > MAX_LINE:
        raise ProtocolError(f"response longer than {MAX_LINE} bytes")
    try:
        msg = json.loads(line, object_hook=_untag)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"unreadable response: {str(e)[:200]}") from None
    if type(msg) is not list or len(msg) < 3 or msg[0] != call_id or type(msg[1]) is not bool:
        raise ProtocolError("malformed response")
    if msg[1]:
        return True, msg[2]
    if len(msg) != 4 or type(msg[2]) is not str or type(msg[3]) is not str:
        raise ProtocolError("malformed error response")
    return False, (msg[2][:100], msg[3][:300])


# --- untrusted side: the student's function server ----------------------------------------------


def _enc(x, depth=0):
    """JSON text for a return value, without importing json (one interpreter start per run)."""
    from _json import encode_basestring_ascii as quote

    if depth > 100:
        raise ValueError("value nested too deeply")
    if x is None:
        return "null"
    if x is True or x is False:
        return "true" if x else "false"
    if isinstance(x, int):
        return int.__repr__(x)
    if isinstance(x, float):
        r = float.__repr__(x)
        return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(r, r)
    if isinstance(x, str):
        return quote(str.__str__(x))
    if isinstance(x, list):
        return "[" + ",".join(_enc(v, depth + 1) for v in x) + "]"
    if isinstance(x, tuple):
        return '{"__tuple__":[' + ",".join(_enc(v, depth + 1) for v in x) + "]}"
    if isinstance(x, (set, frozenset)):
        return '{"__set__":[' + ",".join(_enc(v, depth + 1) for v in x) + "]}"
    if isinstance(x, dict):
        pairs = ("[" + _enc(k, depth + 1) + "," + _enc(v, depth + 1) + "]" for k, v in x.items())
        return '{"__dict__":[' + ",".join(pairs) + "]}"
    raise TypeError(f"cannot return a {type(x).__name__} (only plain data crosses the sandbox)")


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _entry(ns, entry):
    """The function `entry` names in the solution: a global, or `Class.method` bound to one
    instance of the class (LeetCode's `Solution`), made at the first call."""
    head, _, method = entry.partition(".")
    obj = ns.get(head)
    if method:
        if not isinstance(obj, type):
            raise NameError(f"the solution does not define class {head}")
        obj = getattr(obj(), method, None)
    if not callable(obj):
        raise NameError(f"the solution does not define {entry}()")
    return obj


def serve(solution, entry, req_fd, resp_fd):
    import builtins
    from _json import encode_basestring_ascii as quote

    ns = {"__name__": "solution", "__builtins__": builtins}
    failed = None
    try:
        with open(solution, encoding="utf-8") as f:
            exec(compile(f.read(), "solution.py", "exec"), ns)
    except Exception as e:  # SystemExit ends the process: every call then fails
        failed = e
    names = {"__builtins__": {}, "inf": float("inf"), "nan": float("nan"), "set": set,
             "frozenset": frozenset}
    requests = os.fdopen(req_fd, "rb")
    sys.audit("mlx_rlaif.serving")  # to the audit hook, if any: the solution loaded (audit.py)
    fn = None
    for line in requests:
        call_id, args, kwargs = eval(line, names)
        try:
            if failed is not None:
                raise failed
            fn = fn or _entry(ns, entry)
            out = f"[{call_id},true,{_enc(fn(*args, **kwargs))}]\n"
        except Exception as e:
            out = f"[{call_id},false,{quote(type(e).__name__)},{quote(str(e)[:300])}]\n"
        _write_all(resp_fd, out.encode())


# --- trusted side: the HumanEval checker ---------------------------------------------------------


class StudentError(Exception):
    """The student's function raised; subclasses also derive from the builtin type it named."""


class StudentGone(Exception):
    """The student's process ended (exit, crash, kill) or broke the protocol."""


def _student_error(type_name, message):
    import builtins

    base = getattr(builtins, type_name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)) or base is Exception:
        return StudentError(f"{type_name}: {message}")
    cls = type(f"Student{type_name}", (StudentError, base), {})
    try:
        return cls(f"{type_name}: {message}")
    except TypeError:  # builtins with required constructor arguments
        return StudentError(f"{type_name}: {message}")


class Candidate:
    """Stands for the student's function in `check(candidate)`: each call crosses to the
    student's process and back as plain data."""

    def __init__(self, req_fd, resp_fd):
        self._req, self._resp = req_fd, os.fdopen(resp_fd, "rb")
        self._n = 0
        self._gone = None

    def __call__(self, *args, **kwargs):
        if self._gone:
            raise StudentGone(self._gone)
        self._n += 1
        try:
            _write_all(self._req, encode_request(self._n, args, kwargs))
            line = self._resp.readline(MAX_LINE + 1)
        except OSError as e:  # EPIPE: the student's process is gone
            line, self._gone = b"", f"the solution process is gone ({e.strerror})"
        if not line:
            self._gone = self._gone or "the solution process exited"
            raise StudentGone(self._gone)
        try:
            ok, value = decode_response(line, self._n)
        except ProtocolError as e:
            self._gone = str(e)
            raise StudentGone(self._gone) from None
        if not ok:
            raise _student_error(*value)
        return value


def classify(exc):
    """(passed, reason, message) of one test unit from the exception it ended with."""
    if exc is None:
        return True, "passed", ""
    msg = str(exc)[:300]
    if isinstance(exc, AssertionError):
        return False, "wrong_answer", msg or "assertion failed"
    if isinstance(exc, StudentError):
        return False, "crash", f"the solution raised {msg}"
    if isinstance(exc, StudentGone):
        return False, "crash", msg
    if isinstance(exc, TypeError) and "plain data" in msg:
        return False, "unsupported", msg
    return False, "wrong_answer", f"{type(exc).__name__}: {msg}"


def check(task_path, req_fd, resp_fd, verdict_fd):
    import json

    def say(obj):
        _write_all(verdict_fd, (json.dumps(obj) + "\n").encode())

    with open(task_path, encoding="utf-8") as f:
        task = json.load(f)
    done = set()

    def unit(k, exc):
        passed, reason, message = classify(exc)
        done.add(k)
        say({"unit": k, "passed": passed, "reason": reason, "message": message})
        if task.get("stop") and not passed:
            raise Decided()  # tests_credit all: this failure decides; the rest are not run

    ns = {"__name__": "__check__", "__unit__": unit}
    exec(compile(task["prompt"], "prompt.py", "exec"), ns)
    exec(compile(task["test"], "test.py", "exec"), ns)
    candidate = Candidate(req_fd, resp_fd)
    ns[task["entry_point"]] = candidate  # as in HumanEval, tests may call it by its own name
    say({"event": "ready"})
    try:
        ns["check"](candidate)
        end = None
    except BaseException as e:  # noqa: BLE001 - a failure outside the units fails the rest
        end = e
    if task["units"] == 0 and not isinstance(end, Decided):  # no top-level assert: one unit
        _try_unit(unit, 0, end)
    for k in range(task["units"]):
        if k in done:
            continue
        if isinstance(end, Decided):
            say({"unit": k, "passed": False, "reason": "not_run",
                 "message": "not run: an earlier test failed (tests_credit: all)"})
        else:  # check() stopped early: by an error, or by returning (a pass)
            _try_unit(unit, k, end)
    say({"event": "done"})


class Decided(BaseException):
    """Raised by a failing unit when the first failure decides the reward (tests_credit all)."""


def _try_unit(unit, k, exc):
    from contextlib import suppress

    with suppress(Decided):  # the verdict is written; what is left is reported by the caller
        unit(k, exc)


def main(argv):
    if argv[1] == "serve":
        serve(argv[2], argv[3], int(argv[4]), int(argv[5]))
    elif argv[1] == "check":
        check(argv[2], int(argv[3]), int(argv[4]), int(argv[5]))
    else:
        sys.exit(f"usage: {argv[0]} serve|check ...")


if __name__ == "__main__":
    main(sys.argv)
