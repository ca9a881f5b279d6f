"""A persistent cache of teacher answers: sqlite, one row per (provider, model, rubric version,
prompt, code), surviving restarts.

Covered: keys are a sha256 over the endpoint (provider, base URL, model), the rubric version, the
kind of call and the exact messages sent (which hold the task prompt and the code), so any change
to what the teacher is asked misses the cache. Values are the raw answer as JSON (re-parsed on
read, so re-weighting a rubric reuses them). WAL journal, autocommit, one connection behind a
lock: safe from several threads, and from several processes through sqlite's own locking.
`path=None` keeps the cache in memory for the life of the object.

Not covered: expiry or size limits (delete the file to start over); caching failures (only answers
the caller chose to `put` are kept). The API key is never part of a key or a value.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import ConfigError

_SCHEMA = """CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, model TEXT NOT NULL, rubric TEXT NOT NULL,
    value TEXT NOT NULL, created REAL NOT NULL)"""


def user_cache_path() -> Path:
    """The cache `mlx-rlaif score` keeps between runs: $XDG_CACHE_HOME/mlx-rlaif/ (default
    ~/.cache/mlx-rlaif/), so re-scoring a file with the same rubric and model pays nothing."""
    import os

    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "mlx-rlaif" / "teacher_cache.db"


def cache_key(*parts: str) -> str:
    """sha256 of the parts, unambiguously joined."""
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()


class AnswerCache:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            db.execute(_SCHEMA)
            return db
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = sqlite3.connect(self.path, timeout=30, check_same_thread=False,
                                 isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"teacher cache {self.path} cannot be used ({e}): delete it or set "
                              "reward.teacher.cache_path to another file") from None
        return db

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any, *, kind: str = "", model: str = "",
            rubric: str = "") -> None:
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):  # not plain finite JSON: do not cache it
            return
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?)",
                             (key, kind, model, rubric, text, time.time()))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
