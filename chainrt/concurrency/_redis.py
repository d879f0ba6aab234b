"""The Redis limiter: limits that hold across every runner process and host sharing one Redis.

Per key, one Lua script call takes a slot or a ticket (:data:`._lua.TRY`) and one gives it back
(:data:`._lua.FORGET`): an uncontended acquire + release costs two round trips. Slots are leases
renewed by one background task per instance; a holder killed with ``kill -9`` stops renewing and
its slot lapses within ``lease_ttl_s``. Waiters sleep until the releaser's script wakes them over
pub/sub (see :mod:`._wakeup`) or until their ticket needs refreshing (``lease_ttl_s / 3``).

Cancellation: whatever a cancelled (or timed-out) acquisition may have taken is undone by an
idempotent script run in a task the cancellation cannot reach; if that undo reaches Redis before a
try still in flight (two connections, no order between them), it leaves a mark that refuses the
try. A release cut short by a cancellation is finished the same way.

Redis Cluster: :meth:`RedisLimiter.from_url` finds out on first use whether the URL names a
cluster node (as the store does) and then uses redis-py's cluster client. Each concurrency key's
state shares one hash tag, so every script touches one slot: script calls go on bare connections
to the master of that slot (:mod:`..store._cluster_lean`), and through the cluster client when
redirected or when a connection fails. Wake-ups are plain pub/sub, which a cluster delivers on
every node. While a failover or a resharding is under way, script calls are
retried for up to ``cluster_retry_s``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import ConcurrencyError, StoreUnavailable
from ..store._cluster import (
    close_client,
    cluster_client,
    is_cluster,
    is_cluster_transient,
    split_options,
)
from ..store._cluster_lean import LOST, REDIRECTED, ClusterLean
from ..store._lean import LeanRedis, pack, pack_args
from . import _lua
from ._driver import GRANTED, Attempt, BaseLimiter, holder_of
from ._keys import DEFAULT_PREFIX, check_prefix, key_names, wake_channel_prefix
from ._protocol import KeyRequest, KeyState
from ._wake import Wake
from ._wakeup import PubSubWaker

__all__ = ["RedisLimiter"]

_log = logging.getLogger("chainrt.concurrency")

_MAX_CACHED_CALLS = 4096
"""Encoded script arguments kept per KeyRequest (dropped all at once when full)."""

_SCRIPTS = {name: getattr(_lua, name) for name in ("TRY", "FORGET", "RENEW", "SNAPSHOT")}
_SHA = {
    name: hashlib.sha1(src.encode(), usedforsecurity=False).hexdigest()
    for name, src in _SCRIPTS.items()
}


def safe_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (fit for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, slots=True)
class _Call:
    """The script keys and fixed arguments of one KeyRequest, encoded once (redis-py's per-call
    encoding of a dozen arguments is a visible share of a round trip)."""

    try_keys: tuple[bytes, ...]
    try_args: tuple[bytes, ...]
    forget_keys: tuple[bytes, ...]
    forget_args: tuple[bytes, ...]
    try_wire: tuple[bytes, bytes]
    """The packed EVALSHA of TRY before and after its member (the bare-connection path)."""
    forget_wire: tuple[bytes, bytes]
    """The packed EVALSHA of FORGET before and after its member and undo flag."""

    @classmethod
    def build(cls, req: KeyRequest, prefix: str, ttl_ms: float, chan: str) -> _Call:
        names = key_names(prefix, req.key)
        interval = 0.0 if req.rate_per_s is None else 1000.0 / req.rate_per_s
        limit, ttl = str(req.limit).encode(), repr(ttl_ms).encode()
        try_keys = tuple(n.encode() for n in (*names[:4], names.undone))
        try_args = (limit, ttl, repr(interval).encode(), str(req.burst).encode(), chan.encode())
        forget_keys = tuple(n.encode() for n in (*names[:3], names.undone))
        forget_args = (limit, b"0" if req.rate_per_s is None else b"1", chan.encode(), ttl)
        return cls(
            try_keys=try_keys,
            try_args=try_args,
            forget_keys=forget_keys,
            forget_args=forget_args,
            try_wire=_wire("TRY", try_keys, 1, try_args),
            forget_wire=_wire("FORGET", forget_keys, 2, forget_args),
        )


def _wire(
    name: str, keys: tuple[bytes, ...], middle: int, tail: tuple[bytes, ...]
) -> tuple[bytes, bytes]:
    """An EVALSHA of script ``name`` packed around ``middle`` arguments given per call."""
    count = 3 + len(keys) + middle + len(tail)
    head = b"*%d\r\n" % count + pack_args((b"EVALSHA", _SHA[name], str(len(keys)), *keys))
    return head, pack_args(tail)


def _bulk(data: bytes) -> bytes:
    """``data`` as one RESP bulk string (what :func:`pack_args` makes of it, without its loop)."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


