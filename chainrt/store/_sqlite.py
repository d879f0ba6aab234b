"""The embedded checkpoint store: one SQLite file (WAL), zero set-up (DESIGN §4).

One connection is used directly on the event loop: a commit is a few tens of microseconds of
SQLite work, far cheaper than a hop to a thread. WAL mode with ``synchronous=NORMAL`` keeps a
commit to one append to the write-ahead log; a killed process loses nothing that was committed
and never leaves a half-written transaction (SQLite rolls it back on the next open). Only the
periodic checkpoint (log -> database file, with an fsync) runs on a small thread of its own, so
it never stalls the loop. Several processes may share the file: writers queue on SQLite's lock
for up to ``busy_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from .._errors import CheckpointError, RunNotFound, StoreUnavailable
from .._settings import get_settings
from ._codec import (
    FINAL_STATUSES,
    assemble_run,
    check_owner,
    decode_progress,
    decode_run,
    decode_step,
    encode,
    encode_trace,
    fenced,
    finished,
    no_lease,
    not_found,
)
from ._group import IterationGroup, Outcomes
from ._keys import check_run_id
from ._protocol import DEFAULT_MAX_RECORD_BYTES, CheckpointStore
from ._records import OwnerLease, RunProgress, RunRecord, RunStatus, StepRecord
from ._sqlite_ro import connect_read_only, read_only_refusal

__all__ = ["SQLiteStore"]

logger = logging.getLogger("chainrt.store")

_LAYOUT_VERSION = 2  # PRAGMA user_version of the tables below (1: the record lived in runs)
_PURGE_EVERY_S = 60.0  # create_run purges expired runs at most this often
_CHECKPOINT_EVERY = 256  # write transactions between two background checkpoints
_BACKSTOP_CHECKPOINT_PAGES = 16_000  # inline checkpoint only if the thread falls far behind

# The run as created (spec, input: tens of KB for a long chain) sits in run_records, apart from
# the few fields every commit changes: an UPDATE rewrites the whole row, and a commit that
# rewrote the spec would cost more the longer the chain (issue 12, finding 15).
_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    fencing_token INTEGER NOT NULL,
    progress TEXT,                  -- RunProgress JSON of the latest commit
    owner_host TEXT,
    owner_pid INTEGER,
    owner_expires_at REAL,
    budget_total_ms REAL,           -- set by a commit that gives a new budget, else NULL
    trace TEXT,                     -- set by a commit that gives new trace ids, else NULL
    expires_at REAL                 -- set once the run is final: purged after this
) WITHOUT ROWID"""
_SCHEMA = (
    _RUNS_TABLE,
    "CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_at DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_expiry ON runs (expires_at) WHERE expires_at IS NOT NULL",
    """
CREATE TABLE IF NOT EXISTS run_records (
    run_id TEXT PRIMARY KEY,
    record TEXT NOT NULL            -- RunRecord JSON as created, written once
)""",
    """
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    record TEXT NOT NULL,           -- StepRecord JSON
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID""",
)
# Layout 1 -> 2: the record column moves out of runs into run_records (rebuilding runs works on
# every SQLite version, where DROP COLUMN needs 3.35). Its indexes go with the old table and
# are made again by _SCHEMA.
_MIGRATE_FROM_1 = (
    "CREATE TABLE run_records (run_id TEXT PRIMARY KEY, record TEXT NOT NULL)",
    "INSERT INTO run_records (run_id, record) SELECT run_id, record FROM runs",
    "ALTER TABLE runs RENAME TO runs_layout_1",
    _RUNS_TABLE,
    "INSERT INTO runs SELECT run_id, status, created_at, updated_at, fencing_token, progress, "
    "owner_host, owner_pid, owner_expires_at, budget_total_ms, trace, expires_at "
    "FROM runs_layout_1",
    "DROP TABLE runs_layout_1",
)

