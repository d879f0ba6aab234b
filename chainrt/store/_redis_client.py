"""The Redis store's connection: its client, cluster detection, retries and error mapping.

``RedisConnection`` is the base of ``RedisStore``. The URL may name one Redis server or any node
of a Redis Cluster: the first call finds out which (see :func:`chainrt.redis.open_cluster`) and, on a cluster, switches
to the cluster client. ``_call`` retries transient errors (a lost connection, a restart, a
failover; on a cluster also ``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``) within
``retry_for_s`` and turns every redis-py error into a one-line chainrt error naming the store.
``_script`` runs one of the store's Lua scripts, reloading it after ``NOSCRIPT``, and with
``wait_replicas`` waits for the replicas in the same round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random

from .._errors import CheckpointError, CorruptRecord, StoreUnavailable
from .._settings import get_settings
from ..redis import (
    CLUSTER_TRANSIENT,
    FALLBACK,
    NOT_SENT,
    ClusterLean,
    LeanRedis,
    close_client,
    cluster_client,
    eval_through,
    is_cluster_transient,
    open_cluster,
    pack,
    send_bare,
)
from ._scripts import SCRIPTS

__all__ = ["RedisConnection", "one_line"]

_T = TypeVar("_T")

# Most connections a store's client opens to one Redis server (CHAINRT_REDIS_MAX_CONNECTIONS,
# default 64; on a cluster, to each node: _cluster_bound); more calls at once wait for one (a
# ``chainrt serve`` answering a thousand requests at once opened a thousand connections and ran
# out of file descriptors). Commits do not count: they go through the store's own pipe.

# Errors after which the same command may well succeed a moment later (a restart, a failover,
# a dataset still loading). AuthenticationError is a ConnectionError too, but never transient.
_TRANSIENT: tuple[type[BaseException], ...] = (
    rx.ConnectionError,
    rx.TimeoutError,
    rx.ReadOnlyError,
    rx.TryAgainError,
    TimeoutError,
    OSError,
    *CLUSTER_TRANSIENT,  # MOVED/ASK, TRYAGAIN, CLUSTERDOWN: a resharding or a failover
)
_AUTH: tuple[type[BaseException], ...] = (rx.AuthenticationError, rx.AuthorizationError)
# Caught to be looked at (_is_transient): a cluster client's "cannot be connected" is transient,
# and so is an AttributeError raised inside redis-py itself: its async cluster client can meet a
# connection that a failover just closed ('NoneType' object has no attribute 'writelines'), before
# the command was written. The scripts are idempotent, so the command is tried again.
_RETRIED: tuple[type[BaseException], ...] = (*_TRANSIENT, rx.RedisClusterException, AttributeError)


class RedisConnection:
    """A lazily connected Redis (or Redis Cluster) client with retries, for ``RedisStore``.

    The subclass sets these attributes in its ``__init__`` before any call.
    """

    url: str
    cluster: bool | None
    retry_for_s: float
    wait_replicas: int
    _client_url: str
    _socket_timeout_s: float
    _wait_timeout_ms: int
    _redis: Any
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    _lean: LeanRedis | None = None
    _lean_of: Any = None  # the client _lean was built from (a new loop gets a new client)
    _masters: ClusterLean | None = None  # the same on a cluster: one LeanRedis per master
    _masters_of: Any = None
    _loop_closer: AsyncIterator[None] | None = None  # closes the connections at the loop's end

    def _options(self) -> dict[str, Any]:
        """The options of every client of this store (and of its cluster question)."""
        # redis-py's own retries are off: _call retries with one deadline for the whole call.
        return {
            "retry": Retry(NoBackoff(), 0),
            "socket_timeout": self._socket_timeout_s,
            "socket_connect_timeout": min(self._socket_timeout_s, 1.0),
        }

    def _new_client(self) -> Any:
        """A client of the kind ``self.cluster`` says, not connected."""
        options = self._options()
        try:
            if self.cluster:
                return cluster_client(self._client_url, **options)
            pool = aioredis.BlockingConnectionPool.from_url(
                self._client_url,
                max_connections=get_settings().redis_max_connections,
                timeout=max(10.0, self._socket_timeout_s),  # the wait for a free connection
                **options,
            )
            client = aioredis.Redis.from_pool(pool)  # (closes the pool with the client)
            # Builds (does not connect) one connection: an unknown ?option fails here, now,
            # rather than as a TypeError at the first commit.
            client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"invalid Redis store URL {self.url!r}: {exc}") from None
        return client

    async def _connect(self) -> None:
        """Find out whether the URL names a cluster node; on a cluster, use the cluster client.

        The question goes over a connection of its own, closed at once. Calls that start
        together each ask, and each readies a cluster client (slot map read) before it returns;
        the first one ready is kept. redis-py's cluster client is not safe to initialise from
        many tasks at once, so no call uses it before it is ready.
        """
        if self.cluster is not None:
            return
        # A cluster client (or the refusal of a db other than 0), ready. Not by setting
        # self.cluster for a moment: a call that found out first may have set it meanwhile, and
        # putting it back to None made this call's client replace that one, left open (an
        # unclosed ClusterNode at garbage collection, which pytest turns into an unrelated
        # test's failure).
        try:
            client = await open_cluster(self._client_url, **self._options())
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"invalid Redis store URL {self.url!r}: {exc}") from None
        if client is None:
            if self.cluster is None:
                self.cluster = False
            return
        if self.cluster is None:
            self._redis, self.cluster = client, True  # the single-node one never connected
        else:
            await close_client(client)  # another call was ready first

    @property
    def _client(self) -> Any:
        """The client of the running event loop."""
        if self._closed:
            raise CheckpointError(f"the store {self.url} is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the loop that opened them. A store used from a new loop
            # (a script running asyncio.run per call) gets a fresh pool; the old loop's were
            # closed when that loop shut down (_close_at_loop_end), or are closed on it now.
            if self._loop is not None:
                self._retire(self._loop)
                self._redis = self._new_client()
            self._loop = loop
            self._close_at_loop_end(loop)
        return self._redis

    def _retire(self, old: asyncio.AbstractEventLoop) -> None:
        """Let go of the connections of ``old``, a loop the store no longer uses: closed there
        if it still runs (another thread); a closed loop's were closed at its shutdown."""
        held = (self._redis, self._lean, self._masters)
        self._lean = self._lean_of = self._masters = self._masters_of = None
        if old.is_running() and not old.is_closed():
            with contextlib.suppress(RuntimeError):  # it closed meanwhile
                asyncio.run_coroutine_threadsafe(_close_all(*held), old)

    def _close_at_loop_end(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close this store's connections on ``loop`` when it shuts down.

        Nothing can be awaited on a closed loop, so they must be closed before: an async
        generator registered with the loop is finalised by ``loop.shutdown_asyncgens()``, which
        asyncio.run (and every asyncio.Runner) awaits before closing the loop. A loop closed
        without it still leaves them to the collector.
        """
        closer = self._closer(loop)
        step: Any = closer.__anext__()  # registers it with the loop (its first iteration)
        with contextlib.suppress(StopIteration):
            step.send(None)  # runs it to its yield, no await needed
        self._loop_closer = closer  # the loop only holds it weakly

    async def _closer(self, loop: asyncio.AbstractEventLoop) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if self._loop is loop and asyncio.get_running_loop() is loop:
                held = (self._redis, self._lean, self._masters)
                self._lean = self._lean_of = self._masters = self._masters_of = None
                await _close_all(*held)

    @property
    def _fast(self) -> LeanRedis:
        """Bare connections of the running loop's client, for the commit hot path (one node
        only: a cluster client routes by slot, which these connections do not)."""
        client = self._client
        if self._lean is None or self._lean_of is not client:
            self._lean, self._lean_of = LeanRedis(client, timeout_s=self._socket_timeout_s), client
        return self._lean

    @property
    def _cluster_fast(self) -> ClusterLean:
        """On a cluster: bare connections to the masters of the running loop's cluster client,
        routed by its slot map (see :class:`chainrt.redis.ClusterLean`)."""
        client = self._client
        if self._masters is None or self._masters_of is not client:
            self._masters = ClusterLean(client, timeout_s=self._socket_timeout_s)
            self._masters_of = client
        return self._masters

    async def _close_fast(self) -> None:
        lean, self._lean, self._lean_of = self._lean, None, None
        if lean is not None:
            await lean.aclose()
        masters, self._masters, self._masters_of = self._masters, None, None
        if masters is not None:
            await masters.aclose()

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        script = SCRIPTS[name]
        if self.wait_replicas and name != "renew":
            return await self._call(lambda: self._script_and_wait(name, keys, args), key=keys[0])

        # After NOSCRIPT (a restart, a failover: the script did not run) EVAL loads it and runs it.
        return await self._call(
            lambda: eval_through(self._client, script.sha, script.source, keys, args), key=keys[0]
        )

    async def _script_fast(
        self, name: str, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> Any:
        """:meth:`_script`, without ``wait_replicas`` first as a packed EVALSHA: on one node on
        the pipe (:meth:`_on_pipe`), on a cluster on a bare connection to the master of the
        keys' slot (:meth:`_on_master`)."""
        script = SCRIPTS[name]
        command = pack("EVALSHA", script.sha, len(keys), *keys, *args)
        if self.cluster is False and not self.wait_replicas:
            return await self._on_pipe(name, command, keys, args)
        done, reply = await self._on_master(keys[0], command)
        return reply if done else await self._script(name, keys, args)

    async def _on_pipe(
        self, name: str, command: bytes, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> Any:
        """On one node (without ``wait_replicas``): the script call ``command`` (``name`` with
        ``keys`` and ``args``, packed) on the pipe (:meth:`chainrt.redis.LeanRedis.pipelined`: written at once, or with the
        other calls of this loop turn in one write; never behind another round trip). If the
        pipe fails, or the server lost its scripts, the call goes again through the client
        (:meth:`_script`: retried, the script loaded; every script is safe to send twice)."""
        try:
            reply = await self._fast.pipelined(command)
        except Exception:  # its outcome is unknown (the pipe broke or timed out)
            return await self._script(name, keys, args)
        if isinstance(reply, rx.NoScriptError):
            return await self._script(name, keys, args)
        if isinstance(reply, rx.ResponseError):
            raise self._refused(reply, keys[0])
        return reply

    async def _read_fast(
        self, command: bytes, key: str, slow: Callable[[], Awaitable[_T]]
    ) -> _T | Any:
        """A read (``command``, packed; its key ``key``): on one node on the pipe, like the
        commits (redis-py's command layer around a read cost about as much CPU as the rest of a
        served run's reads); elsewhere, or if the pipe fails, ``slow`` through the client
        (:meth:`_call`: connected, retried, its errors mapped). A Redis error reply is raised as
        the store's error."""
        if self.cluster is not False:
            return await self._call(slow, key=key)
        reply = await send_bare(command, self._fast, pipelined=True)
        if reply is FALLBACK:  # the pipe broke or timed out: a read is safe to send again
            return await self._call(slow, key=key)
        if isinstance(reply, rx.ResponseError):
            raise self._refused(reply, key)
        return reply

    async def _transaction_fast(
        self, commands: Sequence[bytes], key: str, slow: Callable[[], Awaitable[_T]]
    ) -> _T | list[Any]:
        """Reads (``commands``, packed; in ``key``'s slot) in one ``MULTI``/``EXEC`` on the open
        pipe (:meth:`chainrt.redis.LeanRedis.multi_unconfirmed`): their replies in order. With no
        pipe open, on a cluster, or if the pipe fails: ``slow`` through the client (:meth:`_call`)."""
        if self.cluster is not False:
            return await self._call(slow, key=key)
        try:
            got = await self._fast.multi_unconfirmed(commands)
        except Exception:  # the pipe broke or timed out: reads are safe to send again
            return await self._call(slow, key=key)
        if got is NOT_SENT:
            return await self._call(slow, key=key)
        if not isinstance(got, list):
            error = got if isinstance(got, rx.ResponseError) else rx.ResponseError(repr(got))
            raise self._refused(error, key)
        for reply in got:
            if isinstance(reply, rx.ResponseError):
                raise self._refused(reply, key)
        return got

    async def _on_master(self, key: str, command: bytes) -> tuple[bool, Any]:
        """On a cluster (without ``wait_replicas``), ``command`` (packed, its keys in ``key``'s
        slot) on a bare connection to the master of that slot: ``(True, reply)``, or a Redis
        error reply raised as the store's error. ``(False, None)`` where the caller must send it
        through the client instead: one node, no master known for the slot, a redirection
        (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``NOSCRIPT``: the client follows it
        and updates its slot map) or a lost connection (the client retries within
        ``retry_for_s``; every command sent this way is idempotent)."""
        if not self.cluster or self.wait_replicas:
            return False, None
        masters = self._cluster_fast
        lean = masters.for_key(key)
        if lean is None:
            return False, None
        reply = await send_bare(command, lean, masters)
        if reply is FALLBACK:
            return False, None
        if isinstance(reply, rx.ResponseError):
            raise self._refused(reply, key)
        return True, reply

    async def _script_and_wait(
        self, name: str, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> Any:
        """The script, then ``WAIT`` on the same connection (WAIT counts the replicas that have
        this connection's writes): one round trip. Fewer replicas in time is a transient error."""
        script, client = SCRIPTS[name], self._client
        wait_args = ("WAIT", self.wait_replicas, self._wait_timeout_ms)
        # On a cluster, WAIT has no key: send it to the master of the run's slot, so that it
        # travels in the same batch, on the same connection, as the script.
        target = {}
        if self.cluster:
            await client.initialize()  # the slot map (a no-op once read)
            target = {"target_nodes": client.get_node_from_key(keys[0])}
        for source in (None, script.source):  # EVALSHA; after NOSCRIPT, EVAL (loads it too)
            async with client.pipeline(transaction=False) as pipe:
                # execute_command: redis-py's cluster pipeline refuses its evalsha/eval methods
                # (their keys could span slots); these keys are all in the run's slot.
                if source is None:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                else:
                    pipe.execute_command("EVAL", source, len(keys), *keys, *args)
                pipe.execute_command(*wait_args, **target)
                reply, acked = await pipe.execute(raise_on_error=False)
            if not isinstance(reply, rx.NoScriptError):
                break
        for result in (reply, acked):
            if isinstance(result, BaseException):
                raise result
        if int(acked) < self.wait_replicas:
            raise _NotReplicated(
                f"the write reached {acked} of {self.wait_replicas} replicas within "
                f"{self._wait_timeout_ms} ms (wait_replicas)"
            )
        return reply

    async def _call(self, fn: Callable[[], Awaitable[_T]], *, key: str = "") -> _T:
        """Run ``fn``; retry transient errors until ``retry_for_s`` passes; map the errors."""
        down: rx.ClusterDownError | None = None  # a CLUSTERDOWN met on the way, to name it
        try:
            try:
                if self.cluster is None:
                    await self._connect()
                return await fn()
            except _AUTH:
                raise
            except _RETRIED as exc:
                if isinstance(exc, rx.ClusterDownError):
                    down = exc
                if self.retry_for_s <= 0 or not _is_transient(exc):
                    raise
            # The slow path: only entered after a failure, so the fast path pays nothing.
            retrying = AsyncRetrying(
                stop=stop_after_delay(self.retry_for_s),
                wait=wait_random(0.02, 0.1),
                retry=retry_if_exception(_is_transient),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    try:
                        if self.cluster is None:
                            await self._connect()
                        return await fn()
                    except rx.ClusterDownError as exc:
                        down = exc
                        raise
            raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover
        except _AUTH as exc:
            raise StoreUnavailable(
                f"cannot log in to the Redis store {self.url}: {one_line(exc)}; check the "
                "password (and user) in the store URL",
                retryable=False,
            ) from None
        except _TRANSIENT as exc:
            raise self._unavailable(exc, down) from None
        except AttributeError as exc:
            if not _raised_in_redis_py(exc):
                raise
            raise self._unavailable(exc, down) from None
        except rx.RedisClusterException as exc:
            if is_cluster_transient(exc):
                raise self._unavailable(exc, down) from None
            raise CheckpointError(
                f"the Redis Cluster store {self.url} refused a command: {one_line(exc)}"
            ) from None
        except rx.ResponseError as exc:
            raise self._refused(exc, key) from None

    def _refused(self, exc: rx.ResponseError, key: str) -> CheckpointError:
        """The error of a command Redis refused (WRONGTYPE: something else wrote ``key``)."""
        if str(exc).startswith("WRONGTYPE"):
            return CorruptRecord(
                f"the key {key} in {self.url} holds another type of value than a "
                "checkpoint store writes; something else wrote to it. Delete it or use "
                "another key prefix"
            )
        return CheckpointError(f"the Redis store {self.url} refused a command: {one_line(exc)}")

    def _unavailable(
        self, exc: BaseException, down: rx.ClusterDownError | None = None
    ) -> StoreUnavailable:
        """The one line of a store that stayed unreachable; ``down``: a CLUSTERDOWN met during
        the retries (the last error may be another, e.g. the lost master's refused connection)."""
        what = "Redis Cluster" if self.cluster else "Redis"
        if down is not None or isinstance(exc, rx.ClusterDownError):
            # The nodes answer, but refuse every command: some hash slots have no master (a
            # master and its replicas lost, or a failover not yet done). Say it in Redis's word.
            last = "" if exc is down or down is None else f"; last error: {one_line(exc)}"
            return StoreUnavailable(
                f"the Redis Cluster store {self.url} is down (CLUSTERDOWN: "
                f"{one_line(down or exc)}: some hash slots have no master{last}); gave up after "
                f"{self.retry_for_s:g}s of retries. Check that every master, or a replica of "
                "it, is up, then try again"
            )
        return StoreUnavailable(
            f"the {what} store {self.url} is unreachable ({one_line(exc)}); gave up after "
            f"{self.retry_for_s:g}s of retries. Check that {what} is up, then try again"
        )


async def _close_all(client: Any, lean: LeanRedis | None, masters: ClusterLean | None) -> None:
    """Close a client and the bare connections taken from it (on their loop)."""
    for done in (lean, masters):
        if done is not None:
            with contextlib.suppress(Exception):
                await done.aclose()
    with contextlib.suppress(Exception):
        await close_client(client)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, _AUTH):
        return False
    if isinstance(exc, AttributeError):
        return _raised_in_redis_py(exc)
    return isinstance(exc, _TRANSIENT) or is_cluster_transient(exc)


def _raised_in_redis_py(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc`` is redis-py's own code (a client-side race),
    not ours."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("redis.")


class _NotReplicated(rx.TimeoutError):
    """A write that fewer replicas than ``wait_replicas`` acknowledged in time (retried: the
    scripts are idempotent, and the next WAIT counts the same write again)."""


def one_line(exc: BaseException) -> str:
    """``exc`` as one short line, for an error message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