_NOT_SENT: Any = object()
"""No reply yet (the hot path's bare call was not made or did not answer)."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisLimiter(BaseLimiter):
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
        prefix: str = DEFAULT_PREFIX,
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
        self._waker = PubSubWaker(client, self._chan + self._iid)
        self._held: dict[str, dict[str, KeyRequest]] = {}  # key -> member -> request (renewal)
        self._renewer: asyncio.Task[None] | None = None
        self._calls: dict[KeyRequest, _Call] = {}
        self._client_closed = False
        self._detect_url: str | None = None  # set by from_url: cluster or not, found on first use
        self._detect_lock: asyncio.Lock | None = None
        self.cluster_retry_s = 10.0
        """How long a script call is retried while a cluster fails over (cluster mode only)."""
        self._cluster = False
        self._lean: LeanRedis | None = None  # bare connections for the script calls (one node)
        self._masters: ClusterLean | None = None  # the same per master, on a cluster
        self._lean_ready = False

    @classmethod
    def from_url(
        cls, url: str, *, lease_ttl_s: float = 10.0, prefix: str = DEFAULT_PREFIX
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

    async def _detect(self, url: str) -> None:
        """On a Redis Cluster node, switch to a cluster client, ready (slot map read) before
        any script call uses it. One call finds out; calls that start meanwhile wait for it."""
        if self._detect_lock is None:
            self._detect_lock = asyncio.Lock()
        async with self._detect_lock:
            if self._detect_url is None:
                return  # found out while this call waited
            probe = aredis.Redis.from_url(url, socket_connect_timeout=5.0)
            try:
                found = await is_cluster(probe)
            finally:
                await probe.aclose()
            if found:
                try:
                    client = cluster_client(url, **_client_options())
                except ValueError as exc:
                    raise ConcurrencyError(f"concurrency keys on {self._url}: {exc}") from None
                try:
                    await client.initialize()
                except BaseException:
                    await close_client(client)
                    raise
                single, self._client, self._cluster = self._client, client, True
                self._waker.use(_NodePubSub(client, url))
                await single.aclose()  # never used: no script call runs before this is known
            self._detect_url = None

    # ------------------------------------------------------------------ script calls

    async def _eval(
        self,
        name: str,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int | float],
        wire: bytes | None = None,
    ) -> Any:
        task = asyncio.current_task()
        pending = task.cancelling() if task is not None else 0
        try:
            result: Any = _NOT_SENT
            lean = self._lean
            bare = True
            if lean is not None and wire is not None:
                # The hot path (one node, its pipe known): the packed call with no layer around
                # it. A lost connection goes through the client below, a NOSCRIPT through
                # _script (which loads the scripts again).
                try:
                    result = await lean.pipelined(wire)
                except LOST:
                    result, bare = _NOT_SENT, False
                else:
                    if isinstance(result, BaseException):
                        if not isinstance(result, NoScriptError):
                            raise result
                        result = _NOT_SENT
            if result is _NOT_SENT:
                result = await self._eval_slowly(name, keys, args, wire, bare=bare)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailable(
                f"concurrency keys: Redis at {self._url} cannot be reached ({exc}); "
                "check that it is running and that the store URL points at it"
            ) from exc
        except Exception as exc:
            if not is_cluster_transient(exc):
                raise
            raise StoreUnavailable(
                f"concurrency keys: the Redis Cluster at {self._url} did not recover within "
                f"{self.cluster_retry_s:g}s ({exc})"
            ) from exc
        if task is not None and task.cancelling() > pending:
            # redis-py opens connections under asyncio.wait_for, which on Python 3.11 can
            # swallow a cancellation; a swallowed one would leave a cancelled waiter holding a
            # slot forever. Raise it again (the call's effect is undone like any cancellation's).
            raise asyncio.CancelledError
        return result

    async def _eval_slowly(
        self,
        name: str,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int | float],
        wire: bytes | None,
        *,
        bare: bool,
    ) -> Any:
        """A script call other than the hot path's: the first one (finds out what the URL
        names), any on a cluster, and one whose bare call failed (``bare=False``: through the
        client only)."""
        if self._detect_url is not None:
            await self._detect(self._detect_url)
        try:
            return await self._script(name, keys, args, wire, bare=bare)
        except Exception as exc:
            if not (self._cluster and _retry_on_cluster(exc)):
                raise
            return await self._retry_on_cluster(name, keys, args)

    async def _script(
        self,
        name: str,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int | float],
        wire: bytes | None = None,
        *,
        bare: bool = True,
    ) -> Any:
        """One script call; ``wire``: the same call already packed (see ``_Call``); ``bare``:
        on a bare connection if there is one (False: through the client only)."""
        if not self._lean_ready:
            self._lean_for_client()
            if self._lean is not None:
                await self._load_scripts(self._lean)
        lean = self._lean if bare else None
        if bare and self._masters is not None:
            lean = self._masters.for_key(keys[0])  # None: no master known for the slot now
        if lean is not None:
            # A packed EVALSHA on a bare connection (on a cluster, the slot's master's). A lost
            # connection or a NOSCRIPT (on a cluster also a redirection) goes to the client (its
            # retries, its EVAL; the cluster client follows the redirection and updates the
            # slot map the next calls are routed by).
            try:
                if wire is None:
                    wire = pack("EVALSHA", _SHA[name], len(keys), *keys, *args)
                if self._masters is None:
                    # One node: every script call on the one pipe, so that they reach Redis in
                    # the order they were made (a release not waited for comes before them).
                    reply = await lean.pipelined(wire)
                else:
                    (reply,) = await lean.call([wire])
            except LOST:
                if self._masters is not None:
                    await self._masters.refresh(lost=lean)
            else:
                if not isinstance(reply, BaseException):
                    return reply
                if self._masters is None:
                    if not isinstance(reply, NoScriptError):
                        raise reply
                    await self._load_scripts(lean)  # the server lost them: all of them again
                elif isinstance(reply, REDIRECTED):
                    await self._masters.refresh()
                else:
                    raise reply
        try:
            return await self._client.evalsha(_SHA[name], len(keys), *keys, *args)
        except NoScriptError:
            # First use on this server, or it restarted / failed over / flushed its scripts.
            # EVAL runs the script and caches it, on the node that serves these keys.
            return await self._client.eval(_SCRIPTS[name], len(keys), *keys, *args)

    async def _load_scripts(self, lean: LeanRedis) -> None:
        """Every script into the server's cache, in one round trip on the pipe, so that a
        release sent without waiting (:meth:`_forget_unconfirmed`) finds its script. Best
        effort: a failure here is met again, and reported, by the call that follows."""
        loads = [lean.pipelined(pack("SCRIPT", "LOAD", src)) for src in _SCRIPTS.values()]
        await asyncio.gather(*loads, return_exceptions=True)

    def _lean_for_client(self) -> None:
        """Bare connections like the client's, once it is known to be one node's plain client;
        on a cluster, one set per master, routed by the cluster client's slot map."""
        if self._detect_url is not None:
            return  # not known yet
        self._lean_ready = True
        if not self._cluster and isinstance(self._client, aredis.Redis):
            timeout = self._client.connection_pool.connection_kwargs.get("socket_timeout")
            self._lean = LeanRedis(self._client, timeout_s=timeout)
        elif self._cluster:
            timeout = self._client.nodes_manager.connection_kwargs.get("socket_timeout")
            self._masters = ClusterLean(self._client, timeout_s=timeout)

    async def _retry_on_cluster(
        self, name: str, keys: Sequence[str | bytes], args: Sequence[str | bytes | int | float]
    ) -> Any:
        """Retry a script call while the cluster fails over (every script is idempotent for a
        given member, so a call whose reply was lost may be sent again)."""
        deadline = time.monotonic() + self.cluster_retry_s
        pause = 0.05
        while True:
            await asyncio.sleep(pause)
            try:
                return await self._script(name, keys, args)
            except Exception as exc:
                if not _retry_on_cluster(exc) or time.monotonic() + pause > deadline:
                    raise
            pause = min(pause * 2, 0.5)

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


