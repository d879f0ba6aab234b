"""The SQLite store's connection: opening the file, one transaction at a time, error mapping.

``SQLiteConnection`` is the base of ``SQLiteStore``: it opens the file (WAL, ``synchronous=NORMAL``,
the schema brought to the current layout), runs each operation in one transaction under a lock
(the connection may be used from another thread than the one that opened it), turns sqlite3
errors into one-line chainrt errors naming the store, and stops the background WAL checkpoints
on close.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import CheckpointError, StoreUnavailable
from ._sqlite_checkpoint import BACKSTOP_CHECKPOINT_PAGES, Checkpointer
from ._sqlite_ro import read_only_refusal
from ._sqlite_schema import bring_layout

__all__ = ["SQLiteConnection"]


class SQLiteConnection:
    """One SQLite connection used directly on the event loop, one transaction at a time."""

    def __init__(
        self, path: str | os.PathLike[str] | None, *, busy_timeout_s: float, read_only: bool
    ) -> None:
        self.path = None if path is None else Path(path)
        self.read_only = read_only and self.path is not None
        self.url = "sqlite:///:memory:" if self.path is None else f"sqlite:///{self.path}"
        if self.read_only:
            self.url += "?mode=ro"
        self._busy_timeout_s = busy_timeout_s
        # The connection may be used from another thread than the one that opened it (a sync
        # wrapper running its own loop); the lock keeps each operation's transaction whole.
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: Checkpointer | None = None

    async def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _open(self) -> sqlite3.Connection:
        target = ":memory:" if self.path is None else str(self.path)
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, nothing implicit.
            conn = sqlite3.connect(
                target, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(
                f"cannot open the SQLite checkpoint store {self.url}: {exc}; check that the "
                "directory exists and is writable",
                retryable=False,
            ) from None
        self._conn = conn
        with self._guard():
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Checkpoints run on the Checkpointer's thread; this is only the backstop.
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_CHECKPOINT_PAGES}")
            bring_layout(conn, self.url)
        return conn

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn sqlite3 errors into chainrt errors naming the store."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise StoreUnavailable(
                    f"the SQLite store {self.url} stayed locked by another process for "
                    f"{self._busy_timeout_s:g}s ({text}); try again",
                    retryable=True,
                ) from None
            raise StoreUnavailable(
                f"the SQLite store {self.url} failed: {text}", retryable=False
            ) from None
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"the SQLite store {self.url} is not usable: {exc}; move the file aside and "
                "start a new store"
            ) from None

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction (IMMEDIATE for writes: take the write lock before reading)."""
        if write and self.read_only:
            raise read_only_refusal(self.url)
        with self._lock, self._guard():
            conn = self._conn
            if conn is None:
                raise CheckpointError(f"the store {self.url} is closed")
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
                if write and self._checkpointer is not None:
                    self._checkpointer.wrote()
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
