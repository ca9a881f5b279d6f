"""Reward servers over HTTP: the client a `server` component uses, and the server of
`mlx-rlaif serve-reward FILE.py:fn`.

The protocol (docs/rewards.md), one POST per batch, JSON both ways:
- ours: `{"items": [{"prompt", "completion", "code", "task_id", "language", "record",
  "exec_result"}, ...], "step": n, "kwargs": {...}}` -> `{"rewards": [r, ...]}`, each r what a
  function returns (a number, null, or an object of named numbers);
- OpenRLHF's: `{"query": [prompt + completion, ...], "prompts": [...], "labels": [...]}` ->
  `{"rewards": [...], "scores": [...], "extra_logs": {...}}` (the client sends it with
  `protocol: openrlhf`; the server answers whichever form it is sent, so servers written for
  OpenRLHF work unchanged and ours serves OpenRLHF).
The client checks the answer's length, retries connection errors and 5xx answers (3 times,
backoff 0.5 s, 1 s, 2 s) and nothing else, and names the URL in every error. The server answers
a function's error or a value that is not JSON with 422 and `{"error": line}` (not retried).

Not covered: authentication and TLS (serve on 127.0.0.1, or behind your own proxy), streaming.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .contract import ValueProblem, as_lists, check_list, label_of
from .pool import Outcome
from .spec import Loaded
from .worker import call_units

RETRIES = 3
BACKOFF_S = 0.5
JSON_KEYS = ("prompt", "completion", "code", "task_id", "language", "record", "exec_result")


def request_body(units: Sequence[Mapping[str, Any]], step: int, kwargs: Mapping[str, Any],
                 protocol: str) -> dict[str, Any]:
    """The JSON a batch is sent as."""
    if protocol == "openrlhf":
        return {"query": [u["prompt"] + u["completion"] for u in units],
                "prompts": [u["prompt"] for u in units],
                "labels": [label_of(u["record"]) for u in units]}
    return {"items": [{k: u.get(k) for k in JSON_KEYS} for u in units], "step": step,
            "kwargs": dict(kwargs)}


class ServerClient:
    """Scores argument sets with a reward server (`score` -> one outcome per set)."""

    def __init__(self, url: str, protocol: str, kwargs: Mapping[str, Any], timeout_s: float,
                 sleep: Any = time.sleep) -> None:
        self.url, self.protocol, self.kwargs, self.timeout_s = url, protocol, kwargs, timeout_s
        self._sleep = sleep
        self.retries = 0

    def score(self, units: Sequence[Mapping[str, Any]], step: int,
              give_up: Any = None) -> list[Outcome]:
        """One outcome per set (give_up: not used, one request is all or nothing)."""
        n = len(units)
        try:
            answer = self._post(request_body(units, step, self.kwargs, self.protocol))
        except TimeoutError:
            return [("timeout", None)] * n
        except _Failed as e:
            return [("error", str(e))] * n
        rewards = answer.get("rewards") if isinstance(answer, dict) else None
        if not isinstance(rewards, list):
            return [("error", f"{self.url} answered without a list 'rewards'")] * n
        if len(rewards) != n:
            return [("error", f"{self.url} returned {len(rewards)} rewards for {n} "
                              "completions")] * n
        return [("ok", r) for r in rewards]

    def _post(self, body: dict) -> Any:
        data = json.dumps(body, default=str).encode()
        for attempt in range(RETRIES + 1):
            req = urllib.request.Request(self.url, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as e:
                if e.code < 500 or attempt == RETRIES:
                    raise _Failed(f"{self.url} answered HTTP {e.code}: {_error_of(e)}") from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, TimeoutError):
                    raise TimeoutError from None
                if attempt == RETRIES:
                    raise _Failed(f"{self.url} unreachable after {RETRIES + 1} tries: "
                                  f"{e.reason}") from None
            except ConnectionError as e:
                if attempt == RETRIES:
                    raise _Failed(f"{self.url} unreachable after {RETRIES + 1} tries: "
                                  f"{e}") from None
            self.retries += 1
            self._sleep(BACKOFF_S * 2 ** attempt)
        try:
            return json.loads(raw)
        except ValueError:
            raise _Failed(f"{self.url} answered something that is not JSON: "
                          f"{raw[:60]!r}") from None


class _Failed(Exception):
    pass


def _error_of(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode(errors="replace")
        return str(json.loads(body).get("error", body))[:200]
    except Exception:  # noqa: BLE001 - whatever the body was, the status names the problem
        return e.reason or "no details"


# --- the server ------------------------------------------------------------------------------


def units_of(body: Any) -> tuple[list[dict[str, Any]], int, dict[str, Any], bool]:
    """(argument sets, step, kwargs, whether the form is OpenRLHF's) of a request; ValueError
    names what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the request must be a JSON object")
    if "query" in body:
        queries, prompts = body["query"], body.get("prompts") or [""] * len(body["query"])
        labels = body.get("labels") or [None] * len(queries)
        if not (isinstance(queries, list) and len(prompts) == len(queries) == len(labels)):
            raise ValueError("query, prompts and labels must be lists of one length")
        units = [{"prompt": p, "completion": q[len(p):] if q.startswith(p) else q,
                  "code": None, "task_id": str(i), "language": None, "exec_result": None,
                  "task": None, "query": q, "label": lab,
                  "record": {"label": lab, "query": q}} for i, (q, p, lab) in
                 enumerate(zip(queries, prompts, labels, strict=True))]
        return units, 0, {}, True
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("the request needs 'items', a list of objects (or OpenRLHF's 'query')")
    units = [{**{k: it.get(k) for k in JSON_KEYS}, "task": None,
              "record": it.get("record") or {}} for it in items]
    for u in units:
        u.update(query=(u["prompt"] or "") + (u["completion"] or ""), label=label_of(u["record"]))
    return units, int(body.get("step") or 0), dict(body.get("kwargs") or {}), False


def make_server(fn: Loaded, host: str, port: int, kwargs: Mapping[str, Any] | None = None,
                concurrency: int = 8, timeout_s: float = 300.0) -> ThreadingHTTPServer:
    """An HTTP server (not started) that scores each POST with `fn`; the request's kwargs
    over `kwargs`. A sync function runs one request at a time."""
    lock = threading.Lock() if not fn.is_async else None
    base = dict(kwargs or {})

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                units, step, extra, openrlhf = units_of(body)
            except ValueError as e:
                return self._answer(400, {"error": f"bad request: {e}"})
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
                call_units(fn, calls, {**base, **extra}, step, concurrency, timeout_s, send)
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

        def _answer(self, code: int, obj: dict) -> None:
            try:
                data = json.dumps(obj, allow_nan=False).encode()
            except (TypeError, ValueError) as e:
                code, data = 422, json.dumps({"error": f"{fn.spec} returned a value that is "
                                                       f"not JSON: {e}"}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return ThreadingHTTPServer((host, port), Handler)
