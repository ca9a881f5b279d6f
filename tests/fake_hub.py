"""A local fake of the Hugging Face Hub's upload API on 127.0.0.1, for `--push` tests with
huggingface_hub's real client (HF_ENDPOINT points it here).

Covered: `create_repo` (POST /api/repos/create), the README's YAML check
(POST /api/validate-yaml), `upload_folder`'s preupload (every file "regular": sent inline) and
commit (NDJSON: header, base64 files) endpoints. Every request is recorded with its
Authorization header; files land in `repos[repo_id]`. Anything else answers 404 and is recorded,
so a test sees an unexpected call.

Not covered: LFS and Xet uploads (large files), deletions, branches, pull requests.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROUTE = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)/(preupload|commit)/([^/?]+)")


class FakeHub:
    def __init__(self, fail_status: int | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.repos: dict[str, dict[str, bytes]] = {}
        self.fail_status = fail_status  # answer every request with this status
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, "GET")

            def do_POST(self) -> None:
                hub._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        if h.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.requests.append({"method": method, "path": h.path,
                              "auth": h.headers.get("Authorization")})
        if self.fail_status:
            return self._reply(h, self.fail_status, {"error": "refused by the fake hub"})
        if method == "POST" and h.path == "/api/repos/create":
            req = json.loads(body)
            self.created.append(req)
            repo = f"{req.get('organization') or 'me'}/{req['name']}"
            self.repos.setdefault(repo, {})
            return self._reply(h, 200, {"url": f"{self.url}/{repo}", "name": repo})
        if method == "POST" and h.path.startswith("/api/validate-yaml"):
            return self._reply(h, 200, {})
        m = ROUTE.match(h.path)
        if method == "POST" and m and m.group(3) == "preupload":
            files = json.loads(body)["files"]
            return self._reply(h, 200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                for f in files]})
        if method == "POST" and m and m.group(3) == "commit":
            repo = m.group(2)
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    v = item["value"]
                    self.repos.setdefault(repo, {})[v["path"]] = base64.b64decode(v["content"])
            return self._reply(h, 200, {"commitUrl": f"{self.url}/{repo}/commit/{'0' * 40}",
                                        "commitOid": "0" * 40, "pullRequestUrl": None})
        return self._reply(h, 404, {"error": f"the fake hub has no {method} {h.path}"})

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
