"""The run queue of ``chainrt serve`` (DESIGN §12): Redis Streams, or in-process for SQLite.

Redis layout (default prefix ``chainrt``; the four streams share the hash tag ``{queue}`` so one
``XREADGROUP`` can wait on all of them, on Redis Cluster too)::

    chainrt:{queue}:critical   stream, consumer group "runners"   entries: run_id, op, budget_ms
    chainrt:{queue}:high       ...
    chainrt:{queue}:normal
    chainrt:{queue}:low

A runner reads with ``XREADGROUP`` (critical first), so an entry it holds is in its pending list
until the run is final: then ``XACK`` + ``XDEL``. While the run executes, the runner touches its
entries (``XCLAIM`` to itself, idle reset) every second; an entry idle for longer than
``orphan_idle_s`` belongs to a runner that stopped touching it (killed, hung, partitioned) and any
runner takes it with ``XAUTOCLAIM`` — then looks at the run's owner lease before resuming it
(the fencing token keeps one owner). A draining runner hands an entry back by adding it again
and deleting its own (one ``MULTI``), so another runner reads it at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

__all__ = [
    "PRIORITIES",
    "Delivery",
    "Entry",
    "LocalQueue",
    "Priority",
    "QueueDepth",
    "RedisQueue",
    "RunQueue",
    "stream_key",
]

Priority = Literal["critical", "high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("critical", "high", "normal", "low")
GROUP = "runners"
TRANSACTION_RETRY_S = 10.0
"""How long ``ack`` / ``hand_back`` keep sending their ``MULTI`` again while a Redis Cluster
redirects or refuses it (a slot migration or a failover)."""


def stream_key(priority: str, prefix: str = "chainrt") -> str:
    """The stream of one priority class."""
    return f"{prefix}:{{queue}}:{priority}"


@dataclass(frozen=True, slots=True)
class Entry:
    """What a queue entry asks for: start (or take over) ``run_id``, or resume it (``op``)."""

    run_id: str
    op: Literal["start", "resume"] = "start"
    budget_ms: float | None = None

    def fields(self) -> dict[str, str]:
        """The stream entry's fields."""
        budget = "" if self.budget_ms is None else repr(self.budget_ms)
        return {"run_id": self.run_id, "op": self.op, "budget_ms": budget}

    @classmethod
    def parse(cls, fields: dict[bytes, bytes]) -> Entry | None:
        """An entry from stream fields, or None when they are not one."""
        try:
            run_id = fields[b"run_id"].decode()
            op = fields.get(b"op", b"start").decode()
            raw_budget = fields.get(b"budget_ms", b"").decode()
            budget = float(raw_budget) if raw_budget else None
        except (KeyError, UnicodeDecodeError, ValueError):
            return None
        if op not in ("start", "resume") or not run_id:
            return None
        return cls(run_id, cast(Literal["start", "resume"], op), budget)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An entry this runner holds: where it came from and its id there."""

    entry: Entry | None
    priority: Priority
    entry_id: str


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Entries waiting in one priority class (not yet taken), and the oldest one's age."""

    priority: Priority
    waiting: int
    oldest_age_s: float


class RunQueue:
    """What ``chainrt serve`` needs of a queue. The default methods suit a queue without
    orphans (one process)."""

    async def put(self, entry: Entry, priority: Priority) -> None:
        """Add an entry."""
        raise NotImplementedError

    async def take(self, wait_s: float) -> Delivery | None:
        """The next entry, critical first; None after ``wait_s`` without one."""
        raise NotImplementedError

    async def ack(self, delivery: Delivery) -> None:
        """The entry's run is final: forget it."""

    async def hand_back(self, delivery: Delivery) -> None:
        """Give the entry back so that another runner takes it at once."""
        if delivery.entry is not None:
            await self.put(delivery.entry, delivery.priority)

    async def touch(self, deliveries: list[Delivery]) -> None:
        """Keep entries this runner is working on from looking orphaned."""

    async def orphans(self, count: int) -> list[Delivery]:
        """Up to ``count`` entries whose holders stopped touching them."""
        return []

    async def depth(self) -> list[QueueDepth]:
        """Waiting entries per priority class."""
        return []

    async def close(self) -> None:
        """Release connections."""


