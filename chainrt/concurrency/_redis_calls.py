"""The script calls of the Redis limiter (a base of :class:`._redis.RedisLimiter`).

Each call of :data:`._lua.TRY`, ``FORGET``, ``RENEW`` or ``SNAPSHOT`` goes, when it can, as a
packed ``EVALSHA`` on a bare connection (:class:`chainrt.redis.LeanRedis`; on a cluster the
master of the key's slot, :class:`chainrt.redis.ClusterLean`), and otherwise through redis-py's client: after a lost
connection, a ``NOSCRIPT`` (the server lost its scripts) or, on a cluster, a redirection
(``MOVED``/``ASK``). The first call finds out whether the URL names a cluster node; on a cluster a
failing call is retried while the cluster fails over (every script is idempotent for a given
member).
"""

from __future__ import annotations

import asyncio
import hashlib
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
from ..redis import (
    FALLBACK,
    LOST,
    ClusterLean,
    LeanRedis,
    eval_through,
    is_cluster_transient,
    open_cluster,
    pack,
    pack_args,
    send_bare,
)
from ..redis.keys import key_names
from . import _lua
from ._protocol import KeyRequest
from ._redis_wakeups import PubSubWaker

__all__ = ["ScriptCalls"]

_SCRIPTS = {name: getattr(_lua, name) for name in ("TRY", "FORGET", "RENEW", "SNAPSHOT")}
_SHA = {
    name: hashlib.sha1(src.encode(), usedforsecurity=False).hexdigest()
    for name, src in _SCRIPTS.items()
}


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


class ScriptCalls:
    """The script-call half of :class:`~chainrt.concurrency._redis.RedisLimiter` (a base of it).

    The limiter sets these attributes in its ``__init__`` before any call.
    """

    _client: Any
    _url: str
    _waker: PubSubWaker
    _detect_url: str | None
    _detect_lock: asyncio.Lock | None
    cluster_retry_s: float
    _cluster: bool
    _lean: LeanRedis | None
    _masters: ClusterLean | None
    _lean_ready: bool

    async def _detect(self, url: str) -> None:
        """On a Redis Cluster node, switch to a cluster client, ready (slot map read) before
        any script call uses it. One call finds out; calls that start meanwhile wait for it."""
        if self._detect_lock is None:
            self._detect_lock = asyncio.Lock()
        async with self._detect_lock:
            if self._detect_url is None:
                return  # found out while this call waited
            try:
                client = await open_cluster(
                    url, probe_options={"socket_connect_timeout": 5.0}, **_client_options()
                )
            except ValueError as exc:
                raise ConcurrencyError(f"concurrency keys on {self._url}: {exc}") from None
            if client is not None:
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
            # slot map the next calls are routed by). One node: every script call on the one
            # pipe, so that they reach Redis in the order they were made (a release not waited
            # for comes before them); after a NOSCRIPT the server lost them: all of them again.
            if wire is None:
                wire = pack("EVALSHA", _SHA[name], len(keys), *keys, *args)
            one_node = self._masters is None
            reply = await send_bare(
                wire,
                lean,
                self._masters,
                pipelined=one_node,
                noscript=(lambda: self._load_scripts(lean)) if one_node else None,
            )
            if reply is not FALLBACK:
                if isinstance(reply, BaseException):
                    raise reply
                return reply
        return await eval_through(self._client, _SHA[name], _SCRIPTS[name], keys, args)

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
