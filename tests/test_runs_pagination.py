"""``GET /v1/runs`` keyset pages with 100,000 runs in a SQLite store, and the same cursor walk on
Redis: every run once, newest first, each page read on the index (no offset)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chainrt
from chainrt._records import RunRecord
from chainrt.serve._listing import decode_cursor, encode_cursor
from chainrt.store import open_store
from chainrt.store._sqlite_schema import list_sql
from chainrt.testing.serve_process import ServeProcess

RUNS = 100_000
STATUSES = ("completed", "partial", "failed", "rejected", "cancelled")
CHAINS = Path(__file__).parent / "data" / "dashboard"


def make_template(tmp: Path, store: str) -> None:
    """One real run, written by the runner: the rows the bulk copies are made from."""
    chain = tmp / "tiny.yaml"
    chain.write_text(
        "name: tiny\nbudget: 10s\nsteps:\n  - {id: a, tool: 'tools.py:nap', args: {seconds: 0}}\n"
    )
    (tmp / "tools.py").write_text((CHAINS / "tools.py").read_text())
    result = chainrt.load(chain).run({}, run_id="template", store=store)
    assert result.status == "completed"


def bulk_copy(db: Path, base: float) -> list[tuple[float, str, str]]:
    """RUNS copies of the template run; pairs share a ``created_at`` (ties go by run id).
    Returns (created_at, run_id, status) of each, the template included."""
    conn = sqlite3.connect(db)
    cursor = conn.execute("SELECT * FROM runs WHERE run_id = 'template'")
    columns = [c[0] for c in cursor.description]
    row = dict(zip(columns, cursor.fetchone(), strict=True))
    (raw,) = conn.execute("SELECT record FROM run_records WHERE run_id = 'template'").fetchone()
    record = json.loads(raw)
    made = [(row["created_at"], "template", row["status"])]
    runs_rows, record_rows = [], []
    for i in range(RUNS):
        run_id, created_at, status = f"run-{i:06d}", base + (i // 2) * 0.001, STATUSES[i % 5]
        runs_rows.append(
            tuple({**row, "run_id": run_id, "created_at": created_at, "status": status}.values())
        )
        record_rows.append(
            (run_id, json.dumps({**record, "run_id": run_id, "created_at": created_at}))
        )
        made.append((created_at, run_id, status))
    marks = ", ".join("?" for _ in columns)
    with conn:
        conn.executemany(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({marks})", runs_rows)
        conn.executemany("INSERT INTO run_records (run_id, record) VALUES (?, ?)", record_rows)
    conn.close()
    return made


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[float, str, str]]]:
    tmp = tmp_path_factory.mktemp("pages")
    db = tmp / "runs.db"
    make_template(tmp, f"sqlite:///{db}")
    made = bulk_copy(db, base=time.time() + 10)  # all newer than the template
    made.sort(key=lambda r: (r[0], r[1]), reverse=True)
    return db, made


def test_plans_use_the_index_without_sorting(big: tuple[Path, list[Any]]) -> None:
    db, _ = big
    conn = sqlite3.connect(db)
    for sql, args in (
        (list_sql(status=False, chain=False, before=True), (0.0, 1e12, "x", 50)),
        (list_sql(status=True, chain=False, before=True), (0.0, "partial", 1e12, "x", 50)),
        (list_sql(status=False, chain=True, before=True), (0.0, "tiny", 1e12, "x", 50)),
        (list_sql(status=False, chain=True, before=False), (0.0, "nope", 50)),
    ):
        plan = " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        assert "USING INDEX runs_by_" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # no sort of all rows: the index gives the order
    conn.close()


async def test_store_walks_every_run_once_newest_first(big: tuple[Path, list[Any]]) -> None:
    db, made = big
    store = open_store(f"sqlite:///{db}")
    try:
        seen: list[str] = []
        before = None
        while True:
            page = await store.list_runs(limit=1000, before=before)
            seen += [r.run_id for r in page]
            if len(page) < 1000:
                break
            before = (page[-1].created_at, page[-1].run_id)
        assert seen == [r[1] for r in made]
        partial = await store.list_runs("partial", 100, before=(made[500][0], made[500][1]))
        wanted = [r[1] for r in made[501:] if r[2] == "partial"][:100]
        assert [r.run_id for r in partial] == wanted
    finally:
        await store.close()


@pytest.fixture(scope="module")
def server(big: tuple[Path, list[Any]]) -> Iterator[ServeProcess]:
    db, _ = big
    with ServeProcess(store=f"sqlite:///{db}", chains=CHAINS, drain="1s") as runner:
        yield runner


def _record(made: tuple[float, str, str]) -> dict[str, Any]:
    """The fields a cursor is made of (the rest as a minimal valid record)."""
    created_at, run_id, _ = made
    return {
        "run_id": run_id,
        "chain": "tiny",
        "spec": {},
        "input": {},
        "budget_total_ms": 1.0,
        "created_at": created_at,
    }


def test_api_pages_follow_the_cursor(server: ServeProcess, big: tuple[Path, list[Any]]) -> None:
    _, made = big
    first = server.get("/v1/runs", params={"limit": 1000})
    assert [r["run_id"] for r in first.json()] == [r[1] for r in made[:1000]]
    cursor = first.headers["x-next-cursor"]
    assert decode_cursor(cursor) == (made[999][0], made[999][1])
    second = server.get("/v1/runs", params={"limit": 1000, "cursor": cursor}).json()
    assert [r["run_id"] for r in second] == [r[1] for r in made[1000:2000]]
    # Deep in the list: after the 90,000th run come the next ones, as the store orders them.
    deep = encode_cursor(RunRecord.model_validate(_record(made[89_999])))
    answer = server.get("/v1/runs", params={"limit": 1000, "cursor": deep})
    assert [r["run_id"] for r in answer.json()] == [r[1] for r in made[90_000:91_000]]
    # The last page: what is left, and no cursor after it.
    tail = encode_cursor(RunRecord.model_validate(_record(made[RUNS - 10])))
    last = server.get("/v1/runs", params={"limit": 1000, "cursor": tail})
    assert [r["run_id"] for r in last.json()] == [r[1] for r in made[RUNS - 9 :]]
    assert "x-next-cursor" not in last.headers

    status = server.get("/v1/runs", params={"status": "failed", "limit": 10})
    assert [r["run_id"] for r in status.json()] == [r[1] for r in made if r[2] == "failed"][:10]


def test_chain_filter_reads_the_chains_index(server: ServeProcess) -> None:
    # "tiny" is the chain of every run: the filter fills its page at once, and goes on.
    tiny = server.get("/v1/runs", params={"chain": "tiny", "limit": 20})
    assert len(tiny.json()) == 20
    assert "x-next-cursor" in tiny.headers
    # No run of "steps": the chain's index is empty, so the answer is at once: none, no cursor.
    empty = server.get("/v1/runs", params={"chain": "steps"})
    assert empty.json() == []
    assert "x-next-cursor" not in empty.headers
    both = server.get("/v1/runs", params={"chain": "tiny", "status": "nope"})
    assert both.json() == []


@pytest.mark.parametrize("bad", ["x", "bm9wZQ", "WzEsMiwzXQ", "WyJhIiwiYiJd", "WzEuMCwyXQ"])
def test_a_bad_cursor_is_a_422_naming_it(server: ServeProcess, bad: str) -> None:
    answer = server.get("/v1/runs", params={"cursor": bad})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["field"] == "query.cursor"
    assert "not a cursor of this API" in error["message"]


async def test_redis_store_pages_the_same_way(redis_url: str) -> None:
    store = f"{redis_url}"
    tmp = Path(__file__).parent / "data" / "dashboard"
    chain = chainrt.load(tmp / "steps.yaml")
    for i in range(25):
        result = await chain.arun({"a": 0.0, "b": 0.0, "c": 0.0}, run_id=f"r{i:02d}", store=store)
        assert result.status == "completed"
    opened = open_store(store)
    try:
        everything = [r.run_id for r in await opened.list_runs(limit=100)]
        assert sorted(everything, reverse=True) == everything  # created one after the other
        seen: list[str] = []
        before = None
        while True:
            page = await opened.list_runs(limit=7, before=before)
            seen += [r.run_id for r in page]
            if len(page) < 7:
                break
            before = (page[-1].created_at, page[-1].run_id)
        assert seen == everything
    finally:
        await opened.close()
