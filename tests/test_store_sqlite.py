"""The SQLite checkpoint store: the shared conformance suite, plus what only a file can do."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chainrt._errors import CheckpointError, StoreUnavailable
from chainrt.store import (
    DEFAULT_MAX_RECORD_BYTES,
    CheckpointStore,
    RunProgress,
    SQLiteStore,
    open_store,
)
from chainrt.store._sqlite_schema import LAYOUT_VERSION, list_sql
from chainrt.testing.store_conformance import StoreConformance, StoreFactory, make_run, make_step


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


class TestSqliteStore(StoreConformance):
    """Every conformance test, against a fresh database file per test."""

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        async def make(
            *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
        ) -> CheckpointStore:
            return SQLiteStore(
                tmp_path / "store" / "chainrt.db",
                record_ttl_s=record_ttl_s,
                max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES,
            )

        return make

    async def corrupt(
        self, store: CheckpointStore, run_id: str, payload: str, *, step_id: str | None = None
    ) -> None:
        assert isinstance(store, SQLiteStore)
        assert store.path is not None
        with _raw(store.path) as conn:
            if step_id is None:
                cur = conn.execute(
                    "UPDATE run_records SET record = ? WHERE run_id = ?", (payload, run_id)
                )
            else:
                cur = conn.execute(
                    "UPDATE steps SET record = ? WHERE run_id = ? AND step_id = ?",
                    (payload, run_id, step_id),
                )
            assert cur.rowcount == 1
        conn.close()


async def test_default_store_is_a_wal_file_under_dot_chainrt(chainrt_home: str) -> None:
    store = open_store()
    try:
        assert isinstance(store, SQLiteStore)
        assert store.url == "sqlite:///.chainrt/chainrt.db"
        await store.create_run(make_run())
    finally:
        await store.close()
    path = Path(chainrt_home) / ".chainrt" / "chainrt.db"
    conn = _raw(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT run_id, status FROM runs").fetchall() == [("run-1", "running")]
    conn.close()


@pytest.mark.parametrize("form", ["relative", "absolute"])
async def test_url_forms(chainrt_home: str, form: str) -> None:
    url = "sqlite:///deep/er/x.db" if form == "relative" else f"sqlite:///{chainrt_home}/abs/x.db"
    store = open_store(url)
    await store.close()
    expected = "deep/er/x.db" if form == "relative" else "abs/x.db"
    assert (Path(chainrt_home) / expected).is_file()


async def test_in_memory_store() -> None:
    store = open_store("sqlite:///:memory:")
    await store.create_run(make_run())
    assert (await store.get_run("run-1")).chain == "support_agent"
    await store.close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://host/x.db", "sqlite:///dir/"])
def test_bad_sqlite_urls(url: str) -> None:
    with pytest.raises(CheckpointError, match="SQLite store URL"):
        open_store(url)


def test_unopenable_path_names_the_url(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(StoreUnavailable, match=r"a-file/x\.db") as info:
        SQLiteStore(tmp_path / "a-file" / "x.db")
    assert "\n" not in str(info.value)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not SQLite" * 200)
    with pytest.raises(CheckpointError, match=r"junk\.db"):
        SQLiteStore(path)


async def test_newer_table_layout_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    await SQLiteStore(path).close()
    with _raw(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(CheckpointError, match="newer chainrt"):
        SQLiteStore(path)


async def test_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    await store.close()
    with pytest.raises(CheckpointError, match="closed"):
        await store.get_run("run-1")


async def test_locked_by_another_process_is_retryable(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    store = SQLiteStore(path, busy_timeout_s=0.1)
    await store.create_run(make_run())
    blocker = _raw(path)
    blocker.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    try:
        with pytest.raises(StoreUnavailable, match="locked") as info:
            await store.commit("run-1", 1, RunProgress(status="running", budget_used_ms=1.0))
        assert info.value.retryable
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await store.commit("run-1", 1, RunProgress(status="running", budget_used_ms=1.0), make_step())
    assert set(await store.get_steps("run-1")) == {"intent"}
    await store.close()


async def test_expired_rows_are_purged_on_open(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    store = SQLiteStore(path, record_ttl_s=0.05)
    await store.create_run(make_run("old"))
    await store.create_run(make_run("live"))
    final: dict[str, Any] = {"status": "completed", "budget_used_ms": 1.0}
    await store.commit("old", 1, RunProgress(**final), make_step())
    await store.close()
    time.sleep(0.1)
    await SQLiteStore(path).close()
    conn = _raw(path)
    assert conn.execute("SELECT run_id FROM runs").fetchall() == [("live",)]
    assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    conn.close()


async def test_checkpoints_run_beside_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    store = SQLiteStore(path)
    await store.create_run(make_run())
    threads = [t for t in threading.enumerate() if t.name == "chainrt-checkpoint-x.db"]
    assert len(threads) == 1
    empty = path.stat().st_size
    for k in range(600):  # enough log for two background checkpoints, far below the backstop
        progress = RunProgress(status="running", budget_used_ms=float(k))
        await store.commit("run-1", 1, progress, make_step(f"s{k}"))
    deadline = time.monotonic() + 5
    while path.stat().st_size <= empty + 100_000 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    # The steps reached the database file itself: the log was copied back, off the loop.
    assert path.stat().st_size > empty + 100_000
    await store.close()
    assert not threads[0].is_alive()


# The table layout 1 (chainrt before the run record moved to its own table), as it created it.
_LAYOUT_1 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, status TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, fencing_token INTEGER NOT NULL, record TEXT NOT NULL,
    progress TEXT, owner_host TEXT, owner_pid INTEGER, owner_expires_at REAL,
    budget_total_ms REAL, trace TEXT, expires_at REAL
) WITHOUT ROWID;
CREATE INDEX runs_by_created ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_by_status ON runs (status, created_at DESC, run_id DESC);
CREATE INDEX runs_by_expiry ON runs (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE steps (
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""


async def test_layout_1_file_is_migrated_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    run = make_run("kept")
    step = make_step()
    conn = _raw(path)
    conn.executescript(_LAYOUT_1)
    conn.execute(
        "INSERT INTO runs VALUES (?, 'running', ?, ?, 1, ?, ?, 'host-a', 4242, ?, 9000.0, NULL, "
        "NULL)",
        (
            run.run_id,
            run.created_at,
            run.updated_at,
            run.model_dump_json(by_alias=True),
            RunProgress(status="running", budget_used_ms=12.5).model_dump_json(),
            run.owner.expires_at if run.owner else None,
        ),
    )
    conn.execute(
        "INSERT INTO steps VALUES (?, ?, ?)",
        (run.run_id, step.step_id, step.model_dump_json(by_alias=True)),
    )
    conn.close()

    store = SQLiteStore(path)
    loaded = await store.get_run("kept")
    assert (loaded.input, loaded.spec) == (run.input, run.spec)
    assert (loaded.budget_used_ms, loaded.budget_total_ms) == (12.5, 9000.0)
    assert loaded.owner is not None
    assert loaded.owner.pid == 4242
    assert await store.get_steps("kept") == {"intent": step}
    await store.commit("kept", 1, RunProgress(status="completed", budget_used_ms=20.0))
    assert (await store.get_run("kept")).status == "completed"
    await store.create_run(make_run("new"))
    assert [r.run_id for r in await store.list_runs()] == ["new", "kept"]
    await store.close()

    conn = _raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    assert "record" not in columns
    indexes = {row[1] for row in conn.execute("PRAGMA index_list(runs)")}
    assert {"runs_by_created", "runs_by_status", "runs_by_chain", "runs_by_expiry"} <= indexes
    assert "runs_by_chain_status" in indexes
    chains = dict(conn.execute("SELECT run_id, chain FROM runs"))
    assert chains == {"kept": run.chain, "new": run.chain}
    conn.close()
    await SQLiteStore(path).close()  # a migrated file opens again as it is


async def test_layout_1_file_opened_read_only_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    run = make_run("kept")
    conn = _raw(path)
    conn.executescript(_LAYOUT_1)
    conn.execute(
        "INSERT INTO runs VALUES (?, 'partial', ?, ?, 1, ?, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL)",
        (run.run_id, run.created_at, run.updated_at, run.model_dump_json(by_alias=True)),
    )
    conn.close()
    before = path.read_bytes()

    store = SQLiteStore(path, read_only=True)
    loaded = await store.get_run("kept")
    assert (loaded.status, loaded.spec) == ("partial", run.spec)
    assert [r.run_id for r in await store.list_runs()] == ["kept"]
    assert [r.run_id for r in await store.list_runs(chain=run.chain)] == ["kept"]
    assert await store.list_runs(chain="other") == []
    await store.close()
    assert path.read_bytes() == before  # not migrated: nothing was written


def _layout_2(path: Path) -> None:
    """A file as layout 2 left it: a current one without the chain column and its index."""
    _layout_3(path)
    conn = _raw(path)
    conn.execute("DROP INDEX runs_by_chain")
    conn.execute("ALTER TABLE runs DROP COLUMN chain")
    conn.execute("PRAGMA user_version = 2")
    conn.close()


def _layout_3(path: Path) -> None:
    """A file as layout 3 left it: a current one without the chain-and-status index and the
    dead letters' table."""
    conn = _raw(path)
    conn.execute("DROP INDEX runs_by_chain_status")
    conn.execute("DROP TABLE dead_letters")
    conn.execute("PRAGMA user_version = 3")
    conn.close()


