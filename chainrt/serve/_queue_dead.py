"""Where the in-process queue (``_queue_local``) keeps its dead letters.

:class:`DeadLetterBook` holds them in memory (an in-memory store: nothing outlives the process
anyway); :class:`SqliteDeadLetters` in the table ``dead_letters`` of the SQLite store's file
(table layout 4, ``store._sqlite_schema``), so that a restarted ``chainrt serve`` still shows,
retries and drops the letters of the one before. A letter is stored as the JSON object of its
text fields (:meth:`DeadLetter.fields`) and read back with ``json.loads`` and
:meth:`DeadLetter.parse` only.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from pathlib import Path

from .._errors import StoreUnavailable
from ..store._sqlite_schema import DEAD_LETTERS_TABLE
from ..store._url import sqlite_path, sqlite_read_only
from ._queue_base import DeadLetter

__all__ = ["DeadLetterBook", "SqliteDeadLetters", "dead_letter_book"]

log = logging.getLogger("chainrt.serve")


class DeadLetterBook:
    """Dead letters in memory, oldest first (lost with the process)."""

    def __init__(self) -> None:
        self._dead: dict[str, DeadLetter] = {}

    async def add(self, letter: DeadLetter) -> None:
        """Keep ``letter`` (its id is new)."""
        self._dead[letter.id] = letter

    async def oldest(self, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` letters, oldest first."""
        return list(self._dead.values())[: max(0, limit)]

    async def get(self, dead_id: str) -> DeadLetter | None:
        """One letter; None if absent."""
        return self._dead.get(dead_id)

    async def pop(self, dead_id: str) -> DeadLetter | None:
        """Remove one letter and return it; None if absent."""
        return self._dead.pop(dead_id, None)

    async def count(self) -> int:
        """How many letters there are."""
        return len(self._dead)

    async def close(self) -> None:
        """Release what the book holds."""


class SqliteDeadLetters(DeadLetterBook):
    """Dead letters in the table ``dead_letters`` of the SQLite file at ``path``, over a
    connection of their own (dead letters are rare: each call is one short statement, run on
    the event loop as the SQLite store runs its own)."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        super().__init__()
        self.path = path
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                str(self.path),
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            # The store made the table when it opened the file (layout 4); this only covers a
            # book opened on a file no store has opened yet.
            conn.execute(DEAD_LETTERS_TABLE)
            self._conn = conn
        return self._conn

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            with self._lock:
                return self._db().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                f"the dead letters in the SQLite store sqlite:///{self.path} cannot be read or "
                f"written: {exc}",
                retryable=isinstance(exc, sqlite3.OperationalError),
            ) from None

    async def add(self, letter: DeadLetter) -> None:
        self._run(
            "INSERT INTO dead_letters (id, letter) VALUES (?, ?)",
            (letter.id, json.dumps(letter.fields())),
        )

    async def oldest(self, limit: int) -> list[DeadLetter]:
        rows = self._run(
            "SELECT id, letter FROM dead_letters ORDER BY seq LIMIT ?", (max(0, limit),)
        )
        return [letter for row in rows if (letter := _letter(row)) is not None]

    async def get(self, dead_id: str) -> DeadLetter | None:
        rows = self._run("SELECT id, letter FROM dead_letters WHERE id = ?", (dead_id,))
        return _letter(rows[0]) if rows else None

    async def pop(self, dead_id: str) -> DeadLetter | None:
        rows = self._run("DELETE FROM dead_letters WHERE id = ? RETURNING id, letter", (dead_id,))
        return _letter(rows[0]) if rows else None

    async def count(self) -> int:
        rows = self._run("SELECT count(*) FROM dead_letters")
        return int(str(rows[0][0]))

    async def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _letter(row: tuple[object, ...]) -> DeadLetter | None:
    """The letter of one row; None (logged) for a row that is not one."""
    dead_id, raw = row
    try:
        fields = json.loads(str(raw))
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        log.warning("dead letter %s: its stored fields are not a JSON object; skipped", dead_id)
        return None
    return DeadLetter.parse(str(dead_id), fields)


def dead_letter_book(store_url: str) -> DeadLetterBook:
    """The book for a queue beside the store at ``store_url``: in the file of a writable SQLite
    store, else in memory."""
    if store_url.lower().startswith("sqlite:"):
        path = sqlite_path(store_url)
        if path is not None and not sqlite_read_only(store_url):
            return SqliteDeadLetters(path)
    return DeadLetterBook()