# Every query spells out "(expires_at IS NULL OR expires_at > ?)": a run past its TTL is gone
# for readers at once, whether or not a purge has deleted its rows yet.
_SELECT_RUN = (
    "SELECT runs.run_id, status, fencing_token, run_records.record, progress, owner_host, "
    "owner_pid, owner_expires_at, updated_at, budget_total_ms, trace FROM runs "
    "JOIN run_records ON run_records.run_id = runs.run_id "
)
_GET_RUN_SQL = _SELECT_RUN + "WHERE runs.run_id = ? AND (expires_at IS NULL OR expires_at > ?)"
_LIST_SQL = (
    _SELECT_RUN + "WHERE (expires_at IS NULL OR expires_at > ?) "
    "ORDER BY created_at DESC, runs.run_id DESC LIMIT ?"
)
_LIST_STATUS_SQL = (
    _SELECT_RUN + "WHERE (expires_at IS NULL OR expires_at > ?) AND status = ? "
    "ORDER BY created_at DESC, runs.run_id DESC LIMIT ?"
)
_COMMIT_SQL = (
    "UPDATE runs SET status = ?, progress = ?, updated_at = ?, expires_at = ?, "
    "budget_total_ms = coalesce(?, budget_total_ms), trace = coalesce(?, trace), "
    "owner_host = CASE WHEN ? THEN NULL ELSE owner_host END, "
    "owner_pid = CASE WHEN ? THEN NULL ELSE owner_pid END, "
    "owner_expires_at = CASE WHEN ? THEN NULL ELSE owner_expires_at END "
    "WHERE run_id = ? AND fencing_token = ? AND (expires_at IS NULL OR expires_at > ?)"
)
# At most 1000 runs per purge keeps one purge short on the event loop. The same subquery picks
# the same runs in each statement (one transaction, one ``now``); runs goes last.
_PURGE_SQL = (
    "DELETE FROM steps WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
    "DELETE FROM run_records WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
    "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
)
# A run past its TTL but not purged yet must not block a new run of the same id.
_DROP_EXPIRED_SQL = (
    "DELETE FROM steps WHERE run_id IN (SELECT run_id FROM runs WHERE run_id = ? "
    "AND expires_at <= ?)",
    "DELETE FROM run_records WHERE run_id IN (SELECT run_id FROM runs WHERE run_id = ? "
    "AND expires_at <= ?)",
    "DELETE FROM runs WHERE run_id = ? AND expires_at <= ?",
)
_UPSERT_STEP_SQL = (
    "INSERT INTO steps (run_id, step_id, record) VALUES (?, ?, ?) "
    "ON CONFLICT (run_id, step_id) DO UPDATE SET record = excluded.record"
)


class _Commit(NamedTuple):
    """One commit, encoded, waiting for its transaction."""

    run_id: str
    token: int
    status: str
    progress: str
    budget_total_ms: float | None
    trace: str | None
    release: bool
    step: tuple[str, str] | None  # step id, record JSON