async def test_layout_3_file_gets_its_chain_and_status_index_and_a_dead_letters_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.create_run(make_run("a", chain="alpha", created_at=1.0))
    await store.create_run(make_run("b", chain="beta", created_at=2.0))
    await store.commit("b", 1, RunProgress(status="failed", budget_used_ms=1.0))
    await store.close()
    _layout_3(path)

    reader = SQLiteStore(path, read_only=True)  # read as it is
    assert [r.run_id for r in await reader.list_runs("failed", chain="beta")] == ["b"]
    await reader.close()

    store = SQLiteStore(path)  # a writer migrates it: the index is filled from the runs there
    assert [r.run_id for r in await store.list_runs("failed", chain="beta")] == ["b"]
    assert await store.list_runs("failed", chain="alpha") == []
    await store.close()
    conn = _raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    indexes = {row[1] for row in conn.execute("PRAGMA index_list(runs)")}
    assert "runs_by_chain_status" in indexes
    assert conn.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,)
    conn.close()


@pytest.mark.parametrize("before", [None, (5.0, "x")])
async def test_a_page_of_both_filters_walks_the_chain_and_status_index(
    tmp_path: Path, before: tuple[float, str] | None
) -> None:
    # The plan SQLite picks for the page's own query: one index with both filters, in page
    # order (no sort, no walk of a whole chain or status that no run of the other matches).
    store = SQLiteStore(tmp_path / "s.db")
    await store.close()
    sql = list_sql(status=True, chain=True, before=before is not None)
    args: list[object] = [time.time(), "failed", "c3", *(before or ()), 50]
    conn = _raw(tmp_path / "s.db")
    plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
    conn.close()
    assert "runs USING INDEX runs_by_chain_status (chain=? AND status=?" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_layout_2_file_gets_its_chain_column_filled_from_the_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.create_run(make_run("a", chain="alpha", created_at=1.0))
    await store.create_run(make_run("b", chain="beta", created_at=2.0))
    await store.close()
    _layout_2(path)

    reader = SQLiteStore(path, read_only=True)  # read as it is: the chain from each record
    assert [r.run_id for r in await reader.list_runs(chain="beta")] == ["b"]
    await reader.close()

    store = SQLiteStore(path)  # a writer migrates it
    await store.create_run(make_run("c", chain="alpha", created_at=3.0))
    assert [r.run_id for r in await store.list_runs(chain="alpha")] == ["c", "a"]
    assert [r.run_id for r in await store.list_runs(chain="beta")] == ["b"]
    await store.close()
    conn = _raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    assert dict(conn.execute("SELECT run_id, chain FROM runs")) == {
        "a": "alpha",
        "b": "beta",
        "c": "alpha",
    }
    conn.close()