def _client_options() -> dict[str, Any]:
    # Reconnect-and-retry is safe: every script is idempotent for a given member.
    return {
        # No read timeout (redis-py's default is 5 s): it wraps every call in wait_for, which
        # costs ~30 % of throughput; a stuck call ends when the caller's budget cancels it.
        "socket_timeout": None,
        "socket_connect_timeout": 5.0,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.01), retries=3),
    }


def _retry_on_cluster(exc: BaseException) -> bool:
    """A lost node or a cluster in transition: worth another try once the cluster settles."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError) or (
        is_cluster_transient(exc)
    )


class _NodePubSub:
    """Subscriptions of a cluster limiter, each on a plain connection to one master.

    Classic pub/sub is broadcast over the cluster bus, so any node delivers every wake-up; a
    plain connection keeps the subscription apart from the cluster client's command connections.
    A new subscription (after a lost node) goes to a master the cluster client knows now.
    """

    def __init__(self, cluster: Any, url: str) -> None:
        self._cluster = cluster
        self._url = urlsplit(url)

    def pubsub(self) -> Any:
        """A pub/sub object on one master (a random one of those known now)."""
        node = random.choice(self._cluster.get_primaries() or self._cluster.get_nodes())
        userinfo = self._url.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{node.host}:{node.port}" if userinfo else f"{node.host}:{node.port}"
        url = urlunsplit(self._url._replace(netloc=netloc))
        return aredis.Redis.from_url(url, socket_connect_timeout=5.0).pubsub()
