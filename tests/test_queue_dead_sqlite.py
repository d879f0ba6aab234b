"""The dead letters of ``chainrt serve`` on the SQLite store live in the store's file: a
restarted queue (another process, the same file) still lists, retries and drops them."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from chainrt._errors import StoreUnavailable
from chainrt.serve import Entry, LocalQueue
from chainrt.serve._queue_base import Delivery, dead_letter_of
from chainrt.serve._queue_dead import DeadLetterBook, SqliteDeadLetters, dead_letter_book
from chainrt.store import SQLiteStore
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"


async def _dead_letter(queue: LocalQueue, run_id: str, reason: str) -> str:
    """Put ``run_id`` in and fail it until it is a dead letter; its id."""
    await queue.put(Entry(run_id, chain="nap", budget_ms=1500.0), "high")
    for _ in range(queue.max_deliveries):
        delivery = await queue.take(1.0)
        assert delivery is not None
        letter = await queue.fail(delivery, reason)
    assert letter is not None
    return letter.id


async def test_dead_letters_outlive_the_queue_that_made_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SQLiteStore(tmp_path / "runs.db")  # (a runner opens its store first)
    first = LocalQueue(retry_after_s=0.0, letters=dead_letter_book(url))
    kept = await _dead_letter(first, "poison-1", "CorruptRecord: not JSON")
    dropped = await _dead_letter(first, "poison-2", "PoisonEntry: no fields")
    letters = await first.dead_letters()
    await first.close()
    await store.close()

    again = LocalQueue(letters=dead_letter_book(url))  # the restarted runner
    assert await again.dead_letters() == letters  # every field, oldest first
    assert [d.run_id for d in letters] == ["poison-1", "poison-2"]
    assert letters[0].reason == "CorruptRecord: not JSON"
    assert (letters[0].deliveries, letters[0].priority, letters[0].chain) == (3, "high", "nap")
    assert await again.dead_count() == 2
    assert await again.dead_letter(kept) == letters[0]
    assert await again.drop_dead(dropped) == letters[1]
    assert await again.retry_dead(kept) == letters[0]
    back = await again.take(1.0)
    assert back is not None
    assert back.entry == Entry("poison-1", "resume", 1500.0, "nap")
    assert await again.dead_count() == 0
    await again.close()
    third = LocalQueue(letters=dead_letter_book(url))
    assert await third.dead_letters() == []  # the retry and the drop were kept too
    await third.close()


async def test_the_book_fits_the_store() -> None:
    assert isinstance(dead_letter_book("sqlite:///x/runs.db"), SqliteDeadLetters)
    for url in ("sqlite:///:memory:", "sqlite:///x/runs.db?mode=ro", "redis://h:1/0"):
        book = dead_letter_book(url)
        assert type(book) is DeadLetterBook, url


async def test_an_unreadable_letter_is_skipped_and_a_broken_file_is_one_clear_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    await SQLiteStore(path).close()
    book = SqliteDeadLetters(path)
    queue = LocalQueue(retry_after_s=0.0, letters=book)
    good = await _dead_letter(queue, "r1", "boom")
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO dead_letters (id, letter) VALUES ('1-x', '[1, 2]')")
    conn.commit()
    conn.close()
    assert [d.id for d in await queue.dead_letters()] == [good]  # the odd row skipped
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE dead_letters")
    conn.execute("CREATE TABLE dead_letters (x)")  # not the table it knows
    conn.commit()
    conn.close()
    with pytest.raises(StoreUnavailable, match="dead letters in the SQLite store") as caught:
        await queue.dead_letters()
    assert "\n" not in str(caught.value)
    await queue.close()


@pytest.mark.slow
def test_a_restarted_serve_on_sqlite_still_shows_and_drops_its_dead_letters(
    tmp_path: Path,
) -> None:
    """Real ``chainrt serve`` processes on one SQLite file: the letter a runner before them
    left (written as LocalQueue writes it) is listed by /v1/dlq after a restart, and a drop by
    one process is gone for the next."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    letter = dead_letter_of(
        Delivery(Entry("poison-1", chain="nap"), "normal", "7"), "CorruptRecord: x", 3, "local"
    )
    letter = replace(letter, id="1700000000000-abcd1234")

    async def seed() -> None:
        await SQLiteStore(path).close()
        book = SqliteDeadLetters(path)
        await book.add(letter)
        await book.close()

    asyncio.run(seed())
    with ServeProcess(store=url, chains=CHAINS) as runner:
        shown = runner.get("/v1/dlq").json()
        assert [(d["id"], d["run_id"], d["reason"]) for d in shown] == [
            (letter.id, "poison-1", "CorruptRecord: x")
        ]
        runner.stop()
        runner.start()  # the same file, a new process
        assert [d["id"] for d in runner.get("/v1/dlq").json()] == [letter.id]
        dropped = runner.post(f"/v1/dlq/{letter.id}/drop")
        assert dropped.status_code == 200, dropped.text
        runner.stop()
        runner.start()
        assert runner.get("/v1/dlq").json() == []
