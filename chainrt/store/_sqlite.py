"""The embedded checkpoint store: one SQLite file (WAL), zero set-up.

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
import time
from typing import NamedTuple

from .._errors import CheckpointError, RunNotFound
from .._records import OwnerLease, RunProgress, RunRecord, RunStatus, StepRecord
from .._settings import get_settings
from ..redis.keys import check_run_id
from ._answers import AnswerCache, SqliteAnswers, kept
from ._codec import (
    FINAL_STATUSES,
    check_owner,
    decode_step,
    encode,
    encode_trace,
    fenced,
    finished,
    no_lease,
    not_found,
)
from ._group import IterationGroup, Outcomes
from ._protocol import DEFAULT_MAX_RECORD_BYTES, CheckpointStore
from ._signals import SqliteSignals
from ._sqlite_checkpoint import Checkpointer
from ._sqlite_conn import SQLiteConnection
from ._sqlite_ro import connect_read_only
from ._sqlite_schema import (
    COMMIT_SQL,
    DROP_EXPIRED_SQL,
    GET_RUN_SQL,
    INSERT_RUN_SQL,
    LAYOUT_VERSION,
    PURGE_SQL,
    SCHEMA,
    UPSERT_STEP_SQL,
    list_sql,
    read_old_layout,
    run_from_row,
)

__all__ = ["SQLiteStore"]

logger = logging.getLogger("chainrt.store")

_PURGE_EVERY_S = 60.0  # create_run purges expired runs at most this often


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


class SQLiteStore(SqliteSignals, SQLiteConnection, CheckpointStore):
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
        super().__init__(path, busy_timeout_s=busy_timeout_s, read_only=read_only)
        self.raw_url = self.url  # no secrets in a SQLite URL
        self.record_ttl_s = record_ttl_s if record_ttl_s is not None else _default_ttl()
        self.max_record_bytes = max_record_bytes
        self._last_purge = 0.0
        self._commits: IterationGroup[_Commit] = IterationGroup(self._write_commits)
        if self.read_only and self.path is not None:
            self._conn = connect_read_only(
                self.path,
                ";".join(SCHEMA) + ";",
                url=self.url,
                layout_version=LAYOUT_VERSION,
                busy_timeout_s=busy_timeout_s,
            )
            with self._guard():
                read_old_layout(self._conn)
            return
        self._conn = self._open()
        self._purge()
        if self.path is not None:
            self._checkpointer = Checkpointer(self.path)

    # -- the protocol ------------------------------------------------------------------------

    def answer_cache(self) -> AnswerCache:
        """Answers in the table ``answer_cache`` of the file (shared by every process on it); in
        memory for an in-memory or read-only store."""
        path = self.path
        if path is None or self.read_only:
            return super().answer_cache()
        return kept(self, lambda: SqliteAnswers(path))

    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run (with its owner lease). CheckpointError if the id exists."""
        run_id = check_run_id(run.run_id)
        check_owner(run)
        data = encode(run, limit=self.max_record_bytes, what=f"run {run_id!r}").decode()
        now = time.time()
        owner = run.owner
        expires_at = now + self.record_ttl_s if run.status in FINAL_STATUSES else None
        row = (
            run_id,
            run.status,
            run.created_at,
            run.updated_at,
            run.fencing_token,
            owner.host if owner else None,
            owner.pid if owner else None,
            owner.expires_at if owner else None,
            expires_at,
            run.chain,
        )
        with self._transaction() as conn:
            try:
                conn.execute(INSERT_RUN_SQL, row)
            except sqlite3.IntegrityError:
                # The id is taken. A run past its TTL but not purged yet must not block a new
                # run of the same id: drop it and insert again (a statement that failed on a
                # constraint is undone alone; the transaction goes on).
                for sql in DROP_EXPIRED_SQL:
                    conn.execute(sql, (run_id, now))
                try:
                    conn.execute(INSERT_RUN_SQL, row)
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
            row = conn.execute(GET_RUN_SQL, (check_run_id(run_id), time.time())).fetchone()
        if row is None:
            raise self._not_found(run_id)
        return run_from_row(row, self.url)

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
                    COMMIT_SQL,
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
                        c.status,
                    ),
                )
                if cursor.rowcount == 0:
                    outcomes.append(self._why_not_written(conn, c.run_id, c.token, now))
                    continue
                if c.step is not None:
                    conn.execute(UPSERT_STEP_SQL, (c.run_id, *c.step))
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

    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 100,
        *,
        before: tuple[float, str] | None = None,
        chain: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, optionally only those with ``status`` and of ``chain`` (each
        filter walks its own index); corrupt ones are skipped. ``before`` (``created_at,
        run_id`` of the last run of the page before) starts after it, on the index (no
        offset)."""
        if limit < 0:
            raise CheckpointError(f"list_runs limit must be >= 0, got {limit}")
        self._purge()
        args: list[object] = [time.time()]
        if status is not None:
            args.append(status)
        if chain is not None:
            args.append(chain)
        if before is not None:
            args += [float(before[0]), str(before[1])]
        args.append(limit)
        sql = list_sql(
            status=status is not None, chain=chain is not None, before=before is not None
        )
        with self._transaction(write=False) as conn:
            rows = conn.execute(sql, args).fetchall()
        runs = []
        for row in rows:
            try:
                runs.append(run_from_row(row, self.url))
            except CheckpointError as exc:
                logger.warning("list_runs skips run %r: %s", row[0], exc)
        return runs

    # -- internals ---------------------------------------------------------------------------

    def _purge(self) -> None:
        """Delete runs (and their steps) whose TTL has passed; running runs never expire."""
        if self.read_only:
            return  # readers skip expired runs in every query; the next writer purges them
        now = time.time()
        self._last_purge = now
        with self._transaction() as conn:
            for sql in PURGE_SQL:
                conn.execute(sql, (now,))

    def _why_not_written(
        self, conn: sqlite3.Connection, run_id: str, token: int, now: float, renewing: bool = False
    ) -> CheckpointError:
        row = conn.execute(
            "SELECT fencing_token, status FROM runs "
            "WHERE run_id = ? AND (expires_at IS NULL OR expires_at > ?)",
            (run_id, now),
        ).fetchone()
        if row is None:
            return self._not_found(run_id)
        if row[0] != token:
            return fenced(run_id, token, row[0], action="renew" if renewing else "commit")
        if not renewing and row[1] not in ("running", "queued", "waiting"):
            return finished(run_id, row[1])
        return no_lease(run_id)

    def _not_found(self, run_id: str) -> RunNotFound:
        return not_found(run_id, self.url)


def _default_ttl() -> float:
    return get_settings().record_ttl_s
