"""The upkeep and dead letters of ``chainrt serve``'s Redis queue (docs/serve.md): touching the
entries a runner holds, claiming orphans, dead-lettering an entry delivered too often, queue
depth, the runners' announcements, and listing, retrying and dropping dead letters.

None of it is on a run's path: the service calls it from its upkeep loops and the API.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ._queue_base import PRIORITIES, DeadLetter, Delivery, QueueDepth, dead_letter_of
from ._queue_redis import GROUP, RedisStreams, as_text

__all__ = ["DEAD_MAXLEN", "RedisUpkeep"]

DEAD_MAXLEN = 100_000
"""The dead-letter stream keeps about this many letters (the oldest are trimmed)."""


class RedisUpkeep(RedisStreams):
    """The Redis queue's upkeep and dead letters (the base of :class:`~._queue.RedisQueue`)."""

    # ------------------------------------------------------------------ upkeep

    async def touch(self, deliveries: list[Delivery]) -> None:
        """``XCLAIM`` this runner's entries to itself (``JUSTID``): their idle time restarts."""
        by_stream: dict[str, list[int | bytes | str | memoryview[int]]] = {}
        for d in [*deliveries, *self._backlog]:
            by_stream.setdefault(self._stream_of(d), []).append(d.entry_id)
        for stream, ids in by_stream.items():
            await self._guarded(
                lambda stream=stream, ids=ids: self._client.xclaim(  # type: ignore[misc]
                    stream, GROUP, self.consumer, 0, ids, justid=True
                )
            )

    async def orphans(self, count: int) -> list[Delivery]:
        """``XAUTOCLAIM`` entries idle longer than ``orphan_idle_s``, critical first. Each
        stream's scan goes on from the cursor the last one returned (back to the start once it
        reached the end): entries that keep failing cannot fill every scan. Entries claimed
        beyond ``count`` wait in this runner's backlog (touched, taken first)."""
        idle_ms = int(self.orphan_idle_s * 1000)
        streams = list(self._streams)

        async def scan() -> list[Any]:
            if self.cluster:  # one stream at a time: no pipeline across redirections
                return [
                    await self._client.xautoclaim(
                        s, GROUP, self.consumer, idle_ms, self._cursors.get(s, "0-0"), count=count
                    )
                    for s in streams
                ]
            async with self._client.pipeline(transaction=False) as pipe:
                for s in streams:
                    pipe.xautoclaim(
                        s, GROUP, self.consumer, idle_ms, self._cursors.get(s, "0-0"), count=count
                    )
                return list(await pipe.execute())

        replies = await self._guarded(scan)
        found: list[Delivery] = []
        for stream, reply in zip(streams, replies, strict=True):
            self._cursors[stream] = as_text(reply[0])
            priority, _ = self._streams[stream]
            for entry_id, fields in reply[1]:
                if fields is None:  # deleted meanwhile (Redis 6.2 reports it this way)
                    continue
                found.append(self._delivery(priority, stream, entry_id, fields))
        found.sort(key=lambda d: PRIORITIES.index(d.priority))
        self._backlog.extend(found[count:])
        return found[:count]

    async def fail(self, delivery: Delivery, reason: str) -> DeadLetter | None:
        """Dead-letter the entry once delivered ``max_deliveries`` times (one ``MULTI``: the
        letter added, the entry acknowledged and deleted); until then it is left pending,
        untouched, so that it is claimed again as an orphan."""
        stream = self._stream_of(delivery)
        pending = await self._client.xpending_range(
            stream, GROUP, min=delivery.entry_id, max=delivery.entry_id, count=1
        )
        count = int(pending[0]["times_delivered"]) if pending else self.max_deliveries
        if count < self.max_deliveries:
            return None
        letter = dead_letter_of(delivery, reason, count, self.consumer)

        def queue(pipe: Any) -> None:
            pipe.xadd(self.keys.dead, letter.fields(), maxlen=DEAD_MAXLEN, approximate=True)
            pipe.xack(stream, GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)

        replies = await self._transaction(queue)
        return DeadLetter.parse(as_text(replies[0]), letter.fields())

    async def depth(self) -> list[QueueDepth]:
        """Entries not yet read by any runner, per stream, and the oldest one's age. The chain
        streams of every chain a runner ever announced are counted (not only this runner's)."""
        await self._groups()
        known = {as_text(c) for c in await self._client.smembers(self.keys.chains)}
        streams = dict(self._streams)
        for chain in known - set(self.chains):
            for p in PRIORITIES:
                streams[self.keys.stream(p, chain)] = (p, chain)
        out = []
        now_ms = time.time() * 1000
        for stream, (priority, chain) in streams.items():
            try:
                groups = await self._client.xinfo_groups(stream)
            except Exception:
                groups = []
            group = next((g for g in groups if as_text(g["name"]) == GROUP), None)
            last = as_text(group["last-delivered-id"]) if group else "0-0"
            waiting = int(group.get("lag") or 0) if group else 0
            oldest = 0.0
            if waiting:
                after = await self._client.xrange(stream, min=f"({last}", count=1)
                if after:
                    oldest = max(0.0, (now_ms - int(as_text(after[0][0]).split("-")[0])) / 1000)
            out.append(QueueDepth(priority, waiting, oldest, chain))
        return out

    async def announce(self, chains: list[str], ttl_s: float) -> None:
        """Record this runner (its chains, until ``ttl_s`` from now) in the runners hash."""
        value = json.dumps({"chains": chains, "expires_at": time.time() + ttl_s})
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.runners, self.consumer, value)
            if chains:
                pipe.sadd(self.keys.chains, *chains)
            await pipe.execute()

    async def served(self) -> set[str] | None:
        """The chains of the runners whose announcement has not expired (expired ones are
        removed on the way)."""
        now = time.time()
        served: set[str] = set()
        stale = []
        for name, raw in (await self._client.hgetall(self.keys.runners)).items():
            try:
                data = json.loads(raw)
                expires = float(data["expires_at"])
                chains = [str(c) for c in data["chains"]]
            except (ValueError, KeyError, TypeError):
                stale.append(name)
                continue
            if expires < now:
                stale.append(name)
            else:
                served.update(chains)
        if stale:
            await self._client.hdel(self.keys.runners, *stale)
        return served

    # ------------------------------------------------------------------ dead letters

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The dead letters, oldest first."""
        rows = await self._client.xrange(self.keys.dead, count=limit)
        return [DeadLetter.parse(as_text(i), f) for i, f in rows]

    async def dead_count(self) -> int:
        """``XLEN`` of the dead-letter stream."""
        return int(await self._client.xlen(self.keys.dead))

    async def dead_letter(self, dead_id: str) -> DeadLetter | None:
        """One dead letter (``XRANGE id id``); None if absent."""
        from redis import exceptions as rx

        try:
            rows = await self._client.xrange(self.keys.dead, min=dead_id, max=dead_id, count=1)
        except rx.ResponseError:  # not a stream id
            return None
        return DeadLetter.parse(as_text(rows[0][0]), rows[0][1]) if rows else None

    async def retry_dead(self, dead_id: str) -> DeadLetter | None:
        """Queue the letter's run again as a resume and delete the letter (one ``MULTI``)."""
        letter = await self.dead_letter(dead_id)
        if letter is None:
            return None
        entry = letter.entry()
        stream = self.keys.stream(letter.queue_priority(), entry.chain or None)
        await self._groups()

        def queue(pipe: Any) -> None:
            pipe.xadd(stream, entry.fields())
            pipe.xdel(self.keys.dead, dead_id)

        await self._transaction(queue)
        return letter

    async def drop_dead(self, dead_id: str) -> DeadLetter | None:
        """Delete the letter."""
        letter = await self.dead_letter(dead_id)
        if letter is not None:
            await self._client.xdel(self.keys.dead, dead_id)
        return letter
