"""The reward server's two ends under hostile input (issue 57), each guarantee tried by a real
HTTP peer on 127.0.0.1.

The client (`ServerClient`) against servers that try to hold it or feed it: a server trickling
a byte every 0.5 s (in its headers, in its body) is cut at `timeout_s`; a POST answered with a
redirect is not followed (the error names the URL and the Location, the other origin gets
nothing); an answer of 200 MB (declared, or streamed without a length) is refused without being
read whole; the token goes out as a bearer header.

The server (`mlx-rlaif serve-reward`, a subprocess) against requests that try to crash it, steer
it or reach it from a web page: deep JSON, wrong types, no JSON, a huge or missing length (400,
one line); kwargs the operator set or did not allow, and record fields that would fill a
function's defaults (which model to load); a Host that is not its address (DNS rebinding);
another site's Origin or Sec-Fetch-Site (CSRF); a Content-Type other than JSON; a missing or
wrong token. No traceback reaches its output, and it still answers after all of them.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_rlaif.records import Task
from mlx_rlaif.rewards.custom.client import MAX_ANSWER_BYTES, ServerClient
from mlx_rlaif.rewards.custom.contract import units
from mlx_rlaif.rewards.custom.server import host_allowed

ANSWER = b'{"rewards": [1.0, 2.0]}'


def _args(n: int = 2) -> list[dict]:
    return units([Task(id="t", prompt="p") for _ in range(n)], ["a"] * n, [None] * n)


class _Peer:
    """A raw TCP server on 127.0.0.1 whose every connection is handled by `serve(sock)` in a
    thread: it can answer in any shape, at any pace."""

    def __init__(self, serve) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.hits = 0
        self._serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            _read_request(conn)
            self._serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    size = int(re.search(rb"content-length:\s*(\d+)", head, re.I).group(1))
    while len(body) < size:
        body += conn.recv(65536)
    return head


def _trickle(where: str):
    """Answer one byte every 0.5 s, for 10 s at most (then the rest at once)."""
    def serve(conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(ANSWER)}\r\n\r\n".encode()
        slow, fast = (head, ANSWER) if where == "headers" else (ANSWER[:20], ANSWER[20:])
        if where == "body":
            conn.sendall(head)
        for i in range(len(slow)):
            conn.sendall(slow[i:i + 1])
            if i < 20:
                time.sleep(0.5)
        conn.sendall(fast)
    return serve


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_server_trickling_bytes_is_cut_at_the_deadline(where):
    peer = _Peer(_trickle(where))
    try:
        t0 = time.monotonic()
        out = ServerClient(peer.url, "mlx-rlaif", {}, 2.0).score(_args(), 0)
        took = time.monotonic() - t0
        assert out == [("timeout", None)] * 2, out  # a per-read timeout: 10 s, then ok
        assert took < 2.0 + 1.5, took
    finally:
        peer.close()


def test_a_redirect_is_not_followed_and_named():
    other = _Peer(lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                      % (len(ANSWER), ANSWER)))
    location = other.url + "steal"

    def redirect(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n"
                     "\r\n".encode())

    peer = _Peer(redirect)
    try:
        out = ServerClient(peer.url, "mlx-rlaif", {}, 5.0).score(_args(), 0)
        assert out[0] == ("error", f"{peer.url} answered HTTP 302 redirecting to "
                                   f"'{location}': redirects are not followed (give the "
                                   "server's own URL)"), out
        assert other.hits == 0  # the other origin never saw the batch nor was asked
    finally:
        peer.close()
        other.close()


def _huge(declared: bool):
    """200 MB of an answer, with its length declared or streamed until the connection ends."""
    def serve(conn: socket.socket) -> None:
        total = 200 * 2**20
        head = "HTTP/1.1 200 OK\r\n" + (f"Content-Length: {total}\r\n" if declared else
                                        "Connection: close\r\n")
        start = b'{"rewards": ['
        conn.sendall(head.encode() + b"\r\n" + start)
        block, left = b" " * 2**20, total - len(start)
        while left > 0:
            conn.sendall(block[:left])
            left -= len(block)
    return serve


@pytest.mark.parametrize("declared", [True, False])
def test_an_answer_past_the_bound_is_refused_without_reading_it_whole(declared):
    peer = _Peer(_huge(declared))
    try:
        tracemalloc.start()
        out = ServerClient(peer.url, "mlx-rlaif", {}, 60.0).score(_args(), 0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        status, line = out[0]
        assert status == "error" and line.startswith(peer.url) and \
            f"{MAX_ANSWER_BYTES} bytes" in line, out
        assert peak < 3 * MAX_ANSWER_BYTES, peak  # read whole: 200 MB and more
    finally:
        peer.close()


def test_the_client_sends_the_token_from_the_environment(monkeypatch):
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))

    peer = _Peer(serve)
    peer._one = lambda c, one=peer._one: (seen.append(c.recv(65536, socket.MSG_PEEK)), one(c))
    try:
        monkeypatch.setenv("MLX_RLAIF_REWARD_TOKEN", "s3cret-token")
        assert ServerClient(peer.url, "mlx-rlaif", {}, 5.0).score(_args(), 0) == \
            [("ok", 1.0), ("ok", 2.0)]
        assert b"\r\nAuthorization: Bearer s3cret-token\r\n" in seen[0]
    finally:
        peer.close()


# --- the server ----------------------------------------------------------------------------

SERVED = '''
def score(completion, bonus=0.0, model="the-operators-model", path="/the/operators/path"):
    steered = model != "the-operators-model" or path != "/the/operators/path"
    return len(completion) + bonus + (1000.0 if steered else 0.0)

def batch(completions, model="the-operators-model"):
    return [1000.0 if model != "the-operators-model" else 1.0 for _ in completions]
'''
TOKEN = "tok-8c1f-secret"


class _Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url
        self.port = int(url.rsplit(":", 1)[1].strip("/"))

    def post(self, body: bytes | dict, **headers: str) -> tuple[int, dict]:
        """A raw POST: (status, answer), with exactly the headers given (and Host unless
        given)."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.putrequest("POST", "/", skip_host=True, skip_accept_encoding=True)
        headers = {"Host": f"127.0.0.1:{self.port}", "Content-Type": "application/json",
                   "Content-Length": str(len(data)),
                   **{k.replace("_", "-"): v for k, v in headers.items()}}
        for k, v in headers.items():
            if v is not None:
                conn.putheader(k, v)
        conn.endheaders()
        with contextlib.suppress(OSError):  # the server answered, closed, did not read it all
            conn.send(data)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, json.loads(raw)


