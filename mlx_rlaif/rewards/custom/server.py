"""The server of `mlx-rlaif serve-reward FILE.py:fn`: a reward function over HTTP, with the
protocol of client.py (ours and OpenRLHF's, answered in the form it is sent).

It answers every request it refuses with one line of JSON (`{"error": ...}`), never a
traceback: 403 for a Host that is not its own address (DNS rebinding) or a request from a web
page (an Origin other than its own, a cross-site Sec-Fetch-Site: CSRF), 401 without its token
(when it has one), 415 without `Content-Type: application/json`, 400 for a body without a
Content-Length or past MAX_REQUEST_BYTES (not read), JSON that does not parse or nests too deep,
a key or a type the protocol does not have (`"step": {}`, `"prompts": 5`); 403 for kwargs the
operator did not allow with `--request-kwarg` (the operator's `--kwarg` are fixed), and a
request's record fills only parameters without a default (a function's defaults, such as
which model to load, stay the operator's). A function's error or a value that is not JSON is
422 (not retried by the client).

Not covered: TLS (serve on 127.0.0.1, or behind your own proxy), a client that holds many
connections open (each is dropped after READ_TIMEOUT_S of silence, not sooner), a Host name
other than localhost (use the address: names are refused).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import re
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .client import JSON_KEYS, TOKEN_ENV
from .contract import ValueProblem, as_lists, check_list, label_of
from .relay import write_line
from .spec import PLURAL, SHARED, SINGULAR, Loaded
from .worker import call_units

MAX_REQUEST_BYTES = 64 * 2**20  # a request's body is refused past this
READ_TIMEOUT_S = 60.0  # a client silent this long is dropped


class BadRequest(ValueError):
    """A request the server refuses: its HTTP status and one line."""

    def __init__(self, line: str, code: int = 400) -> None:
        super().__init__(line)
        self.code = code


ITEM_TYPES: dict[str, tuple[type, ...]] = {
    "prompt": (str,), "completion": (str,), "code": (str,), "task_id": (str,),
    "language": (str,), "record": (dict,), "exec_result": (dict,)}


def units_of(body: Any, allowed_kwargs: Iterable[str] = ()
             ) -> tuple[list[dict[str, Any]], int, dict[str, Any], bool]:
    """(argument sets, step, kwargs, whether the form is OpenRLHF's) of a request; BadRequest
    names what is wrong: a key or a type the protocol does not have, or kwargs other than the
    `allowed_kwargs` (what the operator let requests set)."""
    if not isinstance(body, dict):
        raise BadRequest("the request must be a JSON object")
    if "query" in body:
        return _openrlhf_units(body) + ({}, True)  # type: ignore[return-value]
    _only(body, ("items", "step", "kwargs"), "the request")
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise BadRequest("the request needs 'items', a list of objects (or OpenRLHF's 'query')")
    for k, it in enumerate(items):
        _only(it, JSON_KEYS, f"item {k}")
        for key, v in it.items():
            if v is not None and not isinstance(v, ITEM_TYPES[key]):
                raise BadRequest(f"item {k}: {key} must be a {ITEM_TYPES[key][0].__name__} or "
                                 f"null, not {_type(v)}")
    step = body.get("step", 0)
    if step is None:
        step = 0
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise BadRequest(f"step must be a whole number >= 0, not {_type(step)}")
    kwargs = {} if body.get("kwargs") is None else body["kwargs"]
    if not isinstance(kwargs, dict):
        raise BadRequest(f"kwargs must be an object, not {_type(kwargs)}")
    refused = sorted(set(kwargs) - set(allowed_kwargs))
    if refused:
        raise BadRequest(f"kwargs {', '.join(map(repr, refused))[:200]} are not the request's "
                         "to set (the server's operator allows them with --request-kwarg)", 403)
    units = [{**{k: it.get(k) for k in JSON_KEYS}, "task": None,
              "record": it.get("record") or {}} for it in items]
    for u in units:
        u.update(query=(u["prompt"] or "") + (u["completion"] or ""), label=label_of(u["record"]))
    return units, step, dict(kwargs), False


def _openrlhf_units(body: dict) -> tuple[list[dict[str, Any]], int]:
    _only(body, ("query", "prompts", "labels"), "the request")
    queries = body["query"]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest("query must be a list of strings")
    prompts = body.get("prompts") or [""] * len(queries)
    labels = body.get("labels") or [None] * len(queries)
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise BadRequest("prompts must be a list of strings")
    if not isinstance(labels, list) or not len(prompts) == len(queries) == len(labels):
        raise BadRequest("query, prompts and labels must be lists of one length")
    units = [{"prompt": p, "completion": q[len(p):] if q.startswith(p) else q,
              "code": None, "task_id": str(i), "language": None, "exec_result": None,
              "task": None, "query": q, "label": lab,
              "record": {"label": lab, "query": q}} for i, (q, p, lab) in
             enumerate(zip(queries, prompts, labels, strict=True))]
    return units, 0


def _only(obj: dict, keys: Sequence[str], what: str) -> None:
    unknown = [k for k in obj if k not in keys]
    if unknown:
        raise BadRequest(f"{what} has key {str(unknown[0])[:40]!r}, not one of "
                         f"{', '.join(keys)}")


def _type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), f"a {type(v).__name__}")


_HOST = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):([1-9][0-9]{0,4})")
UNIQUE_HEADERS = ("Host", "Origin", "Content-Type", "Content-Length", "Authorization",
                  "Sec-Fetch-Site")
PROTOCOL_NAMES = frozenset((*SINGULAR, *PLURAL, *SHARED))  # no --request-kwarg may name one


def host_allowed(host: str | None, bound: str, port: int) -> bool:
    """Whether a request's Host header names this server: the address it is bound to (or
    localhost, bound to a loopback address; any address literal, bound to all of them) and its
    port. A name a DNS answer could point here (rebinding) is refused."""
    m = _HOST.fullmatch(host or "")
    if m is None:  # strictly host:port: no userinfo, no path, no leading zero, no spaces
        return False
    name, their_port = (m.group(1) or m.group(2)), int(m.group(3))
    if their_port != port:
        return False
    try:
        ours = ipaddress.ip_address(bound.strip("[]"))
    except ValueError:
        ours = None
    try:
        theirs = ipaddress.ip_address(name)
    except ValueError:
        return name == "localhost" and ours is not None and (ours.is_loopback or
                                                             ours.is_unspecified)
    return theirs == ours or (ours is not None and ours.is_unspecified)


def origin_allowed(origin: str | None, host: str, fetch_site: str | None) -> bool:
    """A request from a web page (an Origin, or a browser's Sec-Fetch-Site) is refused unless
    the page is the server's own: no other site can drive it (CSRF)."""
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    return origin is None or origin == f"http://{host}"


def make_server(fn: Loaded, host: str, port: int, kwargs: Mapping[str, Any] | None = None,
                concurrency: int = 8, timeout_s: float = 300.0, token: str | None = None,
                request_kwargs: Iterable[str] = (), max_bytes: int = MAX_REQUEST_BYTES
                ) -> ThreadingHTTPServer:
    """An HTTP server (not started) that scores each POST with `fn`: the operator's `kwargs`
    are fixed, a request may set only the keys of `request_kwargs` (none of the operator's);
    with `token`, a request must carry it as a bearer header. A sync function runs one
    request at a time."""
    lock = threading.Lock() if not fn.is_async else None
    base = dict(kwargs or {})
    allowed = frozenset(request_kwargs)
    if allowed & PROTOCOL_NAMES:
        raise ValueError(f"--request-kwarg {sorted(allowed & PROTOCOL_NAMES)[0]} names a "
                         "parameter of the protocol (the request's items fill it): name the "
                         "function's own keyword arguments only")
    if allowed & set(base):
        raise ValueError(f"--request-kwarg {sorted(allowed & set(base))[0]} is set by --kwarg: "
                         "a request cannot change what the operator set")

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # a client that stops sending is dropped

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            try:
                self._check()
                units, step, extra, openrlhf = units_of(self._json(), allowed)
            except BadRequest as e:
                return self._answer(e.code, {"error": f"bad request: {e}"})
            results: list[Any] = [None] * len(units)
            errors: list[str] = []

            def send(k: int, status: str, payload: Any) -> None:
                if status == "ok":
                    results[k] = payload
                else:
                    where = "" if fn.batched else f"item {k} (task {units[k]['task_id']}): "
                    errors.append(f"{where}{payload or 'timed out'}")

            calls = [as_lists(units)] if fn.batched else units  # a function of lists: one call
            with lock or contextlib.nullcontext():
                call_units(fn, calls, {**extra, **base}, step, concurrency, timeout_s, send,
                           trusted=False)
            if fn.batched and not errors:
                try:
                    results = check_list(results[0], len(units))
                except ValueProblem as e:
                    errors.append(str(e))
            if errors:
                return self._answer(422, {"error": f"{fn.spec}: {errors[0]}"})
            answer = {"rewards": results}
            if openrlhf:
                answer.update(scores=results, extra_logs={})
            self._answer(200, answer)

        def _check(self) -> None:
            """Who may ask: this server's address as Host, no other site's page, the token;
            then a JSON body of a declared size within the bound."""
            h = self.headers
            for name in UNIQUE_HEADERS:
                if len(h.get_all(name) or ()) > 1:
                    raise BadRequest(f"more than one {name} header")
            if not host_allowed(h.get("Host"), *self.server.server_address[:2]):
                raise BadRequest(f"Host {str(h.get('Host'))[:80]!r} is not this server's "
                                 "address: use the URL it printed", 403)
            if not origin_allowed(h.get("Origin"), h["Host"], h.get("Sec-Fetch-Site")):
                raise BadRequest("requests from web pages are refused", 403)
            if token and not hmac.compare_digest(h.get("Authorization", "").encode(),
                                                 f"Bearer {token}".encode()):
                raise BadRequest(f"no valid token: send the server's token as 'Authorization: "
                                 f"Bearer ...' (the client reads {TOKEN_ENV})", 401)
            kind = h.get("Content-Type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise BadRequest(f"Content-Type must be application/json, not "
                                 f"{kind[:60] or 'missing'!r}", 415)

        def _json(self) -> Any:
            size = self.headers.get("Content-Length", "")
            if not size.strip().isdigit():
                raise BadRequest("a Content-Length is needed (a number of bytes)")
            if int(size) > max_bytes:
                raise BadRequest(f"a body of {int(size)} bytes, above the bound of {max_bytes}")
            try:
                return json.loads(self.rfile.read(int(size)))
            except RecursionError:
                raise BadRequest("the JSON is nested too deep") from None
            except ValueError as e:
                raise BadRequest(f"the body is not JSON ({str(e)[:80]})") from None

        def _answer(self, code: int, obj: dict) -> None:
            try:
                data = json.dumps(obj, allow_nan=False).encode()
            except (TypeError, ValueError) as e:
                code, data = 422, json.dumps({"error": f"{fn.spec} returned a value that is "
                                                       f"not JSON: {e}"}).encode()
            if code >= 400:
                self.close_connection = True  # a body left unread is never read as a request
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if code >= 400:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def send_error(self, code: int, message: str | None = None,
                       explain: str | None = None) -> None:
            """http.server's own refusals (a bad request line, a method other than POST):
            one line of JSON too."""
            self._answer(code, {"error": f"bad request: {message or code}"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return _Server((host, port), Handler)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    out: Any = None  # where its own lines go (serve-reward: the real stderr; else stderr)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that broke the handler: one line on stderr, never a traceback."""
        e = sys.exc_info()[1]
        write_line(f"serve-reward: a request from {client_address[0]} failed: "
                   f"{type(e).__name__}: {str(e)[:200]!r}", self.out)