async def _log_growth_of_commits(path: Path, steps_in_spec: int, commits: int) -> int:
    """Bytes the write-ahead log grows by over ``commits`` step commits of one run."""
    spec = {
        "name": "long",
        "budget": 60_000.0,
        "steps": [{"id": f"s{i}", "tool": "tools.py:noop"} for i in range(steps_in_spec)],
    }
    store = SQLiteStore(path)
    await store.create_run(make_run(spec=spec))
    wal = path.with_name(path.name + "-wal")
    before = wal.stat().st_size
    for k in range(commits):
        progress = RunProgress(status="running", budget_used_ms=float(k))
        await store.commit("run-1", 1, progress, make_step(f"s{k}"))
    grown = wal.stat().st_size - before
    await store.close()
    return grown


async def test_a_commit_writes_as_much_for_a_long_chain_as_for_a_short_one(
    tmp_path: Path,
) -> None:
    """Issue 12, finding 15: a commit must not rewrite the stored spec. Ten commits (far below a
    background checkpoint, which would restart the log) of a 3,000-step run (a spec of ~120 KB)
    grow the log as those of a 1-step run do. (The layout that kept the spec in the row the
    commit updates grew it by 412 KB here, against 136 KB for the 1-step run.)"""
    short = await _log_growth_of_commits(tmp_path / "short.db", 1, 10)
    long = await _log_growth_of_commits(tmp_path / "long.db", 3000, 10)
    assert short > 0
    assert long <= short + 64 * 1024, (short, long)


def test_public_names() -> None:
    import chainrt.store

    assert set(chainrt.store.__all__) == {
        "ACCEPTED_FORMS",
        "DEFAULT_MAX_RECORD_BYTES",
        "RECORD_SCHEMA",
        "AttemptRecord",
        "CheckpointStore",
        "OwnerLease",
        "RedisStore",
        "RunProgress",
        "RunRecord",
        "RunStatus",
        "SQLiteStore",
        "StepRecord",
        "StepStatus",
        "open_store",
        "redact_url",
    }
    assert all(hasattr(chainrt.store, name) for name in chainrt.store.__all__)


async def test_signals_of_purged_runs_are_swept_by_the_next_signal(tmp_path: Path) -> None:
    from chainrt.store._signals import SignalRecord

    path = tmp_path / "x.db"
    store = SQLiteStore(path, record_ttl_s=0.05)
    await store.create_run(make_run("old"))
    await store.create_run(make_run("live"))
    await store.put_signal("old", SignalRecord(name="ok", payload=1))
    final: dict[str, Any] = {"status": "completed", "budget_used_ms": 1.0}
    await store.commit("old", 1, RunProgress(**final))
    await store.close()
    time.sleep(0.1)
    store = SQLiteStore(path)  # purges "old" on open
    await store.put_signal("live", SignalRecord(name="ok", payload=2))
    await store.close()
    conn = _raw(path)
    assert conn.execute("SELECT run_id, name FROM signals").fetchall() == [("live", "ok")]
    conn.close()