def _serve(tmp_path: Path, spec: str, *extra: str, env: dict | None = None) -> Iterator[_Served]:
    p = tmp_path / "served.py"
    p.write_text(SERVED)
    proc = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward",
                             f"{p}:{spec}", "--port", "0", "--kwarg", "bonus=0.5", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert m, line + proc.stderr.read()
    try:
        yield _Served(proc, m.group(0))
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        assert "Traceback" not in out + err, out + err
        assert TOKEN not in line + out + err  # the token is never printed


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[_Served]:
    yield from _serve(tmp_path_factory.mktemp("served"), "score")


ITEM = {"prompt": "p", "completion": "abc", "task_id": "t"}
GOOD = {"items": [ITEM], "step": 1}


def _one_line(answer: dict) -> str:
    assert set(answer) == {"error"} and "\n" not in answer["error"], answer
    return answer["error"]


@pytest.mark.parametrize("body, match", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    (b"\xff\xfe not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    ({"items": [ITEM], "step": {}}, "step must be a whole number >= 0, not an object"),
    ({"items": [ITEM], "step": True}, "step must be a whole number"),
    ({"query": ["a"], "prompts": 5}, "prompts must be a list of strings"),
    ({"query": "abc"}, "query must be a list of strings"),
    ({"items": 5}, "needs 'items', a list of objects"),
    ({"items": [{"prompt": 5}]}, "item 0: prompt must be a str or null, not a int"),
    ({"items": [{**ITEM, "record": []}]}, "item 0: record must be a dict or null, not a list"),
    ({"items": [ITEM], "kwargs": []}, "kwargs must be an object"),
    ({"items": [ITEM], "extra": 1}, "the request has key 'extra'"),
])
def test_a_malformed_request_is_answered_400_in_one_line(served, body, match):
    status, answer = served.post(body)
    assert status == 400 and match in _one_line(answer), (status, answer)


