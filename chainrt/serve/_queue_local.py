"""The in-process run queue (the SQLite store: one ``chainrt serve`` alone)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
import uuid

from ._queue_base import (
    PRIORITIES,
    DeadLetter,
    Delivery,
    Entry,
    Priority,
    QueueDepth,
    RunQueue,
    dead_letter_of,
)
from ._queue_dead import DeadLetterBook

__all__ = ["LocalQueue"]


class LocalQueue(RunQueue):
    """An in-process queue. An entry whose handling failed is put back after ``retry_after_s``
    (there are no orphans to claim in one process) until it goes to the dead letters, which
    ``letters`` keeps (default: in memory; ``chainrt serve`` on a SQLite file keeps them in the
    file, ``_queue_dead``)."""

    def __init__(
        self, *, retry_after_s: float = 1.0, letters: DeadLetterBook | None = None
    ) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, Entry]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._added: dict[int, collections.deque[float]] = {
            i: collections.deque() for i in range(len(PRIORITIES))
        }
        self.retry_after_s = retry_after_s
        self._failures: dict[tuple[str, str], int] = {}
        self.letters = letters if letters is not None else DeadLetterBook()
        self._later: set[asyncio.TimerHandle] = set()

    async def put(self, entry: Entry, priority: Priority) -> None:
        """Add an entry."""
        rank = PRIORITIES.index(priority)
        self._added[rank].append(time.time())
        self._queue.put_nowait((rank, next(self._seq), entry))

    async def take(self, wait_s: float) -> Delivery | None:
        """The next entry, critical first."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns an entry that
            # arrived in the same turn as a cancel and drops the cancel (a draining runner's
            # take loop would then never stop); here the cancel wins and the entry stays queued.
            async with asyncio.timeout(wait_s):
                rank, _, entry = await self._queue.get()
        except TimeoutError:
            return None
        self._added[rank].popleft()  # one class is first-in first-out
        return Delivery(entry, PRIORITIES[rank], str(next(self._ids)))

    async def fail(self, delivery: Delivery, reason: str) -> DeadLetter | None:
        """Count a failed delivery; dead-letter it at ``max_deliveries``, else put it back."""
        entry = delivery.entry
        key = (entry.run_id, entry.op) if entry is not None else ("", delivery.entry_id)
        count = self._failures.get(key, 0) + 1
        if entry is None or count >= self.max_deliveries:
            self._failures.pop(key, None)
            # Unique across restarts too (the letters of a SQLite store outlive the process).
            dead_id = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
            letter = dead_letter_of(delivery, reason, count, "local", dead_id)
            await self.letters.add(letter)
            return letter
        self._failures[key] = count
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._later.discard(handle)
            rank = PRIORITIES.index(delivery.priority)
            self._added[rank].append(time.time())
            self._queue.put_nowait((rank, next(self._seq), entry))

        handle = loop.call_later(self.retry_after_s, again)
        self._later.add(handle)
        return None

    async def depth(self) -> list[QueueDepth]:
        """Waiting entries per priority class."""
        now = time.time()
        return [
            QueueDepth(p, len(self._added[i]), now - self._added[i][0] if self._added[i] else 0.0)
            for i, p in enumerate(PRIORITIES)
        ]

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The dead letters, oldest first."""
        return await self.letters.oldest(limit)

    async def dead_letter(self, dead_id: str) -> DeadLetter | None:
        """One dead letter; None if absent."""
        return await self.letters.get(dead_id)

    async def dead_count(self) -> int:
        """How many dead letters there are."""
        return await self.letters.count()

    async def retry_dead(self, dead_id: str) -> DeadLetter | None:
        """Queue the run again (a resume) and remove the letter."""
        letter = await self.letters.pop(dead_id)
        if letter is not None:
            await self.put(letter.entry(), letter.queue_priority())
        return letter

    async def drop_dead(self, dead_id: str) -> DeadLetter | None:
        """Remove the letter."""
        return await self.letters.pop(dead_id)

    async def close(self) -> None:
        """Forget the entries put back later; close the dead letters' book."""
        for handle in self._later:
            handle.cancel()
        self._later.clear()
        await self.letters.close()
