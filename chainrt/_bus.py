"""Redis pub/sub between runtimes of one fleet: cancels to the owner, run events to watchers.

Channels (default prefix ``chainrt``; see ``docs/serve.md`` for the whole key layout)::

    chainrt:cancel            a run id: "this run was cancelled; its owner stops it now"
    chainrt:events:<run_id>   one JSON run event (DESIGN §13) per message, from the run's owner
    chainrt:run-changes       {"run_id", "status"}: a run was created, started, ended or was
                              cancelled (the runs list's live feed, ``serve/_feed.py``)

Pub/sub is a notification, never the record: a cancel is written to the store first (the owner
is fenced out even if it misses the message), and an event stream starts from the stored history.
A lost connection is re-opened with a short backoff; messages sent meanwhile are lost, which the
readers above tolerate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rx

from ._events import RunEvent
from .store._cluster import split_options

__all__ = ["CancelBus", "EventPublisher", "cancel_channel", "events_channel", "runs_channel"]

log = logging.getLogger("chainrt.bus")

_PREFIX = "chainrt"
_BACKOFF_S = (0.05, 0.2, 0.5, 1.0)
_PUBLISH_BATCH = 256


def cancel_channel(prefix: str = _PREFIX) -> str:
    """The channel cancels are announced on."""
    return f"{prefix}:cancel"


def events_channel(run_id: str, prefix: str = _PREFIX) -> str:
    """The channel a run's owner publishes its live events on."""
    return f"{prefix}:events:{run_id}"


def runs_channel(prefix: str = _PREFIX) -> str:
    """The channel runners announce runs-list changes on (a run created, started, ended)."""
    return f"{prefix}:run-changes"


def _notice(run_id: str, status: str | None) -> str:
    return json.dumps({"run_id": run_id, "status": status})


def _event_notice(event: RunEvent) -> str | None:
    """The runs-list notice a run event stands for (a run started or ended), if any."""
    if event.type == "run_started":
        return _notice(event.run_id, "running")
    if event.type == "run_finished":
        status = event.data.get("status")
        return _notice(event.run_id, status if isinstance(status, str) else None)
    return None


def _client(url: str) -> aioredis.Redis:
    # A plain client even on a Redis Cluster: classic pub/sub reaches every node of a cluster.
    # The store's own URL options (wait_replicas ...) are not redis-py's: taken off here.
    return aioredis.Redis.from_url(
        split_options(url)[0], socket_connect_timeout=1.0, health_check_interval=10
    )


async def subscribe(url: str, channel: str) -> AsyncGenerator[bytes, None]:
    """Yield each message on ``channel``, re-subscribing after a lost connection."""
    attempt = 0
    while True:
        client = _client(url)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            attempt = 0
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and isinstance(message.get("data"), bytes):
                    yield message["data"]
        except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
            delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
            attempt += 1
            log.warning("pub/sub on %s lost (%s); again in %.2fs", channel, exc, delay)
            await asyncio.sleep(delay)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                await asyncio.shield(client.aclose())


class CancelBus:
    """Announces cancels and hears those of other processes (store URL ``redis://...``)."""

    def __init__(self, url: str, prefix: str = _PREFIX) -> None:
        self._url = url
        self._channel = cancel_channel(prefix)
        self._client: aioredis.Redis | None = None

    async def publish_cancel(self, run_id: str) -> None:
        """Tell every runtime that ``run_id`` was cancelled (best effort: the store has it)."""
        if self._client is None:
            self._client = _client(self._url)
        try:
            await self._client.publish(self._channel, run_id)
        except (rx.RedisError, OSError) as exc:
            log.warning(
                "cancel of %s not announced (%s); its owner sees it at its next write", run_id, exc
            )

    async def cancels(self) -> AsyncIterator[str]:
        """Run ids cancelled anywhere, as they are announced."""
        async for data in subscribe(self._url, self._channel):
            yield data.decode(errors="replace")

    async def close(self) -> None:
        """Close the publishing connection."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class EventPublisher:
    """Publishes run events for watchers on other processes, off the run's path: ``publish``
    only queues; a background task sends what is queued in pipelined batches. A run's
    ``run_started`` and ``run_finished`` are also announced on :func:`runs_channel`, as are the
    changes :meth:`announce` is told of."""

    def __init__(self, url: str, prefix: str = _PREFIX) -> None:
        self._url = url
        self._prefix = prefix
        self._queue: asyncio.Queue[RunEvent | tuple[str, str | None]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def publish(self, event: RunEvent) -> None:
        """Queue ``event`` for publication (never blocks, never fails the run)."""
        self._queue.put_nowait(event)
        if self._task is None:
            self._task = asyncio.ensure_future(self._send())

    def announce(self, run_id: str, status: str | None) -> None:
        """Queue a runs-list notice: ``run_id`` changed (to ``status`` when known)."""
        self._queue.put_nowait((run_id, status))
        if self._task is None:
            self._task = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        client = _client(self._url)
        try:
            while True:
                batch = [await self._queue.get()]
                while not self._queue.empty() and len(batch) < _PUBLISH_BATCH:
                    batch.append(self._queue.get_nowait())
                try:
                    async with client.pipeline(transaction=False) as pipe:
                        for item in batch:
                            if isinstance(item, tuple):
                                pipe.publish(runs_channel(self._prefix), _notice(*item))
                                continue
                            channel = events_channel(item.run_id, self._prefix)
                            pipe.publish(channel, json.dumps(item.to_dict()))
                            notice = _event_notice(item)
                            if notice is not None:
                                pipe.publish(runs_channel(self._prefix), notice)
                        await pipe.execute()
                except (rx.RedisError, OSError) as exc:
                    log.warning("%d run events not published (%s)", len(batch), exc)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(client.aclose())

    async def close(self) -> None:
        """Stop publishing (events still queued are dropped)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None


def parse_event(data: bytes) -> RunEvent | None:
    """A published event, or None when the message is not one (it is logged and skipped)."""
    try:
        raw: Any = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return RunEvent.from_dict(raw)
    except ValueError as exc:
        log.warning("skipping a malformed run event message: %s", exc)
        return None