def test_a_body_too_large_or_without_a_length_is_refused_unread(served):
    t0 = time.monotonic()
    status, answer = served.post(b"{}", Content_Length=str(10**10))
    assert status == 400 and "a body of 10000000000 bytes, above the bound" in _one_line(answer)
    status, answer = served.post(b"{}", Content_Length=None)
    assert status == 400 and "Content-Length is needed" in _one_line(answer)
    assert time.monotonic() - t0 < 10


def test_the_operators_arguments_cannot_be_changed_by_a_request(served):
    assert served.post(GOOD) == (200, {"rewards": [3.5]})  # len("abc") + the operator's 0.5
    for kwargs in ({"bonus": 100}, {"model": "evil/model"}, {"path": "/etc"}):
        status, answer = served.post({**GOOD, "kwargs": kwargs})
        assert status == 403 and "not the request's to set" in _one_line(answer), answer
    # a record's fields fill no parameter with a default (which model, which path)
    record = {"model": "evil/model", "path": "/etc/passwd", "bonus": 100}
    assert served.post({"items": [{**ITEM, "record": record}]}) == (200, {"rewards": [3.5]})


def test_a_function_of_lists_keeps_its_model(tmp_path):
    """The shape of examples/rewards/reward_model.py: `model` a default of a function of lists."""
    for s in _serve(tmp_path, "batch"):
        assert s.post(GOOD) == (200, {"rewards": [1.0]})
        status, _ = s.post({**GOOD, "kwargs": {"model": "evil/model"}})
        assert status == 403
        assert s.post({"items": [{**ITEM, "record": {"model": "evil/model"}}]}) == \
            (200, {"rewards": [1.0]})


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True),
    ("evil.example:{port}", False),  # DNS rebinding: a name pointed at 127.0.0.1
    ("127.0.0.1.nip.io:{port}", False), ("127.0.0.1:1", False), ("127.0.0.1", False),
    ("", False), ("[::1:{port}", False)])
def test_the_host_must_be_the_servers_address(served, host, ok):
    status, answer = served.post(GOOD, Host=host.format(port=served.port))
    if ok:
        assert status == 200, answer
    else:
        assert status == 403 and "is not this server's address" in _one_line(answer)


@pytest.mark.parametrize("bound, host, ok", [
    ("0.0.0.0", "10.0.0.7:8400", True), ("0.0.0.0", "localhost:8400", True),
    ("0.0.0.0", "gpu-box.lan:8400", False), ("10.0.0.7", "10.0.0.7:8400", True),
    ("10.0.0.7", "127.0.0.1:8400", False), ("10.0.0.7", "localhost:8400", False),
    ("127.0.0.1", "127.0.0.1:8401", False), ("127.0.0.1", "127.0.0.1:8400\r\nX: y", False)])
def test_the_host_check_on_other_bound_addresses(bound, host, ok):
    """Bound to every address, any address literal and localhost pass, never a name; bound to
    one address, only it."""
    assert host_allowed(host, bound, 8400) is ok


@pytest.mark.parametrize("headers, ok", [
    ({"Origin": "http://evil.example"}, False), ({"Origin": "null"}, False),
    ({"Origin": "http://127.0.0.1:{port}.evil.example"}, False),
    ({"Sec-Fetch-Site": "cross-site"}, False), ({"Sec-Fetch-Site": "same-site"}, False),
    ({"Origin": "http://127.0.0.1:{port}"}, True), ({"Sec-Fetch-Site": "same-origin"}, True)])
def test_requests_from_other_sites_pages_are_refused(served, headers, ok):
    headers = {k: v.format(port=served.port) for k, v in headers.items()}
    status, answer = served.post(GOOD, **headers)
    assert (status == 200) if ok else \
        (status == 403 and "from web pages are refused" in _one_line(answer)), answer


@pytest.mark.parametrize("kind", [None, "text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x"])
def test_the_content_type_must_be_json(served, kind):
    status, answer = served.post(GOOD, Content_Type=kind)
    assert status == 415 and "Content-Type must be application/json" in _one_line(answer)


