"""The answer cache behind ``degrade: [cache]``: earlier model answers, by model and prompt.

Entries live next to the runs, in the checkpoint store: a Redis string per entry (``PX`` TTL) under
the store's key prefix, or a row of the SQLite table ``answer_cache`` (expired rows are never
returned and are deleted when written over or swept). The key is a SHA-256 of the model name and
the normalised prompt, so no prompt text is kept in the key. A value read back is checked before
use (JSON with a string answer and a number time); anything else counts as a miss.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._protocol import CheckpointStore

__all__ = ["AnswerCache", "RedisAnswers", "SqliteAnswers", "answer_cache", "cache_key", "kept"]

MAX_ANSWER_CHARS = 256_000
"""Longer answers are not cached."""


def cache_key(model: str, prompt: str) -> str:
    """The entry's key: hex SHA-256 of the model and the normalised prompt."""
    return hashlib.sha256(f"{model}\x00{prompt}".encode("utf-8", "surrogatepass")).hexdigest()


def _decode(raw: Any) -> tuple[str, float] | None:
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    answer, stored_at = data.get("answer"), data.get("stored_at")
    if not isinstance(answer, str) or not isinstance(stored_at, int | float):
        return None
    return answer, float(stored_at)


class AnswerCache:
    """Get and put answers; subclasses hold them (in memory here, for the memory store)."""

    def __init__(self) -> None:
        self._mem: dict[str, tuple[str, float, float]] = {}

    async def get(self, key: str) -> tuple[str, float] | None:
        """``(answer, stored_at)`` for a live entry, else None."""
        hit = self._mem.get(key)
        if hit is None or hit[2] <= time.time():
            return None
        return hit[0], hit[1]

    async def put(self, key: str, answer: str, ttl_s: float) -> None:
        """Keep ``answer`` for ``ttl_s`` seconds (too long an answer is not kept)."""
        if len(answer) <= MAX_ANSWER_CHARS:
            now = time.time()
            self._mem[key] = (answer, now, now + ttl_s)


class RedisAnswers(AnswerCache):
    """Answers as Redis strings with a ``PX`` TTL under ``store``'s key prefix (a
    ``RedisStore``: its calls go through the store's own fallback and retry path)."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._store = store

    def _key(self, key: str) -> str:
        return str(self._store.keys.answer(key))

    async def get(self, key: str) -> tuple[str, float] | None:
        name = self._key(key)
        raw = await self._store._call(lambda: self._store._client.get(name), key=name)
        return None if raw is None else _decode(raw)

    async def put(self, key: str, answer: str, ttl_s: float) -> None:
        if len(answer) > MAX_ANSWER_CHARS:
            return
        name = self._key(key)
        value = json.dumps({"answer": answer, "stored_at": time.time()})
        ttl_ms = max(1, round(ttl_s * 1000))
        await self._store._call(lambda: self._store._client.set(name, value, px=ttl_ms), key=name)


class SqliteAnswers(AnswerCache):
    """Answers as rows of the table ``answer_cache`` in the SQLite file at ``path``."""

    _DDL = (
        "CREATE TABLE IF NOT EXISTS answer_cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
        "expires_at REAL NOT NULL)"
    )

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(str(self._path), timeout=5.0, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute(self._DDL)
            conn.commit()
            self._conn = conn
        return self._conn

    def _get(self, key: str) -> tuple[str, float] | None:
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT value FROM answer_cache WHERE key = ? AND expires_at > ?",
                    (key, time.time()),
                )
                .fetchone()
            )
        return None if row is None else _decode(row[0])

    def _put(self, key: str, answer: str, ttl_s: float) -> None:
        now = time.time()
        value = json.dumps({"answer": answer, "stored_at": now})
        with self._lock:
            db = self._db()
            db.execute("DELETE FROM answer_cache WHERE expires_at <= ?", (now,))
            db.execute(
                "INSERT OR REPLACE INTO answer_cache (key, value, expires_at) VALUES (?, ?, ?)",
                (key, value, now + ttl_s),
            )
            db.commit()

    async def get(self, key: str) -> tuple[str, float] | None:
        return await asyncio.to_thread(self._get, key)

    async def put(self, key: str, answer: str, ttl_s: float) -> None:
        if len(answer) <= MAX_ANSWER_CHARS:
            await asyncio.to_thread(self._put, key, answer, ttl_s)


_caches: weakref.WeakKeyDictionary[Any, AnswerCache] = weakref.WeakKeyDictionary()


def kept(store: object, make: Callable[[], AnswerCache]) -> AnswerCache:
    """The answer cache of ``store``, made by ``make`` the first time it is asked for: one per
    store object (for the stores' ``answer_cache()``)."""
    found = _caches.get(store)
    if found is None:
        found = _caches[store] = make()
    return found


def answer_cache(store: CheckpointStore) -> AnswerCache:
    """The answer cache kept in ``store``: whatever its ``answer_cache()`` gives (in Redis for a
    Redis store, in the file for a SQLite file store, in memory for a memory or read-only store;
    a wrapper such as the tracing one gives its inner store's)."""
    return store.answer_cache()
