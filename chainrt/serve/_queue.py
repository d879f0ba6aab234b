"""The run queue of ``chainrt serve`` (docs/serve.md): Redis Streams, or in-process for SQLite.

Redis layout (default prefix ``chainrt``; every key shares the hash tag ``{queue}`` so one
``XREADGROUP`` can wait on all streams and one ``MULTI`` moves an entry, on Redis Cluster too;
all keys come from :class:`QueueKeys`)::

    chainrt:{queue}:critical                stream, group "runners": entries of any chain
    chainrt:{queue}:critical:chain:<name>   stream, group "runners": entries of chain <name>
    ... the same for high, normal, low
    chainrt:{queue}:dead                    stream: dead letters (entry, reason, deliveries)
    chainrt:{queue}:runners                 hash: consumer -> {"chains", "expires_at"}
    chainrt:{queue}:chains                  set: every chain some runner announced

A run's entry goes to its chain's stream, and a runner reads only the streams of the chains it
serves (and the shared ones): a runner never takes a run it cannot run. It reads with
``XREADGROUP`` (critical first), so an entry it holds is in its pending list until the run is
final: then ``XACK`` + ``XDEL``. While the run executes, the runner touches its entries
(``XCLAIM`` to itself, idle reset) every second; an entry idle for longer than ``orphan_idle_s``
belongs to a runner that stopped touching it (killed, hung, partitioned) and any runner serving
its chain takes it with ``XAUTOCLAIM`` — the scan goes on from where the last one stopped (the
cursor is kept per stream), so old entries never starve newer orphans — then looks at the run's
owner lease before resuming it (the fencing token keeps one owner). A draining runner hands an
entry back by adding it again and deleting its own (one ``MULTI``). An entry whose handling
fails for good is moved to the dead letters once delivered ``max_deliveries`` times.

A consumer group that is gone (Redis restarted without persistence: ``NOGROUP``) is created
again on the spot; after any connection error the groups are checked again before the next read.

This module is the hot path (put, take, ack, hand back); the clients, groups, cluster detection
and retried ``MULTI`` are :mod:`._queue_redis`'s, the upkeep and dead letters
:mod:`._queue_upkeep`'s, the in-process queue :mod:`._queue_local`'s.
"""

from __future__ import annotations

from typing import Any

from ..redis import FALLBACK, LOST, NOT_SENT, LeanRedis, pack, send_bare
from ._queue_base import (
    PRIORITIES,
    DeadLetter,
    Delivery,
    Entry,
    Priority,
    QueueDepth,
    QueueKeys,
    RunQueue,
    stream_key,
)
from ._queue_local import LocalQueue
from ._queue_redis import GROUP, as_text
from ._queue_upkeep import RedisUpkeep

__all__ = [
    "PRIORITIES",
    "DeadLetter",
    "Delivery",
    "Entry",
    "LocalQueue",
    "Priority",
    "QueueDepth",
    "QueueKeys",
    "RedisQueue",
    "RunQueue",
    "stream_key",
]

MAX_BLOCK_S = 5.0

_TAKE_SCRIPT = """
-- KEYS: the streams of every priority class, critical first; ARGV: group, consumer, then how
-- many of KEYS each class has. Reads the classes in order (XREADGROUP COUNT 1, not blocking)
-- and answers the first read that found entries: one round trip instead of one per class.
local at = 1
for i = 3, #ARGV do
  local n = tonumber(ARGV[i])
  if n > 0 then
    local args = {'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', '1', 'STREAMS'}
    for j = at, at + n - 1 do args[#args + 1] = KEYS[j] end
    for _ = 1, n do args[#args + 1] = '>' end
    local reply = redis.call(unpack(args))
    if reply then return reply end
  end
  at = at + n
end
return false
"""


