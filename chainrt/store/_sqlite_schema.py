"""The SQLite checkpoint store's tables: their layout, its migrations, and the queries on them.

``bring_layout`` creates the tables in a new file or migrates an older layout; the SQL the store
runs lives here beside the tables it reads, so a layout change is made in one file.
"""

from __future__ import annotations

import sqlite3
from functools import cache
from typing import Any

from .._errors import CheckpointError
from .._records import RunRecord
from ._codec import assemble_run, decode_progress, decode_run

__all__ = [
    "COMMIT_SQL",
    "DEAD_LETTERS_TABLE",
    "DROP_EXPIRED_SQL",
    "GET_RUN_SQL",
    "INSERT_RUN_SQL",
    "LAYOUT_VERSION",
    "PURGE_SQL",
    "SCHEMA",
    "UPSERT_STEP_SQL",
    "bring_layout",
    "list_sql",
    "read_old_layout",
    "run_from_row",
]

LAYOUT_VERSION = 4  # PRAGMA user_version of the tables below (1: the record lived in runs;
# 2: runs had no chain column; 3: no chain-and-status index, no dead_letters table)

# The run as created (spec, input: tens of KB for a long chain) sits in run_records, apart from
# the few fields every commit changes: an UPDATE rewrites the whole row, and a commit that
# rewrote the spec would cost more the longer the chain (issue 12, finding 15).
RUNS_TABLE = """
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
    expires_at REAL,                -- set once the run is final: purged after this
    chain TEXT                      -- the record's chain (for ?chain= lists), written once
) WITHOUT ROWID"""
# The queue's dead letters of ``chainrt serve`` on this file (``serve._queue_dead``): kept across
# restarts, oldest first by ``seq``.
DEAD_LETTERS_TABLE = """
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    letter TEXT NOT NULL            -- the letter's fields, a JSON object of strings
)"""
SCHEMA = (
    RUNS_TABLE,
    "CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_at DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_chain ON runs (chain, created_at DESC, run_id DESC)",
    # ?chain=&status=: one index walk, newest first, that stops at the page's end or at once
    # when no run matches both (either index alone reads every run of its chain or status).
    "CREATE INDEX IF NOT EXISTS runs_by_chain_status "
    "ON runs (chain, status, created_at DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS runs_by_expiry ON runs (expires_at) WHERE expires_at IS NOT NULL",
    """
CREATE TABLE IF NOT EXISTS run_records (
    run_id TEXT PRIMARY KEY,
    record TEXT NOT NULL            -- RunRecord JSON as created, written once
)""",
    DEAD_LETTERS_TABLE,
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
# are made again by SCHEMA.
MIGRATE_FROM_1 = (
    "CREATE TABLE run_records (run_id TEXT PRIMARY KEY, record TEXT NOT NULL)",
    "INSERT INTO run_records (run_id, record) SELECT run_id, record FROM runs",
    "ALTER TABLE runs RENAME TO runs_layout_1",
    RUNS_TABLE,
    "INSERT INTO runs (run_id, status, created_at, updated_at, fencing_token, progress, "
    "owner_host, owner_pid, owner_expires_at, budget_total_ms, trace, expires_at) "
    "SELECT run_id, status, created_at, updated_at, fencing_token, progress, "
    "owner_host, owner_pid, owner_expires_at, budget_total_ms, trace, expires_at "
    "FROM runs_layout_1",
    "DROP TABLE runs_layout_1",
)
# Layout 2 -> 3: the chain gets a column of its own (and SCHEMA its index), so that a ?chain=
# page reads only that chain's runs. Runs written before are filled from their records here,
# once, inside the migration's transaction.
FILL_CHAIN = (
    "UPDATE runs SET chain = (SELECT json_extract(record, '$.chain') FROM run_records "
    "WHERE run_records.run_id = runs.run_id) WHERE chain IS NULL"
)
MIGRATE_FROM_2 = ("ALTER TABLE runs ADD COLUMN chain TEXT",)
# Layout 3 -> 4: only additions (the runs_by_chain_status index, the dead_letters table), which
# SCHEMA makes; its CREATE INDEX fills the index from the runs already there.

# Every query spells out "(expires_at IS NULL OR expires_at > ?)": a run past its TTL is gone
# for readers at once, whether or not a purge has deleted its rows yet.
SELECT_RUN = (
    "SELECT runs.run_id, status, fencing_token, run_records.record, progress, owner_host, "
    "owner_pid, owner_expires_at, updated_at, budget_total_ms, trace FROM runs "
    "JOIN run_records ON run_records.run_id = runs.run_id "
)
GET_RUN_SQL = SELECT_RUN + "WHERE runs.run_id = ? AND (expires_at IS NULL OR expires_at > ?)"
_LIVE = "WHERE (expires_at IS NULL OR expires_at > ?) "
_ORDER = "ORDER BY created_at DESC, runs.run_id DESC LIMIT ?"


@cache
def list_sql(*, status: bool, chain: bool, before: bool) -> str:
    """The query of one ``list_runs`` page. Its parameters, in order: now, then the status,
    the chain and ``(created_at, run_id)`` of the run the page starts after, each only when its
    flag is set, then the limit. A filter walks its own index (``runs_by_status``,
    ``runs_by_chain``; both filters ``runs_by_chain_status``): a page reads what it returns,
    whatever the store holds (one that no run matches reads none)."""
    where = _LIVE
    if status:
        where += "AND status = ? "
    if chain:
        where += "AND chain = ? "
    if before:
        # Keyset pages: the runs after (older than) the last one of the page before.
        where += "AND (created_at, runs.run_id) < (?, ?) "
    return SELECT_RUN + where + _ORDER


COMMIT_SQL = (
    "UPDATE runs SET status = ?, progress = ?, updated_at = ?, expires_at = ?, "
    "budget_total_ms = coalesce(?, budget_total_ms), trace = coalesce(?, trace), "
    "owner_host = CASE WHEN ? THEN NULL ELSE owner_host END, "
    "owner_pid = CASE WHEN ? THEN NULL ELSE owner_pid END, "
    "owner_expires_at = CASE WHEN ? THEN NULL ELSE owner_expires_at END "
    "WHERE run_id = ? AND fencing_token = ? AND (expires_at IS NULL OR expires_at > ?) "
    # A final status is final: only its own retried commit may write it again.
    "AND (status IN ('running', 'queued', 'waiting') OR status = ?)"
)
# At most 1000 runs per purge keeps one purge short on the event loop. The same subquery picks
# the same runs in each statement (one transaction, one ``now``); runs goes last.
PURGE_SQL = (
    "DELETE FROM steps WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
    "DELETE FROM run_records WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
    "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000)",
)
INSERT_RUN_SQL = (
    "INSERT INTO runs (run_id, status, created_at, updated_at, fencing_token, progress, "
    "owner_host, owner_pid, owner_expires_at, expires_at, chain) "
    "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)"
)
# A run past its TTL but not purged yet must not block a new run of the same id (run only when
# the id is found taken: a new id pays nothing for it).
DROP_EXPIRED_SQL = (
    "DELETE FROM steps WHERE run_id IN (SELECT run_id FROM runs WHERE run_id = ? "
    "AND expires_at <= ?)",
    "DELETE FROM run_records WHERE run_id IN (SELECT run_id FROM runs WHERE run_id = ? "
    "AND expires_at <= ?)",
    "DELETE FROM runs WHERE run_id = ? AND expires_at <= ?",
)
UPSERT_STEP_SQL = (
    "INSERT INTO steps (run_id, step_id, record) VALUES (?, ?, ?) "
    "ON CONFLICT (run_id, step_id) DO UPDATE SET record = excluded.record"
)


def bring_layout(conn: sqlite3.Connection, url: str) -> None:
    """Create the tables, or bring an older layout up to this one, in one write transaction.

    The layout version is read inside the transaction: of several processes opening an old
    file at once, the first migrates it and the others find it migrated.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > LAYOUT_VERSION:
            raise CheckpointError(
                f"the SQLite store {url} was created by a newer chainrt (table layout "
                f"{version}, this one knows {LAYOUT_VERSION}); upgrade chainrt"
            )
        migrate: tuple[str, ...] = ()
        if version == 1:
            migrate = (*MIGRATE_FROM_1, FILL_CHAIN)
        elif version == 2:
            migrate = (*MIGRATE_FROM_2, FILL_CHAIN)
        for statement in (*migrate, *SCHEMA):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        conn.close()
        raise


def read_old_layout(conn: sqlite3.Connection) -> None:
    """An older file opened read-only cannot be migrated: temporary views (in the connection's
    own temp database, written nowhere; they shadow the tables of the same name) give the
    queries what they read: layout 1's run_records, and the chain column of layouts 1 and 2
    (taken from each record: a ``?chain=`` page reads the runs there, as before layout 3)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 1:
        conn.execute("CREATE TEMP VIEW run_records AS SELECT run_id, record FROM main.runs")
        conn.execute(
            "CREATE TEMP VIEW runs AS SELECT *, json_extract(record, '$.chain') AS chain "
            "FROM main.runs"
        )
    elif version == 2:
        conn.execute(
            "CREATE TEMP VIEW runs AS SELECT r.*, (SELECT json_extract(c.record, '$.chain') "
            "FROM main.run_records AS c WHERE c.run_id = r.run_id) AS chain FROM main.runs AS r"
        )


def run_from_row(row: tuple[Any, ...], url: str) -> RunRecord:
    """The run in one row of a ``SELECT_RUN`` query (``url`` names the store in errors)."""
    run_id, status, token, raw, raw_progress, host, pid, owner_expires_at, updated_at = row[:9]
    where = f"{url} table runs"
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