def test_other_methods_get_one_line(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("GET", "/")
    resp = conn.getresponse()
    assert resp.status == 501 and "\n" not in json.loads(resp.read())["error"]
    conn.close()
    assert served.post(GOOD)[0] == 200  # it still serves


def test_a_token_is_required_when_the_server_has_one(tmp_path, monkeypatch):
    for s in _serve(tmp_path, "score", env={"MLX_RLAIF_REWARD_TOKEN": TOKEN}):
        for auth in (None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, f"Basic {TOKEN}"):
            status, answer = s.post(GOOD, Authorization=auth)
            assert status == 401 and "no valid token" in _one_line(answer), auth
            assert TOKEN not in answer["error"]
        assert s.post(GOOD, Authorization=f"Bearer {TOKEN}") == (200, {"rewards": [3.5]})
        monkeypatch.delenv("MLX_RLAIF_REWARD_TOKEN", raising=False)
        status, line = ServerClient(s.url, "mlx-rlaif", {}, 30).score(_args(1), 0)[0]
        assert status == "error" and "HTTP 401" in line and TOKEN not in line
        monkeypatch.setenv("MLX_RLAIF_REWARD_TOKEN", TOKEN)
        assert ServerClient(s.url, "mlx-rlaif", {}, 30).score(_args(1), 0) == [("ok", 1.5)]


def test_the_flag_names_a_request_kwarg_and_refuses_the_operators(tmp_path):
    for s in _serve(tmp_path, "score", "--request-kwarg", "path"):
        assert s.post({**GOOD, "kwargs": {"path": "/x"}}) == (200, {"rewards": [1003.5]})
        assert s.post({**GOOD, "kwargs": {"model": "m"}})[0] == 403
    p = tmp_path / "served.py"
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward", f"{p}:score",
                        "--kwarg", "bonus=1", "--request-kwarg", "bonus", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "--request-kwarg bonus is set by --kwarg: a request cannot change what the operator "
        "set"), r.stderr


# --- red-team pass 1 of issue 57: the minor findings -------------------------------------------


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(150)) +
    b"Content-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nX: " + b"a" * (1 << 17) + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"],
    ids=["150-headers", "128k-header-line", "broken-chunked"])
def test_a_protocol_error_is_not_retried(answer):
    """Too many headers, a 64 KiB+ header line, a broken chunked body: the client retried them
    3 times (docs: only connection errors and 5xx are)."""
    peer = _Peer(lambda conn: conn.sendall(answer))
    slept: list[float] = []
    try:
        status, line = ServerClient(peer.url, "mlx-rlaif", {}, 10, sleep=slept.append
                                    ).score(_args(), 0)[0]
        assert status == "error" and peer.url in line and "\n" not in line, line
        assert peer.hits == 1 and not slept, (peer.hits, line)
    finally:
        peer.close()


@pytest.mark.parametrize("host", ["evil.com@127.0.0.1:8400", "127.0.0.1:08400",
                                  "127.0.0.1:+8400", "127.0.0.1:8400#x", "127.0.0.1:8400/x",
                                  "127.0.0.1:8400?", "user:pw@127.0.0.1:8400",
                                  " 127.0.0.1:8400"])
def test_the_host_is_parsed_strictly(host):
    assert host_allowed(host, "127.0.0.1", 8400) is False
    assert host_allowed("127.0.0.1:8400", "127.0.0.1", 8400) is True
    assert host_allowed("[::1]:8400", "::1", 8400) is True


def _post_raw(port: int, head: bytes, body: bytes) -> tuple[int, dict]:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head_in, _, raw = data.partition(b"\r\n\r\n")
    return int(head_in.split(b" ")[1]), json.loads(raw)


@pytest.mark.parametrize("dup", [b"Host: evil.example:80\r\n", b"Origin: http://evil\r\n"
                                 b"Origin: http://evil2\r\n",
                                 b"Content-Type: text/plain\r\n"], ids=["host", "origin", "type"])
def test_duplicate_host_origin_or_content_type_is_refused(served, dup):
    body = json.dumps(GOOD).encode()
    head = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            % served.port) + dup
    status, answer = _post_raw(served.port, head, body)
    assert status == 400 and "more than one" in _one_line(answer), answer


