"""The in-process run queue of ``chainrt serve`` (SQLite): a cancel of ``take`` is never lost."""

from __future__ import annotations

import asyncio

import pytest

from chainrt.serve import Entry, LocalQueue


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_a_cancel_racing_an_entry_is_honoured_and_the_entry_not_lost(turns: int) -> None:
    queue = LocalQueue()
    taking = asyncio.ensure_future(queue.take(wait_s=30))
    await asyncio.sleep(0)  # take waits for an entry
    await queue.put(Entry("r1"), "normal")
    for _ in range(turns):  # the cancel lands 0..3 turns of the loop after the entry
        await asyncio.sleep(0)
    accepted = taking.cancel()  # a draining runner stops its take loop
    try:
        got = await taking
    except asyncio.CancelledError:
        got = None
    if accepted:
        # asyncio.wait_for on Python 3.11 (one turn after the entry) returned the entry and
        # dropped the accepted cancel: the take loop of a draining runner went on forever.
        assert got is None
    left = await queue.take(wait_s=0.01)
    delivered = [d.entry for d in (got, left) if d is not None]
    assert delivered == [Entry("r1")]  # taken once: either by take or still queued


async def test_take_returns_none_after_its_wait_and_critical_comes_first() -> None:
    queue = LocalQueue()
    assert await queue.take(wait_s=0.01) is None
    await queue.put(Entry("low"), "low")
    await queue.put(Entry("crit"), "critical")
    first, second = await queue.take(wait_s=1), await queue.take(wait_s=1)
    assert first is not None
    assert second is not None
    assert (first.entry, first.priority) == (Entry("crit"), "critical")
    assert (second.entry, second.priority) == (Entry("low"), "low")
