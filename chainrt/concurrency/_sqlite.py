"""Concurrency keys in the embedded store's SQLite file: limits hold across the processes of a host.

The same rules as the other limiters, kept in three tables of the store's own file (so every
``chainrt`` process that shares the store shares the limits)::

    ck_holders  (key, member) -> iid, lease expiry    a live slot
    ck_queue    (key, ticket) -> member, iid, expiry   the FIFO line of waiters
    ck_rate     key -> GCRA theoretical arrival time   rate-limited keys only

Each try is one ``BEGIN IMMEDIATE`` transaction run straight on the event loop, like the store's
commits (a few tens of microseconds; SQLite's file lock orders the processes). Slots and tickets
are leases: a thread of the limiter renews those of this instance every third of the TTL, so the
slots of a killed process lapse within one TTL. Times are wall-clock (``time.time()``), the one
clock the processes of a host share.

There is no cross-process wake-up channel: a waiter in this process is woken at once by a
release in this process, and looks again for releases by other processes every 2 ms when first
in line, 4 ms when second, and so on up to 20 ms.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .._errors import ConcurrencyError
from ._driver import GRANTED, Attempt, BaseLimiter, holder_of
from ._protocol import KeyRequest, KeyState
from ._wake import Wake

__all__ = ["SQLiteLimiter"]

logger = logging.getLogger("chainrt.concurrency")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ck_holders (
    key TEXT NOT NULL,
    member TEXT NOT NULL,
    iid TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, member)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ck_holders_by_iid ON ck_holders (iid);
CREATE TABLE IF NOT EXISTS ck_queue (
    key TEXT NOT NULL,
    ticket INTEGER NOT NULL,
    member TEXT NOT NULL,
    iid TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, ticket)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS ck_queue_by_member ON ck_queue (key, member);
CREATE INDEX IF NOT EXISTS ck_queue_by_iid ON ck_queue (iid);
CREATE TABLE IF NOT EXISTS ck_rate (
    key TEXT PRIMARY KEY,
    tat REAL NOT NULL
) WITHOUT ROWID;
"""

_POLL_S = 0.02
"""Longest sleep of a waiter between two looks (how soon it sees another process's release)."""

_LINE_POLL_S = 0.002
"""The same for the first in line; the n-th in line looks every n times this (at most _POLL_S)."""

_SWEEP_EVERY = 1024
"""Releases between two sweeps of rate rows whose arrival time has passed."""