def test_a_request_kwarg_may_not_name_a_protocol_parameter(tmp_path):
    p = tmp_path / "served.py"
    p.write_text(SERVED)
    r = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward", f"{p}:score",
                        "--request-kwarg", "completion", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and \
        "--request-kwarg completion names a parameter of the protocol" in r.stderr, r.stderr


PRINTS = '''
import sys
def score(completion):
    print(completion)
    sys.stderr.write("err:" + completion + "\\n")
    return 1.0
'''


def test_serve_reward_relays_a_functions_prints_sanitized(tmp_path):
    """B4 in serve-reward: a debugging print(completion) let any request write escape
    sequences and fake lines to the operator's terminal."""
    p = tmp_path / "printing.py"
    p.write_text(PRINTS)
    proc = subprocess.Popen([sys.executable, "-m", "mlx_rlaif.cli", "serve-reward",
                             f"{p}:score", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    port = int(re.search(r":(\d+)/", line).group(1))
    evil = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\nserving x on http://evil/"
    s = _Served(proc, f"http://127.0.0.1:{port}/")
    assert s.post({"items": [{"completion": evil}]}) == (200, {"rewards": [1.0]})
    time.sleep(1.0)  # the relay writes the lines it read
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    text = out + err
    assert "\x1b" not in text and "\x07" not in text, text
    assert not any(ln.startswith("serving") for ln in text.splitlines()), text
    assert "printing.py:score" in text and "\\x1b]52;c;" in text, text


@pytest.mark.parametrize("rewards, match", [
    (b"1" + b"0" * 400, "returned int of 401 digits"), (b"true", "returned bool True"),
    (b"{}", "returned an empty dict"), (b"1e308", "returned 1e+308, above 1e+100 in size")],
    ids=["401-digits", "true", "empty-dict", "1e308"])
def test_a_servers_hostile_reward_is_one_line_or_none(rewards, match):
    """B1 and the minor findings, from a server: a 401-digit JSON integer was an OverflowError
    traceback even under on_error unscorable, `true` read as 1.0, `{}` silently None."""
    from mlx_rlaif.errors import RewardError
    from mlx_rlaif.rewards.custom.components import ComponentsReward, Custom

    body = b'{"rewards": [' + rewards + b', 0.5]}'
    peer = _Peer(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                                           % len(body) + body))
    client = ServerClient(peer.url, "mlx-rlaif", {}, 10)
    tasks = [Task(id="t", prompt="p"), Task(id="u", prompt="p")]
    try:
        for on_error in ("stop", "unscorable"):
            reward = ComponentsReward([], [Custom("rm", 1.0, client.score, peer.url, True,
                                                  server=True)], on_error=on_error,
                                      max_error_frac=1.0)
            reward.customs[0].batched = False
            if on_error == "stop":
                with pytest.raises(RewardError, match=re.escape(
                        f"reward component rm ({peer.url}) on task t: {match}")):
                    reward.score(tasks, ["a", "b"])
            else:
                first, second = reward.score(tasks, ["a", "b"])
                assert first.value is None and match in first.reason and second.value == 0.5
    finally:
        peer.close()


def test_serve_reward_writes_its_error_lines_whole_under_concurrent_failures(monkeypatch):
    """Minor finding: serve-reward's error lines interleaved when requests failed at once (a
    line's text, then its newline, written apart). One lock around whole lines."""
    import io

    from mlx_rlaif.rewards.custom.server import _Server

    class Slow(io.StringIO):
        def write(self, s: str) -> int:
            time.sleep(0.002)
            return super().write(s)

    out = Slow()
    monkeypatch.setattr(sys, "stderr", out)
    server = _Server.__new__(_Server)

    def fail(k: int) -> None:
        for _ in range(5):
            try:
                raise ValueError(f"request {k}")
            except ValueError:
                _Server.handle_error(server, None, (f"10.0.0.{k}", 1))

    threads = [threading.Thread(target=fail, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == 41, lines
    for line in lines[:-1]:
        assert re.fullmatch(r"serve-reward: a request from 10\.0\.0\.(\d) failed: ValueError: "
                            r"'request \1'", line), line
