"""The ways a teacher API fails, as behaviours of the fake server (fake_api.py), and a responder
that mixes them in at random: shared by tests/test_faults_teacher.py and tools/soak.py.

`FAULTS[name] = (make(server, request) -> Behaviour, attempts the SDK makes with max_retries=1,
words of the unscorable reason, whether the answer is billed)`. `FaultMix` draws a fault for a
request with probability `rate` and keeps the tokens of every answer delivered whole in time
(what the client pays for), so a run's cost can be checked to the cent.

Not covered: faults that end the run (401/403: the tests script those), connection refused (no
server to answer: tested with a closed port).
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import replace

from fake_api import Broken, Drop, Fail, FakeAPI, Request, Say

TIMEOUT = 1.0  # the SDK timeout these faults assume; a slow answer takes 0.5 s longer
PRICE = {"price_in_per_mtok": 1000.0, "price_out_per_mtok": 5000.0}  # $0.2 per default answer
HUGE = 8 << 20


def _wrong_api_schema(req: Request) -> Broken:
    """Valid JSON of the API's kind whose fields are not the API's schema."""
    if req.api == "anthropic":
        return Broken(json.dumps({"id": "msg_1", "type": "message", "content": [{"type": "text"}],
                                  "usage": "many"}))
    return Broken(json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": []}))


def _default(srv: FakeAPI, req: Request) -> Say:
    return srv.default_responder(req)


# name -> (behaviour for a request, attempts with max_retries=1, words of the reason, billed)
FAULTS = {
    "429 retry-after": (lambda s, r: Fail(429, {"retry-after": "0.2"}), 2, "HTTP 429", False),
    "429": (lambda s, r: Fail(429), 2, "HTTP 429", False),
    "500": (lambda s, r: Fail(500), 2, "HTTP 500", False),
    "502": (lambda s, r: Fail(502), 2, "HTTP 502", False),
    "503": (lambda s, r: Fail(503), 2, "HTTP 503", False),
    "slow": (lambda s, r: replace(_default(s, r), delay_s=TIMEOUT + 0.5), 2, "timed out", False),
    "drop mid-body": (lambda s, r: Drop(), 2, "connection failed", False),
    "malformed JSON": (lambda s, r: Broken("{not json"), 1, "invalid response", False),
    "wrong API schema": (lambda s, r: _wrong_api_schema(r), 1, "invalid response shape", False),
    "wrong judge schema": (lambda s, r: Say({"verdict": "great", "score": 11}), 1,
                           "unparseable judgement", True),
    "huge body": (lambda s, r: Say("x" * HUGE), 1, "unparseable judgement", True),
}
RETRIED = [n for n, f in FAULTS.items() if f[1] == 2]


MIX = [n for n in FAULTS if n not in ("huge body",)] + ["huge answer"]


class FaultMix:
    """A responder: each request gets a random fault from MIX with probability `rate`, else the
    default answer. It keeps what it sent, and the tokens of every answer delivered whole in
    time (what the client pays for)."""

    def __init__(self, srv: FakeAPI, rate: float, seed: int) -> None:
        self.srv, self.rate, self.rng = srv, rate, random.Random(seed)
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.tokens = [0, 0]
        self.fatal: int | None = None  # answer every request with this status

    def __call__(self, req: Request):
        with self.lock:
            if self.fatal:
                return Fail(self.fatal)
            name = self.rng.choice(MIX) if self.rng.random() < self.rate else "ok"
            self.sent[name] = self.sent.get(name, 0) + 1
        if name == "ok":
            b = self.srv.default_responder(req)
        elif name == "huge answer":
            b = Say("x" * (1 << 20))
        else:
            b = FAULTS[name][0](self.srv, req)
        if isinstance(b, Say) and b.delay_s < TIMEOUT:
            with self.lock:
                self.tokens[0] += b.input_tokens
                self.tokens[1] += b.output_tokens
        return b

    def cost(self) -> float:
        return (self.tokens[0] * PRICE["price_in_per_mtok"]
                + self.tokens[1] * PRICE["price_out_per_mtok"]) / 1e6