class SQLiteStore(CheckpointStore):
    """Checkpoint store in one SQLite file; ``path=None`` keeps it in memory (tests).

    ``record_ttl_s`` (default: ``CHAINRT_RECORD_TTL_S``) is how long a finished run is kept;
    running runs never expire. ``busy_timeout_s`` bounds the wait for another process's write.
    ``read_only`` opens the file without writing anything to it (``_sqlite_ro``); a write then
    raises CheckpointError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        record_ttl_s: float | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        busy_timeout_s: float = 5.0,
        read_only: bool = False,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.read_only = read_only and self.path is not None
        self.url = "sqlite:///:memory:" if self.path is None else f"sqlite:///{self.path}"
        if self.read_only:
            self.url += "?mode=ro"
        self.raw_url = self.url  # no secrets in a SQLite URL
        self.record_ttl_s = record_ttl_s if record_ttl_s is not None else _default_ttl()
        self.max_record_bytes = max_record_bytes
        self._busy_timeout_s = busy_timeout_s
        # The connection may be used from another thread than the one that opened it (a sync
        # wrapper running its own loop); the lock keeps each operation's transaction whole.
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: _Checkpointer | None = None
        self._last_purge = 0.0
        self._commits: IterationGroup[_Commit] = IterationGroup(self._write_commits)
        if self.read_only and self.path is not None:
            self._conn = connect_read_only(
                self.path,
                ";".join(_SCHEMA) + ";",
                url=self.url,
                layout_version=_LAYOUT_VERSION,
                busy_timeout_s=busy_timeout_s,
            )
            with self._guard():
                _read_layout_1(self._conn)
            return
        self._conn = self._open()
        if self.path is not None:
            self._checkpointer = _Checkpointer(self.path)

    # -- the protocol ------------------------------------------------------------------------

    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run (with its owner lease). CheckpointError if the id exists."""
        run_id = check_run_id(run.run_id)
        check_owner(run)
        data = encode(run, limit=self.max_record_bytes, what=f"run {run_id!r}").decode()
        now = time.time()
        owner = run.owner
        expires_at = now + self.record_ttl_s if run.status in FINAL_STATUSES else None
        with self._transaction() as conn:
            for sql in _DROP_EXPIRED_SQL:
                conn.execute(sql, (run_id, now))
            try:
                conn.execute(
                    "INSERT INTO runs (run_id, status, created_at, updated_at, fencing_token, "
                    "progress, owner_host, owner_pid, owner_expires_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                    (
                        run_id,
                        run.status,
                        run.created_at,
                        run.updated_at,
                        run.fencing_token,
                        owner.host if owner else None,
                        owner.pid if owner else None,
                        owner.expires_at if owner else None,
                        expires_at,
                    ),
                )
            except sqlite3.IntegrityError:
                stored = conn.execute(
                    "SELECT record FROM run_records WHERE run_id = ?", (run_id,)
                ).fetchone()
                if stored is not None and stored[0] == data:
                    return  # the very same create sent again (a retry): already done
                raise CheckpointError(
                    f"run {run_id!r} already exists in {self.url}; choose another run id, "
                    "or resume that run"
                ) from None
            conn.execute(
                "INSERT OR REPLACE INTO run_records (run_id, record) VALUES (?, ?)", (run_id, data)
            )
        if now - self._last_purge > _PURGE_EVERY_S:
            self._purge()

    async def get_run(self, run_id: str) -> RunRecord:
        """Load a run. RunNotFound if absent (or expired), CorruptRecord if unreadable."""
        with self._transaction(write=False) as conn:
            row = conn.execute(_GET_RUN_SQL, (check_run_id(run_id), time.time())).fetchone()
        if row is None:
            raise self._not_found(run_id)
        return self._assemble(row)

    async def get_steps(self, run_id: str) -> dict[str, StepRecord]:
        """All step records of a run, by step id. RunNotFound if the run is absent."""
        with self._transaction(write=False) as conn:
            found = conn.execute(
                "SELECT 1 FROM runs WHERE run_id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (check_run_id(run_id), time.time()),
            ).fetchone()
            rows = conn.execute(
                "SELECT step_id, record FROM steps WHERE run_id = ?", (run_id,)
            ).fetchall()
        if found is None:
            raise self._not_found(run_id)
        where = f"{self.url} table steps"
        return {
            step_id: decode_step(raw, run_id=run_id, step_id=step_id, where=where)
            for step_id, raw in rows
        }

    async def commit(
        self, run_id: str, token: int, progress: RunProgress, step: StepRecord | None = None
    ) -> None:
        """Write ``step`` (if any) and ``progress`` in one transaction; FencedOut if stale.

        Commits of concurrent runs that arrive in the same loop iteration as another share one
        transaction (group commit, ``_group``); each is still checked and applied on its own.
        """
        check_run_id(run_id)
        limit = self.max_record_bytes
        progress_data = encode(progress, limit=limit, what=f"progress of run {run_id!r}")
        step_row = None
        if step is not None:
            what = f"step {step.step_id!r} of run {run_id!r}"
            step_row = (step.step_id, encode(step, limit=limit, what=what).decode())
        trace = None if progress.trace is None else encode_trace(progress.trace).decode()
        await self._commits.submit(
            _Commit(
                run_id,
                token,
                progress.status,
                progress_data.decode(),
                progress.budget_total_ms,
                trace,
                progress.release_owner,
                step_row,
            )
        )

    def _write_commits(self, commits: list[_Commit]) -> Outcomes:
        """Apply ``commits`` in one transaction: each is fenced on its own; one refused commit
        writes nothing of its own and leaves the others be."""
        now = time.time()
        expires_at = now + self.record_ttl_s
        outcomes: Outcomes = []
        with self._transaction() as conn:
            for c in commits:
                release = c.release
                cursor = conn.execute(
                    _COMMIT_SQL,
                    (
                        c.status,
                        c.progress,
                        now,
                        expires_at if c.status in FINAL_STATUSES else None,
                        c.budget_total_ms,
                        c.trace,
                        release,
                        release,
                        release,
                        c.run_id,
                        c.token,
                        now,
                    ),
                )
                if cursor.rowcount == 0:
                    outcomes.append(self._why_not_written(conn, c.run_id, c.token, now))
                    continue
                if c.step is not None:
                    conn.execute(_UPSERT_STEP_SQL, (c.run_id, *c.step))
                outcomes.append(None)
        return outcomes

    async def claim(self, run_id: str, expected_token: int, owner: OwnerLease) -> int:
        """Compare-and-set the fencing token; the new token is ``expected_token + 1``."""
        check_run_id(run_id)
        new_token = expected_token + 1
        now = time.time()
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT status, fencing_token FROM runs "
                "WHERE run_id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (run_id, now),
            ).fetchone()
            if row is None:
                raise self._not_found(run_id)
            status, current = row
            if status == "completed":
                raise finished(run_id, status)
            if current != expected_token:
                raise fenced(run_id, expected_token, current, action="claim")
            conn.execute(
                "UPDATE runs SET fencing_token = ?, owner_host = ?, owner_pid = ?, "
                "owner_expires_at = ?, updated_at = ?, status = 'running', expires_at = NULL "
                "WHERE run_id = ?",
                (new_token, owner.host, owner.pid, owner.expires_at, now, run_id),
            )
        owner.token = new_token
        return new_token

    async def renew(self, run_id: str, token: int, expires_at: float) -> None:
        """Extend the owner lease to ``expires_at``; FencedOut if ``token`` is stale."""
        check_run_id(run_id)
        now = time.time()
        with self._transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET owner_expires_at = ? WHERE run_id = ? AND fencing_token = ? "
                "AND owner_host IS NOT NULL AND (expires_at IS NULL OR expires_at > ?)",
                (expires_at, run_id, token, now),
            )
            if cursor.rowcount == 0:
                raise self._why_not_written(conn, run_id, token, now, renewing=True)

    async def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs, newest first, optionally only those with ``status``; corrupt ones are skipped."""
        if limit < 0:
            raise CheckpointError(f"list_runs limit must be >= 0, got {limit}")
        self._purge()
        now = time.time()
        with self._transaction(write=False) as conn:
            if status is None:
                rows = conn.execute(_LIST_SQL, (now, limit)).fetchall()
            else:
                rows = conn.execute(_LIST_STATUS_SQL, (now, status, limit)).fetchall()
        runs = []
        for row in rows:
            try:
                runs.append(self._assemble(row))
            except CheckpointError as exc:
                logger.warning("list_runs skips run %r: %s", row[0], exc)
        return runs

    async def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- internals ---------------------------------------------------------------------------

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
            # Checkpoints run on the _Checkpointer's thread; this is only the backstop.
            conn.execute(f"PRAGMA wal_autocheckpoint = {_BACKSTOP_CHECKPOINT_PAGES}")
            self._bring_layout(conn)
        self._purge()
        return conn

    def _bring_layout(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or bring an older layout up to this one, in one write transaction.

        The layout version is read inside the transaction: of several processes opening an old
        file at once, the first migrates it and the others find it migrated.
        """
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _LAYOUT_VERSION:
                raise CheckpointError(
                    f"the SQLite store {self.url} was created by a newer chainrt (table layout "
                    f"{version}, this one knows {_LAYOUT_VERSION}); upgrade chainrt"
                )
            migrate = _MIGRATE_FROM_1 if version == 1 else ()
            for statement in (*migrate, *_SCHEMA):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {_LAYOUT_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            conn.close()
            raise

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

    def _purge(self) -> None:
        """Delete runs (and their steps) whose TTL has passed; running runs never expire."""
        if self.read_only:
            return  # readers skip expired runs in every query; the next writer purges them
        now = time.time()
        self._last_purge = now
        with self._transaction() as conn:
            for sql in _PURGE_SQL:
                conn.execute(sql, (now,))

    def _assemble(self, row: tuple[Any, ...]) -> RunRecord:
        run_id, status, token, raw, raw_progress, host, pid, owner_expires_at, updated_at = row[:9]
        where = f"{self.url} table runs"
        base = decode_run(raw, run_id=run_id, where=where)
        progress = None
        if raw_progress is not None:
            progress = decode_progress(raw_progress, run_id=run_id, where=where)
        return assemble_run(
            base,
            status=status,
            token=token,
            progress=progress,
            owner_host=host,
            owner_pid=pid,
            owner_expires_at=owner_expires_at,
            updated_at=updated_at,
            budget_total_ms=row[9],
            trace=row[10],
            where=where,
        )

    def _why_not_written(
        self, conn: sqlite3.Connection, run_id: str, token: int, now: float, renewing: bool = False
    ) -> CheckpointError:
        row = conn.execute(
            "SELECT fencing_token FROM runs "
            "WHERE run_id = ? AND (expires_at IS NULL OR expires_at > ?)",
            (run_id, now),
        ).fetchone()
        if row is None:
            return self._not_found(run_id)
        if row[0] != token:
            return fenced(run_id, token, row[0], action="renew" if renewing else "commit")
        return no_lease(run_id)

    def _not_found(self, run_id: str) -> RunNotFound:
        return not_found(run_id, self.url)


def _read_layout_1(conn: sqlite3.Connection) -> None:
    """A layout-1 file opened read-only cannot be migrated: a temporary view (in the connection's
    own temp database, written nowhere) gives the queries the run_records table they read."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == 1:
        conn.execute("CREATE TEMP VIEW run_records AS SELECT run_id, record FROM main.runs")


def _default_ttl() -> float:
    return get_settings().record_ttl_s


class _Checkpointer:
    """Copies the write-ahead log into the database file, on a thread of its own.

    A checkpoint fsyncs. Run inline (SQLite's autocheckpoint) it stalls the committing call, and
    with it the event loop, for milliseconds every few hundred commits. Here it runs beside the
    loop (sqlite3 releases the GIL while it works) in PASSIVE mode, which never blocks a writer.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._writes = 0
        self._stopping = False
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"chainrt-checkpoint-{path.name}", daemon=True
        )
        self._thread.start()

    def wrote(self) -> None:
        """Count one write transaction; wake the thread every ``_CHECKPOINT_EVERY``."""
        self._writes += 1
        if self._writes >= _CHECKPOINT_EVERY:
            self._writes = 0
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (waits for a checkpoint in progress)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None)
        except sqlite3.Error as exc:
            logger.warning("no background checkpoints for %s: %s", self._path, exc)
            return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the inline backstop still bounds the log
                    logger.warning("background checkpoint of %s failed: %s", self._path, exc)
        finally:
            conn.close()
