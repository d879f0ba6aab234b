"""The Redis limiter: limits that hold across every runner process and host sharing one Redis.

Per key, one Lua script call takes a slot or a ticket (:data:`._lua.TRY`) and one gives it back
(:data:`._lua.FORGET`): an uncontended acquire + release costs two round trips. Slots are leases
renewed by one background task per instance; a holder killed with ``kill -9`` stops renewing and
its slot lapses within ``lease_ttl_s``. Waiters sleep until the releaser's script wakes them over
pub/sub (see :mod:`._redis_wakeups`) or until their ticket needs refreshing (``lease_ttl_s / 3``).

Cancellation: whatever a cancelled (or timed-out) acquisition may have taken is undone by an
idempotent script run in a task the cancellation cannot reach; if that undo reaches Redis before a
try still in flight (two connections, no order between them), it leaves a mark that refuses the
try. A release cut short by a cancellation is finished the same way.

Redis Cluster: :meth:`RedisLimiter.from_url` finds out on first use whether the URL names a
cluster node (as the store does) and then uses redis-py's cluster client. Each concurrency key's
state shares one hash tag, so every script touches one slot: script calls go on bare connections
to the master of that slot (:class:`chainrt.redis.ClusterLean`), and through the cluster client when
redirected or when a connection fails (the script calls and that fallback: :mod:`._redis_calls`). Wake-ups are plain pub/sub, which a cluster delivers on
every node. While a failover or a resharding is under way, script calls are
retried for up to ``cluster_retry_s``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aredis

from .._errors import ConcurrencyError
from ..redis import close_client, split_options
from ..redis.keys import (
    LIMITER_PREFIX,
    check_prefix,
    key_names,
    wake_channel,
    wake_channel_prefix,
)
from ._driver import GRANTED, Attempt, BaseLimiter, holder_of
from ._protocol import KeyRequest, KeyState

# _SHA and _Call: bench/concurrency.py imports them from here.
from ._redis_calls import _SHA as _SHA
from ._redis_calls import ScriptCalls, _bulk, _client_options
from ._redis_calls import _Call as _Call
from ._redis_wakeups import PubSubWaker
from ._wake import Wake

__all__ = ["RedisLimiter"]

_log = logging.getLogger("chainrt.concurrency")

_MAX_CACHED_CALLS = 4096
"""Encoded script arguments kept per KeyRequest (dropped all at once when full)."""


def safe_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (fit for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisLimiter(ScriptCalls, BaseLimiter):
    """Concurrency keys in Redis (standalone or Cluster: a key's state shares one hash tag).

    ``client`` is a ``redis.asyncio.Redis``; the limiter is bound to the event loop it is first
    used on (like the client). Build one per process with :meth:`from_url` or share the store's
    client. Requires Redis >= 5 (scripts replicated by effects, so ``TIME`` may be called).
    """

    def __init__(
        self,
        client: Any,
        *,
        lease_ttl_s: float = 10.0,
        prefix: str = LIMITER_PREFIX,
        owns_client: bool = False,
        display_url: str = "redis",
    ) -> None:
        super().__init__()
        if not (isinstance(lease_ttl_s, int | float) and math.isfinite(lease_ttl_s)) or not (
            0.05 <= lease_ttl_s <= 86_400
        ):
            raise ConcurrencyError(
                f"lease_ttl_s must be between 0.05 and 86400 seconds, got {lease_ttl_s!r}"
            )
        self._client = client
        self._owns_client = owns_client
        self._url = display_url
        self._prefix = check_prefix(prefix)
        self._chan = wake_channel_prefix(self._prefix)
        self.lease_ttl_s = float(lease_ttl_s)
        self._ttl_ms = round(self.lease_ttl_s * 1000, 3)
        # Waiters look again at least this often: it keeps their ticket alive (tickets lapse
        # after one TTL) and bounds the cost of a lost wake-up.
        self.poll_s = self.lease_ttl_s / 3
        self._waker = PubSubWaker(client, wake_channel(self._prefix, self._iid))
        self._held: dict[str, dict[str, KeyRequest]] = {}  # key -> member -> request (renewal)
        self._renewer: asyncio.Task[None] | None = None
        self._calls: dict[KeyRequest, _Call] = {}
        self._client_closed = False
        self._detect_url = None  # set by from_url: cluster or not, found on first use
        self._detect_lock = None
        self.cluster_retry_s = 10.0
        """How long a script call is retried while a cluster fails over (cluster mode only)."""
        self._cluster = False
        self._lean = None  # bare connections for the script calls (one node)
        self._masters = None  # the same per master, on a cluster
        self._lean_ready = False

    @classmethod
    def from_url(
        cls, url: str, *, lease_ttl_s: float = 10.0, prefix: str = LIMITER_PREFIX
    ) -> RedisLimiter:
        """A limiter with its own client for ``redis://`` / ``rediss://`` ``url``."""
        try:
            client_url = split_options(url)[0]  # the store's own options (wait_replicas ...)
        except ValueError as exc:
            raise ConcurrencyError(f"invalid Redis URL {safe_url(url)!r}: {exc}") from None
        limiter = cls(
            aredis.Redis.from_url(client_url, **_client_options()),
            lease_ttl_s=lease_ttl_s,
            prefix=prefix,
            owns_client=True,
            display_url=safe_url(url),
        )
        limiter._detect_url = client_url
        return limiter

    # ------------------------------------------------------------------ backend primitives

    def _call(self, req: KeyRequest) -> _Call:
        call = self._calls.get(req)
        if call is None:
            if len(self._calls) >= _MAX_CACHED_CALLS:
                self._calls.clear()
            call = self._calls[req] = _Call.build(req, self._prefix, self._ttl_ms, self._chan)
        return call

    async def _try(self, req: KeyRequest, member: str, wake: Wake) -> Attempt:
        if self._closed:
            raise ConcurrencyError("this limiter is closed; open a new one")
        call = self._calls.get(req) or self._call(req)
        # Awaited directly (no task: this is the hot path). If the caller is cancelled now, the
        # call may still land; the undo that follows either removes what it did or, arriving
        # first, marks the member so that it does nothing (see FORGET).
        who = member.encode()
        wire = call.try_wire
        reply = await self._eval(
            "TRY", call.try_keys, (who, *call.try_args), wire[0] + _bulk(who) + wire[1]
        )
        if reply == 1:  # granted (any other answer is a list)
            self._track(req, member)
            return GRANTED
        status, hint_ms, ahead, held = reply
        if status == 3:
            raise ConcurrencyError(f"acquisition of {req.key!r} by {holder_of(member)} was undone")
        return Attempt(
            granted=False,
            retry_in_s=max(int(hint_ms), 0) / 1000,
            rate_limited=status == 2,
            ahead=int(ahead),
            holders=int(held),
        )

    async def _forget(self, requests: Sequence[KeyRequest], member: str, *, undo: bool) -> None:
        for req in requests:
            self._untrack(req.key, member)
        if self._client_closed:
            return  # close() already gave back everything this instance held
        who, flag = member.encode(), b"1" if undo else b"0"
        middle = _bulk(who) + (b"$1\r\n1\r\n" if undo else b"$1\r\n0\r\n")
        for req in requests:
            call = self._calls.get(req) or self._call(req)
            wire = call.forget_wire
            try:
                await self._eval(
                    "FORGET", call.forget_keys, (who, flag, *call.forget_args),
                    wire[0] + middle + wire[1],
                )  # fmt: skip
            except Exception as exc:  # never raise from a release; the lease lapses by itself
                _log.warning(
                    "could not release concurrency key %r of %s (%s); its lease lapses within %gs",
                    req.key,
                    holder_of(member),
                    exc,
                    self.lease_ttl_s,
                )

    def _forget_unconfirmed(self, requests: Sequence[KeyRequest], member: str) -> bool:
        """On one node with the pipe open: send a FORGET per key and return at once (the keys
        stop being renewed now). Each reply is checked when it comes; a FORGET that failed or
        whose outcome is unknown (NOSCRIPT, a lost connection) is sent again the awaited way in
        the background (FORGET is idempotent); :meth:`close` waits for all of them."""
        lean = self._lean
        if lean is None or self._client_closed:
            return False
        middle = _bulk(member.encode()) + b"$1\r\n0\r\n"
        for req in requests:
            wire = (self._calls.get(req) or self._call(req)).forget_wire
            future = lean.send_unconfirmed(wire[0] + middle + wire[1])
            if future is None:  # no pipe: the awaited release opens one (and sends all again)
                return False
            self._background.add(future)
            future.add_done_callback(functools.partial(self._unconfirmed_done, req, member))
        for req in requests:
            self._untrack(req.key, member)
        return True

    def _unconfirmed_done(self, req: KeyRequest, member: str, future: asyncio.Future[Any]) -> None:
        self._background.discard(future)
        failed = future.cancelled() or future.exception() is not None
        if not failed and not isinstance(future.result(), BaseException):
            return  # given back
        # Not applied (NOSCRIPT: the script cache was flushed) or not known to be: again, the
        # way an awaited release goes (EVAL on NOSCRIPT, a new connection, a logged failure).
        self._spawn(self._forget([req], member, undo=False))

    async def _before_wait(self) -> bool:
        return await self._waker.ensure_ready(self.poll_s)

    def _register(self, member: str, wake: Wake) -> None:
        self._waker.register(member, wake)

    def _unregister(self, member: str) -> None:
        self._waker.unregister(member)

    # ------------------------------------------------------------------ leases

    def _track(self, req: KeyRequest, member: str) -> None:
        members = self._held.get(req.key)
        if members is None:
            self._held[req.key] = {member: req}
        else:
            members[member] = req
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_forever(), name="chainrt-lease-renewal")

    def _untrack(self, key: str, member: str) -> None:
        members = self._held.get(key)
        if members is not None:
            members.pop(member, None)
            if not members:
                del self._held[key]

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.renew_now()

    async def renew_now(self) -> None:
        """Extend every lease this instance holds (the background task does this every TTL/3)."""
        held = [(key, list(members)) for key, members in self._held.items()]
        results = await asyncio.gather(
            *(self._eval("RENEW", key_names(self._prefix, key)[:1], (self._ttl_ms, *members))
              for key, members in held),
            return_exceptions=True,
        )  # fmt: skip
        for (key, _), result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                _log.warning("could not renew the leases of concurrency key %r: %s", key, result)
                continue
            for lost in result:
                member = _text(lost)
                if member in self._held.get(key, {}):
                    # Our process stalled past the TTL; someone else may hold the slot by now.
                    _log.warning(
                        "lease of concurrency key %r held by %s lapsed before renewal; "
                        "the key's limit may have been exceeded meanwhile",
                        key,
                        holder_of(member),
                    )
                    self._untrack(key, member)

    # ------------------------------------------------------------------ inspection, shutdown

    async def snapshot(self, key: str) -> KeyState:
        """Live holders and tickets of ``key`` as Redis sees them now."""
        names = key_names(self._prefix, key)
        holders, waiting = await self._eval("SNAPSHOT", names[:3], ())
        return KeyState(
            key,
            tuple(holder_of(_text(m)) for m in holders),
            tuple(holder_of(_text(m)) for m in waiting),
        )

    async def close(self) -> None:
        """Stop renewing, give back what this instance still holds, drop the connections."""
        if self._closed:
            return
        self._closed = True
        renewer, self._renewer = self._renewer, None
        while renewer is not None and not renewer.done():
            renewer.cancel()  # again if need be: redis-py can swallow one (see _eval)
            await asyncio.wait([renewer], timeout=0.5)
        leftovers: dict[str, list[KeyRequest]] = {}
        for members in self._held.values():
            for member, req in members.items():
                leftovers.setdefault(member, []).append(req)
        for member, reqs in leftovers.items():
            await self._forget(reqs, member, undo=False)
        while self._background:  # (a release not waited for may start one more when it ends)
            await asyncio.wait(list(self._background))
        await self._waker.close()
        self._client_closed = True
        if self._lean is not None:
            await self._lean.aclose()
        if self._masters is not None:
            await self._masters.aclose()
        if self._owns_client:
            await close_client(self._client)
