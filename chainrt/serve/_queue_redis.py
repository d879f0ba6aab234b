"""The Redis side of ``chainrt serve``'s run queue that its operations share (docs/serve.md):
the clients, the consumer groups (created again after Redis lost them), Redis Cluster detection,
the ``MULTI`` sent again while a cluster redirects it, and the reading of stream replies.

:class:`RedisStreams` is the base of :class:`~._queue.RedisQueue`: the hot path (put, take, ack,
hand back) is :mod:`._queue`'s, the upkeep and dead letters :mod:`._queue_upkeep`'s. The key
layout is in :mod:`._queue`'s docstring and :class:`~._queue_base.QueueKeys`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from .._settings import get_settings
from ._queue_base import (
    DEFAULT_MAX_DELIVERIES,
    PRIORITIES,
    Delivery,
    Entry,
    Priority,
    QueueKeys,
    RunQueue,
)

__all__ = ["GROUP", "SOCKET_TIMEOUT_S", "TRANSACTION_RETRY_S", "RedisStreams", "as_text"]

log = logging.getLogger("chainrt.serve")

GROUP = "runners"
TRANSACTION_RETRY_S = 10.0
"""How long ``ack`` / ``hand_back`` keep sending their ``MULTI`` again while a Redis Cluster
redirects or refuses it (a slot migration or a failover)."""
SOCKET_TIMEOUT_S = 10.0
"""A reply that takes longer is a dead connection (Redis paused or partitioned): the loop that
waits for it fails and is started again, instead of waiting for ever. Longer than any block."""

T = TypeVar("T")


class RedisStreams(RunQueue):
    """The queue's clients, consumer groups and reply parsing on Redis Streams (redis-py,
    ``redis.asyncio``). ``chains``: the chains this runner serves (their streams are read
    besides the shared ones)."""

    def __init__(
        self,
        url: str,
        consumer: str,
        *,
        orphan_idle_s: float = 3.0,
        prefix: str = "chainrt",
        chains: Iterable[str] = (),
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    ) -> None:
        import redis.asyncio as aioredis

        from ..redis import split_options

        self._url = split_options(url)[0]  # the store's own options are not redis-py's
        options: dict[str, Any] = {
            "socket_connect_timeout": 1.0,
            "socket_timeout": SOCKET_TIMEOUT_S,
        }
        self._options = options
        # At most CHAINRT_REDIS_MAX_CONNECTIONS connections; a burst of submits waits for one
        # (on a cluster, cluster_client bounds each node the same way).
        pool = aioredis.BlockingConnectionPool.from_url(
            self._url, max_connections=get_settings().redis_max_connections, timeout=10.0, **options
        )
        self._client: Any = aioredis.Redis.from_pool(pool)
        # XREADGROUP BLOCK holds its connection: it gets a client of its own.
        self._blocking: Any = aioredis.Redis.from_url(self._url, **options)
        self.cluster: bool | None = None
        """True on a Redis Cluster (found out on first use, as the store does)."""
        self.consumer = consumer
        self.orphan_idle_s = orphan_idle_s
        self.max_deliveries = max_deliveries
        self.keys = QueueKeys(prefix)
        self.chains = sorted(set(chains))
        self._by_priority: dict[Priority, list[str]] = {
            p: [self.keys.stream(p), *(self.keys.stream(p, c) for c in self.chains)]
            for p in PRIORITIES
        }
        self._streams: dict[str, tuple[Priority, str]] = {
            self.keys.stream(p, c or None): (p, c) for p in PRIORITIES for c in ["", *self.chains]
        }
        self._cursors: dict[str, str] = {}
        self._backlog: list[Delivery] = []
        self._take_script: Any = None
        self._ready = False
        self._lean: Any = None  # (LeanRedis, made on first use on one node)
        self._blocking_bare: Any = None  # (LeanRedis for the blocking reads, the same)

    # ------------------------------------------------------------------ groups and faults

    async def _groups(self) -> None:
        if self._ready:
            return
        from redis import exceptions as rx

        if self.cluster is None:
            await self._detect()
        for stream in self._streams:
            with contextlib.suppress(rx.ResponseError):  # BUSYGROUP: it exists
                await self._client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        self._ready = True

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` with the groups in place: after ``NOGROUP`` (Redis lost them) they are
        created again and ``call`` is sent once more; after a connection error they are checked
        again before the next call (the server may have restarted empty)."""
        from redis import exceptions as rx

        await self._groups()
        try:
            return await call()
        except rx.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            self._ready = False
            raise
        log.warning("queue: a consumer group was gone (Redis restarted empty?); created again")
        self._ready = False
        await self._groups()
        return await call()

    async def _detect(self) -> None:
        """On a Redis Cluster node, switch both clients to cluster clients (ready before use).

        The streams share the ``{queue}`` slot, so every command and ``MULTI`` here is
        single-slot; the cluster client sends them to that slot's master, wherever it is now.
        """
        from ..redis import close_client, cluster_client, open_cluster

        first = await open_cluster(self._url, probe=self._client, **self._options)
        if first is None:
            if self.cluster is None:  # (else another call found out first)
                self.cluster = False
            return
        clients = [first, cluster_client(self._url, **self._options)]
        await clients[1].initialize()
        if self.cluster is not None:  # another call found out first
            for client in clients:
                await close_client(client)
            return
        old = (self._client, self._blocking)
        (self._client, self._blocking), self.cluster = clients, True
        for client in old:
            await client.aclose()

    def _pipe(self) -> Any:
        """On one node, the queue client's bare connections (:class:`chainrt.redis.LeanRedis`):
        the hot path's commands go on their pipe, as the store's commits do (redis-py's
        command layer cost more CPU than the commands). None on a cluster or before the first
        call has found out which it is."""
        if self.cluster is not False:
            return None
        if self._lean is None:
            from ..redis import LeanRedis

            self._lean = LeanRedis(self._client, timeout_s=SOCKET_TIMEOUT_S)
        return self._lean

    def _blocking_lean(self) -> Any:
        """On one node, bare connections built like the blocking client's, for ``XREADGROUP
        BLOCK`` (a call blocks one connection; a call cut by a cancel drops its connection).
        None on a cluster or before the first call has found out which it is."""
        if self.cluster is not False:
            return None
        if self._blocking_bare is None:
            from ..redis import LeanRedis

            self._blocking_bare = LeanRedis(self._blocking, timeout_s=SOCKET_TIMEOUT_S)
        return self._blocking_bare

    def _stream_of(self, delivery: Delivery) -> str:
        return delivery.stream or self.keys.stream(delivery.priority)

    async def _transaction(self, queue: Callable[[Any], None]) -> list[Any]:
        """One ``MULTI``/``EXEC`` of the commands ``queue`` adds, sent again while a Redis
        Cluster redirects or refuses it (``MOVED``/``ASK`` while the ``{queue}`` slot migrates,
        ``TRYAGAIN``, ``CLUSTERDOWN``): redis-py follows redirections for single commands but
        not inside a transaction, and a redirected or refused ``MULTI`` applied nothing, so
        sending it again cannot apply it twice. Gives up after ``TRANSACTION_RETRY_S``."""
        from ..redis import is_cluster_transient

        give_up = time.monotonic() + TRANSACTION_RETRY_S
        delay = 0.02
        while True:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    queue(pipe)
                    return list(await pipe.execute())
            except Exception as exc:
                if not self.cluster or not is_cluster_transient(exc):
                    raise
                if time.monotonic() + delay > give_up:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def close(self) -> None:
        """Leave the runners hash, close both connection pools."""
        from ..redis import close_client

        with contextlib.suppress(Exception):
            await self._client.hdel(self.keys.runners, self.consumer)
        for lean in (self._lean, self._blocking_bare):
            if lean is not None:
                await lean.aclose()
        await close_client(self._client)
        await close_client(self._blocking)

    def _delivery(self, priority: Priority, stream: str, entry_id: Any, fields: Any) -> Delivery:
        entry = Entry.parse(fields)
        raw: tuple[tuple[str, str], ...] = ()
        if entry is None:  # kept only for the dead letter of what is no entry
            raw = tuple((as_text(k)[:64], as_text(v)[:512]) for k, v in list(fields.items())[:16])
        return Delivery(entry, priority, as_text(entry_id), stream, raw)

    def _deliveries(self, reply: Any) -> list[Delivery]:
        out = []
        for raw_stream, messages in reply or []:
            stream = as_text(raw_stream)
            priority, _ = self._streams[stream]
            for entry_id, fields in messages:
                out.append(self._delivery(priority, stream, entry_id, fields))
        return out


def as_text(value: Any) -> str:
    """A reply's bytes (or anything) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
