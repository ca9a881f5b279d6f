"""The client a `server` reward component uses to score a batch with a reward server (the
server of `mlx-rlaif serve-reward` is server.py).

The protocol (docs/rewards.md), one POST per batch, JSON both ways:
- ours: `{"items": [{"prompt", "completion", "code", "task_id", "language", "record",
  "exec_result"}, ...], "step": n, "kwargs": {...}}` -> `{"rewards": [r, ...]}`, each r what a
  function returns (a number, null, or an object of named numbers);
- OpenRLHF's: `{"query": [prompt + completion, ...], "prompts": [...], "labels": [...]}` ->
  `{"rewards": [...], "scores": [...], "extra_logs": {...}}` (the client sends it with
  `protocol: openrlhf`; the server answers whichever form it is sent, so servers written for
  OpenRLHF work unchanged and ours serves OpenRLHF).

The client gives each request one deadline, `timeout_s` for all of it (connect, send, every
byte of the answer: a server trickling bytes is cut there), follows no redirect (an error names
the URL and the Location), refuses an answer past MAX_ANSWER_BYTES without reading it whole,
checks the answer's length, retries connection errors and 5xx answers (3 times, backoff 0.5 s,
1 s, 2 s) and nothing else (not an answer that breaks HTTP: too many headers, a header line
past 64 KiB, a broken chunked body), names the URL in every error and sends MLX_RLAIF_REWARD_TOKEN, when
set, as `Authorization: Bearer` (never shown in an error).

Not covered: TLS certificates beyond Python's defaults, streaming, a server's own answer
arriving after the deadline (it is a timeout, the request is not retried).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from .contract import label_of
from .pool import Outcome

RETRIES = 3
BACKOFF_S = 0.5
TOKEN_ENV = "MLX_RLAIF_REWARD_TOKEN"  # the shared token, client and server
MAX_ANSWER_BYTES = 16 * 2**20  # an answer is refused past this (rewards of a batch: kilobytes)
ERROR_BYTES = 4096  # of an error answer, the part read for its message
CHUNK_BYTES = 2**16
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
    """Scores argument sets with a reward server (`score` -> one outcome per set). The token
    (MLX_RLAIF_REWARD_TOKEN, read once here) is sent as a bearer header and never shown."""

    def __init__(self, url: str, protocol: str, kwargs: Mapping[str, Any], timeout_s: float,
                 sleep: Any = time.sleep, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url, self.protocol, self.kwargs, self.timeout_s = url, protocol, kwargs, timeout_s
        self.max_bytes = max_bytes
        self._sleep = sleep
        self._token = os.environ.get(TOKEN_ENV) or None
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
            try:
                code, headers, raw = self._once(data)
            except TimeoutError:
                raise
            except http.client.HTTPException as e:
                if not isinstance(e, ConnectionError):  # a broken answer: not retried
                    raise _Failed(f"{self.url} answered something that is not HTTP "
                                  f"({_protocol_error(e)})") from None
                if attempt == RETRIES:
                    raise _Failed(f"{self.url} unreachable after {RETRIES + 1} tries: "
                                  f"{str(e) or type(e).__name__}") from None
            except OSError as e:
                if attempt == RETRIES:
                    raise _Failed(f"{self.url} unreachable after {RETRIES + 1} tries: "
                                  f"{str(e) or type(e).__name__}") from None
            else:
                if code == 200:
                    return _json_of(self.url, raw)
                if 300 <= code < 400:
                    where = str(headers.get("Location", "nowhere"))[:200]
                    raise _Failed(f"{self.url} answered HTTP {code} redirecting to {where!r}: "
                                  "redirects are not followed (give the server's own URL)")
                if code < 500 or attempt == RETRIES:
                    raise _Failed(f"{self.url} answered HTTP {code}: {_error_of(raw)}")
            self.retries += 1
            self._sleep(BACKOFF_S * 2 ** attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, data: bytes) -> tuple[int, Any, bytes]:
        """One POST under one deadline for all of it (connect, send, headers, body): a timer
        shuts the socket at `timeout_s` (TimeoutError), whatever pace the server answers at.
        The answer's body is read up to `max_bytes` (an error answer's up to 4 KiB)."""
        conn = _connection(self.url, self.timeout_s)
        cut = threading.Event()
        timer = threading.Timer(self.timeout_s, _shut, (conn, cut))
        timer.daemon = True
        timer.start()
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn.request("POST", _target(self.url), body=data, headers=headers)
            resp = conn.getresponse()
            limit = self.max_bytes if resp.status == 200 else ERROR_BYTES
            raw = self._read(resp, limit, resp.status == 200)
            if cut.is_set():  # the body ended at the deadline, not at its end
                raise TimeoutError
            return resp.status, resp.headers, raw
        except (OSError, http.client.HTTPException) as e:
            if cut.is_set() or isinstance(e, TimeoutError):
                raise TimeoutError from None
            raise
        finally:
            timer.cancel()
            conn.close()

    def _read(self, resp: http.client.HTTPResponse, limit: int, strict: bool) -> bytes:
        """The body, refused past `limit` bytes (strict) or cut there (an error's text)."""
        size = resp.headers.get("Content-Length")
        if strict and size and size.strip().isdigit() and int(size) > limit:
            raise _Failed(f"{self.url} answered {int(size)} bytes, above the bound of {limit} "
                          "bytes for an answer")
        chunks, total = [], 0
        while total <= limit:
            chunk = resp.read(min(CHUNK_BYTES, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit and strict:
            raise _Failed(f"{self.url} answered more than {limit} bytes, the bound for an answer")
        return b"".join(chunks)[:limit]


class _Failed(Exception):
    pass


def _connection(url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Failed(f"{url}: not an http:// or https:// URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout_s)


def _target(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _shut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The deadline: wake a connection blocked on the server (its next read fails)."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _json_of(url: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise _Failed(f"{url} answered something that is not JSON: {raw[:60]!r}") from None


def _protocol_error(e: http.client.HTTPException) -> str:
    """A broken answer's error, short and without the answer's bytes."""
    return f"{type(e).__name__}: {str(e)[:80]!r}" if str(e) else type(e).__name__


def _error_of(raw: bytes) -> str:
    """An error answer's text: its JSON `error`, else its first 200 characters."""
    body = raw.decode(errors="replace")
    try:
        return str(json.loads(body).get("error", body))[:200]
    except Exception:  # noqa: BLE001 - whatever the body was, the status names the problem
        return body[:200] or "no details"