class LocalQueue(RunQueue):
    """An in-process queue (the SQLite store: one ``chainrt serve`` alone)."""

    def __init__(self) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, Entry]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._added: dict[int, collections.deque[float]] = {
            i: collections.deque() for i in range(len(PRIORITIES))
        }

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

    async def depth(self) -> list[QueueDepth]:
        """Waiting entries per priority class."""
        now = time.time()
        return [
            QueueDepth(p, len(self._added[i]), now - self._added[i][0] if self._added[i] else 0.0)
            for i, p in enumerate(PRIORITIES)
        ]


class RedisQueue(RunQueue):
    """The queue on Redis Streams consumer groups (redis-py, ``redis.asyncio``)."""

    def __init__(
        self, url: str, consumer: str, *, orphan_idle_s: float = 3.0, prefix: str = "chainrt"
    ) -> None:
        import redis.asyncio as aioredis

        from ..store._cluster import split_options

        self._url = split_options(url)[0]  # the store's own options are not redis-py's
        self._client: Any = aioredis.Redis.from_url(self._url, socket_connect_timeout=1.0)
        # XREADGROUP BLOCK holds its connection: it gets a client of its own.
        self._blocking: Any = aioredis.Redis.from_url(self._url, socket_connect_timeout=1.0)
        self.cluster: bool | None = None
        """True on a Redis Cluster (found out on first use, as the store does)."""
        self.consumer = consumer
        self.orphan_idle_s = orphan_idle_s
        self._streams = {p: stream_key(p, prefix) for p in PRIORITIES}
        self._backlog: list[Delivery] = []
        self._ready = False

    async def _groups(self) -> None:
        if self._ready:
            return
        from redis import exceptions as rx

        if self.cluster is None:
            await self._detect()
        for stream in self._streams.values():
            with contextlib.suppress(rx.ResponseError):  # BUSYGROUP: it exists
                await self._client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        self._ready = True

    async def _detect(self) -> None:
        """On a Redis Cluster node, switch both clients to cluster clients (ready before use).

        The streams share the ``{queue}`` slot, so every command and ``MULTI`` here is
        single-slot; the cluster client sends them to that slot's master, wherever it is now.
        """
        from ..store._cluster import close_client, cluster_client, is_cluster

        found = await is_cluster(self._client)
        if self.cluster is not None:
            return  # another call found out first
        if not found:
            self.cluster = False
            return
        clients = [cluster_client(self._url, socket_connect_timeout=1.0) for _ in range(2)]
        for client in clients:
            await client.initialize()
        if self.cluster is not None:
            for client in clients:
                await close_client(client)
            return
        old = (self._client, self._blocking)
        (self._client, self._blocking), self.cluster = clients, True
        for client in old:
            await client.aclose()

    async def put(self, entry: Entry, priority: Priority) -> None:
        """``XADD`` to the priority's stream."""
        await self._groups()
        await self._client.xadd(self._streams[priority], entry.fields())

    async def take(self, wait_s: float) -> Delivery | None:
        """Critical first: one non-blocking read per class, then one blocking read on all."""
        await self._groups()
        if self._backlog:
            return self._backlog.pop(0)
        for priority in PRIORITIES:
            reply = await self._client.xreadgroup(
                GROUP, self.consumer, {self._streams[priority]: ">"}, count=1
            )
            found = self._deliveries(reply)
            if found:
                return found[0]
        reply = await self._blocking.xreadgroup(
            GROUP,
            self.consumer,
            {s: ">" for s in self._streams.values()},
            count=1,
            block=max(1, int(wait_s * 1000)),
        )
        found = sorted(self._deliveries(reply), key=lambda d: PRIORITIES.index(d.priority))
        if not found:
            return None
        self._backlog.extend(found[1:])  # rare: several classes got an entry in the same instant
        return found[0]

    async def ack(self, delivery: Delivery) -> None:
        """``XACK`` + ``XDEL``: the entry is done."""
        stream = self._streams[delivery.priority]

        def queue(pipe: Any) -> None:
            pipe.xack(stream, GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)

        await self._transaction(queue)

    async def hand_back(self, delivery: Delivery) -> None:
        """Add the entry again and delete this one (one ``MULTI``): readable by others at once."""
        stream = self._streams[delivery.priority]

        def queue(pipe: Any) -> None:
            if delivery.entry is not None:
                pipe.xadd(stream, delivery.entry.fields())
            pipe.xack(stream, GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)

        await self._transaction(queue)

    async def _transaction(self, queue: Callable[[Any], None]) -> None:
        """One ``MULTI``/``EXEC`` of the commands ``queue`` adds, sent again while a Redis
        Cluster redirects or refuses it (``MOVED``/``ASK`` while the ``{queue}`` slot migrates,
        ``TRYAGAIN``, ``CLUSTERDOWN``): redis-py follows redirections for single commands but
        not inside a transaction, and a redirected or refused ``MULTI`` applied nothing, so
        sending it again cannot apply it twice. Gives up after ``TRANSACTION_RETRY_S``."""
        from ..store._cluster import is_cluster_transient

        give_up = time.monotonic() + TRANSACTION_RETRY_S
        delay = 0.02
        while True:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    queue(pipe)
                    await pipe.execute()
                return
            except Exception as exc:
                if not self.cluster or not is_cluster_transient(exc):
                    raise
                if time.monotonic() + delay > give_up:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def touch(self, deliveries: list[Delivery]) -> None:
        """``XCLAIM`` this runner's entries to itself (``JUSTID``): their idle time restarts."""
        by_stream: dict[str, list[int | bytes | str | memoryview[int]]] = {}
        for d in [*deliveries, *self._backlog]:
            by_stream.setdefault(self._streams[d.priority], []).append(d.entry_id)
        for stream, ids in by_stream.items():
            await self._client.xclaim(stream, GROUP, self.consumer, 0, ids, justid=True)

    async def orphans(self, count: int) -> list[Delivery]:
        """``XAUTOCLAIM`` entries idle longer than ``orphan_idle_s``, critical first."""
        await self._groups()
        found: list[Delivery] = []
        idle_ms = int(self.orphan_idle_s * 1000)
        for priority in PRIORITIES:
            if len(found) >= count:
                break
            stream = self._streams[priority]
            reply = await self._client.xautoclaim(
                stream, GROUP, self.consumer, idle_ms, "0-0", count=count - len(found)
            )
            for entry_id, fields in reply[1]:
                if fields is None:
                    continue
                found.append(Delivery(Entry.parse(fields), priority, _text(entry_id)))
        return found

    async def depth(self) -> list[QueueDepth]:
        """Entries not yet read by any runner, per class, and the oldest one's age."""
        await self._groups()
        out = []
        now_ms = time.time() * 1000
        for priority, stream in self._streams.items():
            groups = await self._client.xinfo_groups(stream)
            group = next((g for g in groups if _text(g["name"]) == GROUP), None)
            last = _text(group["last-delivered-id"]) if group else "0-0"
            waiting = int(group.get("lag") or 0) if group else 0
            oldest = 0.0
            if waiting:
                after = await self._client.xrange(stream, min=f"({last}", count=1)
                if after:
                    oldest = max(0.0, (now_ms - int(_text(after[0][0]).split("-")[0])) / 1000)
            out.append(QueueDepth(priority, waiting, oldest))
        return out

    async def close(self) -> None:
        """Close both connection pools."""
        from ..store._cluster import close_client

        await close_client(self._client)
        await close_client(self._blocking)

    def _deliveries(self, reply: Any) -> list[Delivery]:
        by_stream = {v: k for k, v in self._streams.items()}
        out = []
        for raw_stream, messages in reply or []:
            priority = by_stream[_text(raw_stream)]
            for entry_id, fields in messages:
                out.append(Delivery(Entry.parse(fields), priority, _text(entry_id)))
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