class RedisQueue(RedisUpkeep):
    """The queue on Redis Streams consumer groups (redis-py, ``redis.asyncio``). ``chains``: the
    chains this runner serves (their streams are read besides the shared ones).

    The hot path (put, take, ack, hand back) is here; it inherits the clients, groups and
    cluster detection (:class:`~._queue_redis.RedisStreams`) and the upkeep and dead letters
    (:class:`~._queue_upkeep.RedisUpkeep`).
    """

    # ------------------------------------------------------------------ the hot path

    async def put(self, entry: Entry, priority: Priority) -> None:
        """``XADD`` to the stream of the entry's chain and priority (on one node on the pipe;
        if it fails there, through the client: an entry added twice is still run once, as the
        claim of its run is fenced)."""
        stream = self.keys.stream(priority, entry.chain or None)
        await self._groups()
        fields = entry.fields()
        lean = self._pipe()
        if lean is not None:
            flat = [part for pair in fields.items() for part in pair]
            reply = await _on_pipe(lean, pack("XADD", stream, "*", *flat))
            if reply is not _SLOW:
                return
        await self._client.xadd(stream, fields)

    async def take(self, wait_s: float) -> Delivery | None:
        """Critical first: one non-blocking read of the classes in order (on one node one
        script, one round trip; on a cluster one read per class), then one blocking read on
        all."""
        if self._backlog:
            return self._backlog.pop(0)
        found = await self._guarded(self._read_first_class)
        if not found and self.cluster:
            found = await self._read_classes_one_by_one()
        if found:
            self._backlog.extend(found[1:])  # one per stream: the rest wait here, touched
            return found[0]
        block_ms = max(1, int(min(wait_s, MAX_BLOCK_S) * 1000))
        lean = self._blocking_lean()
        if lean is not None:  # one node: on a bare connection of the blocking client's
            streams = list(self._streams)
            command = pack(
                "XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", 1, "BLOCK", block_ms,
                "STREAMS", *streams, *(">" for _ in streams),
            )  # fmt: skip
            raw = await self._guarded(lambda: _blocking_read(lean, command))
            found = self._flat_deliveries(raw)
        else:
            every = {s: ">" for s in self._streams}
            reply = await self._guarded(
                lambda: self._blocking.xreadgroup(
                    GROUP, self.consumer, every, count=1, block=block_ms
                )
            )
            found = self._deliveries(reply)
        found.sort(key=lambda d: PRIORITIES.index(d.priority))
        if not found:
            return None
        self._backlog.extend(found[1:])  # rare: several streams got an entry in the same instant
        return found[0]

    async def _read_classes_one_by_one(self) -> list[Delivery]:
        """On a Redis Cluster: one ``XREADGROUP`` per class, critical first. redis-py follows
        ``ASK``/``TRYAGAIN`` for a plain command while the ``{queue}`` slot migrates; the take
        script, sent again on every redirection, ran out of redirections there."""
        for priority in PRIORITIES:
            streams = {s: ">" for s in self._by_priority[priority]}
            reply = await self._guarded(
                lambda streams=streams: self._client.xreadgroup(  # type: ignore[misc]
                    GROUP, self.consumer, streams, count=1
                )
            )
            found = self._deliveries(reply)
            if found:
                return found
        return []

    async def _read_first_class(self) -> list[Delivery]:
        """One round trip (:data:`_TAKE_SCRIPT`): the entries of the first priority class that
        has any, at most one per stream of it (on one node; ``[]`` on a cluster, which reads
        with :meth:`_read_classes_one_by_one`)."""
        if self.cluster:
            return []
        if self._take_script is None:
            self._take_script = self._client.register_script(_TAKE_SCRIPT)
        keys = [s for p in PRIORITIES for s in self._by_priority[p]]
        counts = [len(self._by_priority[p]) for p in PRIORITIES]
        reply = _SLOW
        lean = self._pipe()
        if lean is not None:  # NOSCRIPT (first use, or Redis restarted): the client loads it
            sha = self._take_script.sha
            command = pack("EVALSHA", sha, len(keys), *keys, GROUP, self.consumer, *counts)
            reply = await _on_pipe(lean, command)
        if reply is _SLOW:
            reply = await self._take_script(keys=keys, args=[GROUP, self.consumer, *counts])
        return self._flat_deliveries(reply)

    def _flat_deliveries(self, reply: Any) -> list[Delivery]:
        """The deliveries of an ``XREADGROUP`` reply as Redis sends it (streams and entries
        with flat field lists; RESP2 pairs or a RESP3 map; None: nothing came)."""
        out = []
        pairs = reply.items() if isinstance(reply, dict) else reply or []
        for raw_stream, messages in pairs:
            stream = as_text(raw_stream)
            priority, _ = self._streams[stream]
            for entry_id, flat in messages:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                out.append(self._delivery(priority, stream, entry_id, fields))
        return out

    async def ack(self, delivery: Delivery) -> None:
        """``XACK`` + ``XDEL``: the entry is done (one ``MULTI``; on one node on the pipe)."""
        stream = self._stream_of(delivery)
        lean = self._pipe()
        if lean is not None:
            commands = (
                pack("XACK", stream, GROUP, delivery.entry_id),
                pack("XDEL", stream, delivery.entry_id),
            )
            if await _on_pipe(lean, commands) is not _SLOW:
                return

        def queue(pipe: Any) -> None:
            pipe.xack(stream, GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)

        await self._transaction(queue)

    async def hand_back(self, delivery: Delivery) -> None:
        """Add the entry again and delete this one (one ``MULTI``): readable by others at once."""
        stream = self._stream_of(delivery)

        def queue(pipe: Any) -> None:
            if delivery.entry is not None:
                pipe.xadd(stream, delivery.entry.fields())
            pipe.xack(stream, GROUP, delivery.entry_id)
            pipe.xdel(stream, delivery.entry_id)

        await self._transaction(queue)


async def _blocking_read(lean: LeanRedis, command: bytes) -> Any:
    """A blocking read on a bare connection of its own: its reply; a Redis error raised."""
    from redis import exceptions as rx

    (reply,) = await lean.call([command])
    if isinstance(reply, rx.ResponseError):
        raise reply
    return reply


_SLOW: Any = object()
"""What :func:`_on_pipe` returns for a command to send again through the client."""


async def _on_pipe(lean: LeanRedis, command: bytes | tuple[bytes, ...]) -> Any:
    """``command`` on a queue's pipe (several: one ``MULTI``): its reply; a Redis error reply
    raised (as redis-py raises it: ``NOGROUP`` reaches :meth:`RedisStreams._guarded`);
    :data:`_SLOW` where the command must go through the client instead (:func:`send_bare`'s
    cases: the pipe broke or timed out, the server lost the take script; or no pipe open for a
    ``MULTI``). The client retries; every command here is safe to send again."""
    from redis import exceptions as rx

    if isinstance(command, bytes):
        reply = await send_bare(command, lean, pipelined=True)
    else:
        try:
            reply = await lean.multi_unconfirmed(command)
        except LOST:
            return _SLOW
    if reply is FALLBACK or reply is NOT_SENT:
        return _SLOW
    if isinstance(reply, rx.ResponseError):
        raise reply
    if isinstance(reply, list):  # (a MULTI's replies: one refused is raised the same way)
        for item in reply:
            if isinstance(item, rx.ResponseError):
                raise item
    return reply