class SQLiteLimiter(BaseLimiter):
    """Concurrency keys in a SQLite file, shared by every process that opens the same file.

    ``lease_ttl_s`` is how soon the slots and tickets of a killed process free themselves.
    ``close()`` gives back what this instance still holds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl_s: float = 10.0,
        busy_timeout_s: float = 5.0,
    ) -> None:
        super().__init__()
        if not (isinstance(lease_ttl_s, int | float) and math.isfinite(lease_ttl_s)) or not (
            0.05 <= lease_ttl_s <= 86_400
        ):
            raise ConcurrencyError(
                f"lease_ttl_s must be between 0.05 and 86400 seconds, got {lease_ttl_s!r}"
            )
        self.path = Path(path)
        self.lease_ttl_s = float(lease_ttl_s)
        self.poll_s = min(_POLL_S, self.lease_ttl_s / 3)
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()  # one transaction at a time on the shared connection
        self._waiters: dict[str, dict[str, Wake]] = {}  # key -> member -> wake (this process)
        self._wlock = threading.Lock()
        self._releases = 0
        self._conn: sqlite3.Connection | None = self._connect()
        self._renewer = _Renewer(self)

    # ------------------------------------------------------------------ backend primitives

    async def _try(self, req: KeyRequest, member: str, wake: Wake) -> Attempt:
        with self._tx() as conn:
            attempt = self._try_in(conn, req, member)
        if not attempt.granted:
            with self._wlock:
                self._waiters.setdefault(req.key, {})[member] = wake
        return attempt

    def _try_in(self, conn: sqlite3.Connection, req: KeyRequest, member: str) -> Attempt:
        key, now = req.key, time.time()
        expiry = now + self.lease_ttl_s
        conn.execute("DELETE FROM ck_holders WHERE key = ? AND expires_at <= ?", (key, now))
        conn.execute("DELETE FROM ck_queue WHERE key = ? AND expires_at <= ?", (key, now))
        if conn.execute(
            "SELECT 1 FROM ck_holders WHERE key = ? AND member = ?", (key, member)
        ).fetchone():
            return GRANTED
        holders = conn.execute("SELECT count(*) FROM ck_holders WHERE key = ?", (key,)).fetchone()[
            0
        ]
        row = conn.execute(
            "SELECT ticket FROM ck_queue WHERE key = ? AND member = ?", (key, member)
        ).fetchone()
        if row is None:
            ahead = conn.execute("SELECT count(*) FROM ck_queue WHERE key = ?", (key,)).fetchone()[
                0
            ]
        else:
            ahead = conn.execute(
                "SELECT count(*) FROM ck_queue WHERE key = ? AND ticket < ?", (key, row[0])
            ).fetchone()[0]
        retry_in: float | None = None
        grant = False
        if ahead < req.limit - holders:
            if req.rate_per_s is None:
                grant = True
            elif ahead == 0:
                interval = 1.0 / req.rate_per_s
                stored = conn.execute("SELECT tat FROM ck_rate WHERE key = ?", (key,)).fetchone()
                tat = max(stored[0] if stored else 0.0, now)
                allow_at = tat - (req.burst - 1) * interval
                if allow_at <= now:
                    conn.execute(
                        "INSERT OR REPLACE INTO ck_rate (key, tat) VALUES (?, ?)",
                        (key, tat + interval),
                    )
                    grant = True
                else:
                    retry_in = allow_at - now
        if grant:
            conn.execute(
                "INSERT INTO ck_holders (key, member, iid, expires_at) VALUES (?, ?, ?, ?)",
                (key, member, self._iid, expiry),
            )
            if row is not None:
                conn.execute("DELETE FROM ck_queue WHERE key = ? AND member = ?", (key, member))
            return GRANTED
        if row is None:
            conn.execute(
                "INSERT INTO ck_queue (key, ticket, member, iid, expires_at) SELECT ?, "
                "coalesce(max(ticket), 0) + 1, ?, ?, ? FROM ck_queue WHERE key = ?",
                (key, member, self._iid, expiry, key),
            )
        else:
            conn.execute(
                "UPDATE ck_queue SET expires_at = ? WHERE key = ? AND member = ?",
                (expiry, key, member),
            )
        rate_limited = retry_in is not None
        if retry_in is None:  # not a rate wait: only how soon to look again
            retry_in = min(_POLL_S, _LINE_POLL_S * (ahead + 1))
        return Attempt(
            granted=False,
            retry_in_s=retry_in,
            rate_limited=rate_limited,
            ahead=ahead,
            holders=holders,
        )

    async def _forget(self, requests: Sequence[KeyRequest], member: str, *, undo: bool) -> None:
        # No await in here: a try for this member cannot be half done (each is one transaction).
        keys = [req.key for req in requests]
        try:
            with self._tx() as conn:
                for key in keys:
                    conn.execute(
                        "DELETE FROM ck_holders WHERE key = ? AND member = ?", (key, member)
                    )
                    conn.execute("DELETE FROM ck_queue WHERE key = ? AND member = ?", (key, member))
                self._releases += 1
                if self._releases % _SWEEP_EVERY == 0:
                    conn.execute("DELETE FROM ck_rate WHERE tat <= ?", (time.time(),))
        except ConcurrencyError as exc:  # the leases lapse by themselves within one TTL
            logger.warning("could not give back %s for %s: %s", keys, holder_of(member), exc)
        self._wake_local(keys, member)

    def _unregister(self, member: str) -> None:
        with self._wlock:
            for key in [k for k, waiting in self._waiters.items() if waiting.pop(member, None)]:
                if not self._waiters[key]:
                    del self._waiters[key]

    def _wake_local(self, keys: list[str], gone: str) -> None:
        """Wake this process's waiters on ``keys`` (they look again; others poll)."""
        with self._wlock:
            wakes = [
                wake
                for key in keys
                for member, wake in self._waiters.get(key, {}).items()
                if member != gone
            ]
        for wake in wakes:
            wake.set()

    # ------------------------------------------------------------------ the contract

    async def snapshot(self, key: str) -> KeyState:
        """Live holders and waiters of ``key`` in every process sharing the file."""
        now = time.time()
        with self._tx(write=False) as conn:
            holders = conn.execute(
                "SELECT member FROM ck_holders WHERE key = ? AND expires_at > ? ORDER BY member",
                (key, now),
            ).fetchall()
            waiting = conn.execute(
                "SELECT member FROM ck_queue WHERE key = ? AND expires_at > ? ORDER BY ticket",
                (key, now),
            ).fetchall()
        return KeyState(
            key, tuple(holder_of(m) for (m,) in holders), tuple(holder_of(m) for (m,) in waiting)
        )

    async def close(self) -> None:
        """Stop renewing and give back every slot and ticket this instance still has."""
        if self._closed:
            return
        self._closed = True
        self._renewer.stop()
        try:
            with self._tx() as conn:
                conn.execute("DELETE FROM ck_holders WHERE iid = ?", (self._iid,))
                conn.execute("DELETE FROM ck_queue WHERE iid = ?", (self._iid,))
        except ConcurrencyError as exc:
            logger.warning("closing the limiter: %s (its leases lapse by themselves)", exc)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------------ internals

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
        except (OSError, sqlite3.Error) as exc:
            raise ConcurrencyError(
                f"cannot open the concurrency keys in {self.path}: {exc}; the store's directory "
                "must be writable for chain runs"
            ) from None
        return conn

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction (IMMEDIATE for writes); sqlite3 errors become ConcurrencyError."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise ConcurrencyError("this limiter is closed; open a new one")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                    if conn.in_transaction:
                        conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.rollback()
                    raise
            except sqlite3.Error as exc:
                raise ConcurrencyError(
                    f"concurrency keys in {self.path} failed: {exc}; try again"
                ) from None


class _Renewer:
    """Extends the leases of one limiter's slots and tickets every third of the TTL (a thread).

    A thread, not a task: the limiter may serve several event loops, and a loop busy with a long
    step must not let the slots it holds lapse.
    """

    def __init__(self, limiter: SQLiteLimiter) -> None:
        self._path = limiter.path
        self._iid = limiter._iid
        self._ttl_s = limiter.lease_ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"chainrt-ck-renew-{self._iid[:6]}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (waits for a renewal in progress)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, timeout=self._ttl_s / 3, isolation_level=None)
        except sqlite3.Error as exc:
            logger.warning("concurrency leases in %s will not be renewed: %s", self._path, exc)
            return
        try:
            while not self._stop.wait(self._ttl_s / 3):
                expiry = time.time() + self._ttl_s
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(
                        "UPDATE ck_holders SET expires_at = ? WHERE iid = ?", (expiry, self._iid)
                    )
                    conn.execute(
                        "UPDATE ck_queue SET expires_at = ? WHERE iid = ?", (expiry, self._iid)
                    )
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:  # try again at the next tick
                    if conn.in_transaction:
                        conn.rollback()
                    logger.warning("renewing concurrency leases in %s: %s", self._path, exc)
        finally:
            conn.close()
