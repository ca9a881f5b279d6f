"""A scripted HTTP server on 127.0.0.1 that speaks the Anthropic Messages and OpenAI Chat
Completions wire formats, for testing the real SDK clients without the internet.

Routes: `POST /v1/messages` (Anthropic: tool use answers as `tool_use` blocks) and
`POST /v1/chat/completions` (OpenAI: `response_format` json_schema answers as JSON text).
What the model "says" is decided per request: first from the FIFO `script` (`push(...)`),
then from `responder(request) -> Behaviour` (default: `default_responder`, which grades every
criterion `server.scores` and writes a small reference solution). Behaviours:

- `Say(payload)`: a normal answer; a dict is the tool input / JSON object, a str is the raw
  text (so malformed JSON, NaN and out-of-range numbers can be sent verbatim);
- `Refuse(text)`: a refusal (Anthropic `stop_reason: refusal`, OpenAI `message.refusal`);
- `Fail(status, headers, message)`: an error status in the API's error format (429 with
  `retry-after`, 500, 401, 403, ...);
- `Broken(body)`: status 200 with a body that is not JSON;
- `Drop(payload)`: status 200 whose headers promise the whole answer, then half the body and the
  connection closes (a network drop mid-body);
- any behaviour with `delay_s` is answered that much later (slow answers, modelled latency).

`requests` records every request (path, headers, JSON body) for assertions; `hits(path)` counts
them. If `api_key` is set, requests without it are answered 401 (x-api-key or Bearer).

Not covered: streaming, the Responses API, batches, token counting endpoints.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REFERENCE_CODE = '```python\ndef reference(x):\n    """Return x + 1."""\n    return x + 1\n```'


@dataclass(frozen=True)
class Say:
    payload: Any
    delay_s: float = 0.0
    input_tokens: int = 100
    output_tokens: int = 20


@dataclass(frozen=True)
class Refuse:
    text: str = "I can't help with that."
    delay_s: float = 0.0


@dataclass(frozen=True)
class Fail:
    status: int
    headers: dict = field(default_factory=dict)
    message: str = "scripted failure"
    delay_s: float = 0.0


@dataclass(frozen=True)
class Broken:
    body: str = "{not json"
    delay_s: float = 0.0


@dataclass(frozen=True)
class Drop:
    payload: Any = None  # the answer cut off (None: the default responder's)
    delay_s: float = 0.0


Behaviour = Say | Refuse | Fail | Broken | Drop


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict
    body: dict

    @property
    def api(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"

    @property
    def structured(self) -> bool:
        return bool(self.body.get("tools") or self.body.get("response_format"))

    @property
    def text(self) -> str:
        """All the message text of the request (system included)."""
        parts = [self.body.get("system") or ""]
        parts += [m.get("content") or "" for m in self.body.get("messages", [])]
        return "\n".join(p if isinstance(p, str) else json.dumps(p) for p in parts)


class FakeAPI:
    def __init__(self, *, api_key: str | None = None, delay_s: float = 0.0,
                 scores: dict[str, float] | None = None, port: int = 0) -> None:
        self.api_key = api_key
        self.delay_s = delay_s
        self.scores = scores or {"correctness": 1.0, "code_quality": 0.5, "efficiency": 0.5,
                                 "documentation": 0.0}
        self.script: deque[Behaviour] = deque()
        self.responder: Callable[[Request], Behaviour] = self.default_responder
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", port), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                        daemon=True)

    # lifecycle
    def start(self) -> FakeAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # scripting
    def push(self, *behaviours: Behaviour) -> None:
        self.script.extend(behaviours)

    def hits(self, path: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if path is None or r.path == path)

    def default_responder(self, req: Request) -> Behaviour:
        if not req.structured:
            return Say(REFERENCE_CODE, delay_s=self.delay_s)
        ids = sorted({int(i) for i in re.findall(r"## Candidate (\d+)", req.text)})
        if ids:
            cands = [{"id": i, "scores": dict(self.scores)} for i in ids]
            return Say({"rationale": "compared", "candidates": cands}, delay_s=self.delay_s)
        return Say({"rationale": "fine", "scores": dict(self.scores)}, delay_s=self.delay_s)

    def _record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def _next(self, req: Request) -> Behaviour:
        self._record(req)
        with self._lock:
            scripted = self.script.popleft() if self.script else None
        return scripted or self.responder(req)


# --- wire formats ------------------------------------------------------------------------------


def _error_body(api: str, status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": None, "param": None}}


def _anthropic_body(req: Request, b: Say | Refuse) -> dict:
    usage = {"input_tokens": getattr(b, "input_tokens", 100),
             "output_tokens": getattr(b, "output_tokens", 5)}
    base = {"id": "msg_fake", "type": "message", "role": "assistant",
            "model": req.body.get("model", ""), "stop_sequence": None, "usage": usage}
    if isinstance(b, Refuse):
        return {**base, "content": [{"type": "text", "text": b.text}], "stop_reason": "refusal"}
    tools = req.body.get("tools") or []
    if tools and isinstance(b.payload, dict):
        block = {"type": "tool_use", "id": "toolu_fake", "name": tools[0]["name"],
                 "input": b.payload}
        return {**base, "content": [block], "stop_reason": "tool_use"}
    text = b.payload if isinstance(b.payload, str) else json.dumps(b.payload)
    return {**base, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}


def _openai_body(req: Request, b: Say | Refuse) -> dict:
    tin = getattr(b, "input_tokens", 100)
    tout = getattr(b, "output_tokens", 5)
    if isinstance(b, Refuse):
        msg = {"role": "assistant", "content": None, "refusal": b.text}
    else:
        text = b.payload if isinstance(b.payload, str) else json.dumps(b.payload)
        msg = {"role": "assistant", "content": text, "refusal": None}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
            "model": req.body.get("model", ""),
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": tin, "completion_tokens": tout,
                      "total_tokens": tin + tout}}


def _authorized(server: FakeAPI, headers: dict) -> bool:
    if server.api_key is None:
        return True
    return server.api_key in (headers.get("x-api-key"),
                              headers.get("authorization", "").removeprefix("Bearer "))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops connections at concurrency 16


def _handler(server: FakeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else headers and body wait on delayed ACKs (~40 ms)

        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            req = Request(self.path, headers, body)
            if self.path not in ("/v1/messages", "/v1/chat/completions"):
                return self._send(404, _error_body(req.api, 404, "no such route"))
            if not _authorized(server, headers):
                server._record(req)
                return self._send(401, _error_body(req.api, 401, "invalid api key"))
            b = server._next(req)
            time.sleep(b.delay_s)
            if isinstance(b, Fail):
                return self._send(b.status, _error_body(req.api, b.status, b.message), b.headers)
            if isinstance(b, Broken):
                return self._send(200, b.body)
            make = _anthropic_body if req.api == "anthropic" else _openai_body
            if isinstance(b, Drop):
                said = Say(b.payload) if b.payload is not None else server.default_responder(req)
                return self._send(200, make(req, said), cut=True)
            self._send(200, make(req, b))

        def _send(self, status: int, body: Any, headers: dict | None = None,
                  cut: bool = False) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if cut else data)
                if cut:  # the rest never comes: close the connection mid-body
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

    return Handler


def main() -> None:
    """Serve until interrupted (for benchmarks in a separate process): prints the port."""
    import argparse

    ap = argparse.ArgumentParser(description="fake Anthropic/OpenAI server on 127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    args = ap.parse_args()
    server = FakeAPI(delay_s=args.delay_ms / 1000, port=args.port)
    print(server.port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server._httpd.serve_forever(0.05)


if __name__ == "__main__":
    main()
