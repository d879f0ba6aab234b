"""Redis pub/sub between runtimes of one fleet: cancels to the owner, run events to watchers.

Channels (default prefix ``chainrt``; built by :mod:`chainrt.redis.keys`, listed with every key
in ``docs/redis-cluster.md``)::

    chainrt:cancel            a run id: "this run was cancelled; its owner stops it now"
    chainrt:events:<run_id>   one JSON run event (docs/serve.md, Run events) per message, from the run's owner
    chainrt:run-changes       {"run_id", "status"}: a run was created, started, ended or was
                              cancelled (the runs list's live feed, ``serve/_feed.py``)
    chainrt:events-replay     {"run_id", "id"}: a watcher that just subscribed asks the run's
                              owner for the events of its steps in flight; the owner answers on
                              the run's events channel with {"replay": id, "events": [...]}

A process hears any number of channels on one connection (:class:`SharedSubscriber`): a
``chainrt serve`` with a thousand event streams open holds one pub/sub connection, not one per
stream.

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
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rx

from ._events import RunEvent
from .redis import BareSubscription, LeanRedis, pack, split_options
from .redis.keys import PREFIX as _PREFIX
from .redis.keys import cancel_channel, events_channel, replay_channel, runs_channel

__all__ = [
    "CancelBus",
    "EventPublisher",
    "SharedSubscriber",
    "cancel_channel",
    "events_channel",
    "publish_client",
    "replay_channel",
    "runs_channel",
]

log = logging.getLogger("chainrt.bus")

_BACKOFF_S = (0.05, 0.2, 0.5, 1.0)
_PUBLISH_BATCH = 256
_PUBLISH_TIMEOUT_S = 5.0
"""A batch of events not answered within this is given up (logged); the next opens a new
connection."""


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


def publish_client(url: str) -> aioredis.Redis:
    """A client to publish on (one connection at a time; never a cluster client: see above)."""
    return _client(url)


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
                await asyncio.shield(pubsub.aclose())
            with contextlib.suppress(Exception):
                await asyncio.shield(client.aclose())


Handler = Callable[[bytes], None]


class SharedSubscriber:
    """Any number of channels heard on one Redis connection, for any number of listeners.

    :meth:`listen` returns once Redis has confirmed the subscription (a message published after
    that reaches the handler: what a reader of history needs to subscribe *before* it reads).
    A lost connection is opened again with a short backoff and every channel subscribed again;
    messages sent meanwhile are lost (the readers tolerate it). Handlers run on the event loop,
    in the order messages arrive, and must not block."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._handlers: dict[str, list[Handler]] = {}
        self._confirmed: set[str] = set()
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._subscription: BareSubscription | None = None
        self._confirmed_once = False
        self._client: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closed = False

    @property
    def channels(self) -> int:
        """Channels listened to now."""
        return len(self._handlers)

    async def listen(self, channel: str, handler: Handler, *, timeout_s: float = 5.0) -> bool:
        """Call ``handler`` with each message of ``channel`` from now on. True once Redis has
        confirmed the subscription; False if it did not within ``timeout_s`` (the handler is
        registered all the same and hears the channel once the connection is back)."""
        handlers = self._handlers.setdefault(channel, [])
        handlers.append(handler)
        if channel in self._confirmed:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(channel, []).append(waiter)
        self._start()
        if len(handlers) == 1 and self._connected.is_set():
            await self._send("subscribe", channel)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(waiter)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiting.get(channel, [])
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                self._waiting.pop(channel, None)

    async def unlisten(self, channel: str, handler: Handler) -> None:
        """Stop calling ``handler``; the last one of a channel unsubscribes it."""
        handlers = self._handlers.get(channel, [])
        with contextlib.suppress(ValueError):
            handlers.remove(handler)
        if handlers:
            return
        self._handlers.pop(channel, None)
        self._confirmed.discard(channel)
        if self._connected.is_set():
            await self._send("unsubscribe", channel)

    async def _send(self, command: str, channel: str) -> None:
        subscription = self._subscription
        if subscription is not None:  # (lost meanwhile: every channel is subscribed again)
            if command == "subscribe":
                subscription.subscribe(channel)
            else:
                subscription.unsubscribe(channel)

    def _start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        attempt = 0
        while True:
            self._client = client = _client(self._url)
            subscription = None
            try:
                subscription = await BareSubscription.open(client, self._dispatch)
                self._subscription = subscription
                # Always one channel (the replay channel every owner answers on), so that a
                # process listening to nothing yet still holds its subscription.
                subscription.subscribe(*(sorted(self._handlers) or [replay_channel()]))
                self._connected.set()
                exc = await subscription.lost()
                raise exc
            except (rx.RedisError, OSError) as exc:  # (a refused login too: tried again)
                self._connected.clear()
                self._confirmed.clear()
                delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                if attempt == 0:
                    log.warning("shared pub/sub connection lost (%s); again in %.2fs", exc, delay)
                # A connection that worked a while was a success: the next loss starts over.
                attempt = 0 if self._confirmed_once else attempt + 1
                self._confirmed_once = False
                await asyncio.sleep(delay)
            finally:
                self._connected.clear()
                self._subscription = None
                if subscription is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(subscription.aclose())
                with contextlib.suppress(Exception):
                    await asyncio.shield(client.aclose())

    def _dispatch(self, kind: bytes, raw_channel: bytes, data: Any) -> None:
        channel = raw_channel.decode(errors="replace")
        if kind == b"subscribe":
            self._confirmed_once = True
            if channel in self._handlers:
                self._confirmed.add(channel)
            for waiter in self._waiting.get(channel, []):
                if not waiter.done():
                    waiter.set_result(None)
            return
        if kind != b"message" or not isinstance(data, bytes):
            return
        for handler in list(self._handlers.get(channel, ())):
            try:
                handler(data)
            except Exception:  # one listener's failure never stops the others
                log.exception("a pub/sub listener of %s failed", channel)

    async def close(self) -> None:
        """Stop hearing every channel and close the connection."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for waiters in self._waiting.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()


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
        # The batch goes out as packed PUBLISH commands on a bare connection, in one write
        # (redis-py's pipeline packed and parsed them at ~4x the CPU: 8-14 a served run).
        client = _client(self._url)
        lean = LeanRedis(client, timeout_s=_PUBLISH_TIMEOUT_S)
        runs = runs_channel(self._prefix)
        try:
            while True:
                batch = [await self._queue.get()]
                while not self._queue.empty() and len(batch) < _PUBLISH_BATCH:
                    batch.append(self._queue.get_nowait())
                commands = []
                for item in batch:
                    if isinstance(item, tuple):
                        commands.append(pack("PUBLISH", runs, _notice(*item)))
                        continue
                    channel = events_channel(item.run_id, self._prefix)
                    commands.append(pack("PUBLISH", channel, json.dumps(item.to_dict())))
                    notice = _event_notice(item)
                    if notice is not None:
                        commands.append(pack("PUBLISH", runs, notice))
                try:
                    await lean.call([b"".join(commands)], replies=len(commands))
                except (rx.RedisError, OSError) as exc:
                    log.warning("%d run events not published (%s)", len(batch), exc)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(lean.aclose())
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
