"""One Redis node or a Redis Cluster: told apart on first contact.

The same ``redis://host:port`` URL may name a single Redis server or any node of a Redis Cluster.
The store, the limiter, the serve queue and the tool fence ask the server ``INFO cluster`` once
(:func:`open_cluster`); on a cluster (``cluster_enabled:1``) they switch to redis-py's cluster
client, which reads the slot map from that node, sends each command to the master of its key's
slot, and follows resharding (``MOVED``/``ASK``) and failovers. On one node nothing changes: the
check costs one round trip once per client, never per command.

chainrt's own options on the URL (taken off before redis-py sees it)::

    wait_replicas=N      after each write, wait until N replicas have it (Redis ``WAIT``)
    wait_timeout_ms=MS   how long one ``WAIT`` may take (default 1000); fewer replicas by then
                         is retried like a lost connection, then StoreUnavailable
    retry_for_s=S        how long one store call retries a lost connection, a failover or a
                         resharding before StoreUnavailable (default: the store's, 2 s); on a
                         cluster, set it above ``cluster-node-timeout`` plus a few seconds
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster

from .._settings import get_settings
from ._cluster_bound import BoundedCluster

logger = logging.getLogger("chainrt.store")

__all__ = [
    "CLUSTER_TRANSIENT",
    "StoreOptions",
    "close_client",
    "cluster_client",
    "is_cluster",
    "is_cluster_transient",
    "open_cluster",
    "split_options",
]

CLUSTER_TRANSIENT: tuple[type[BaseException], ...] = (
    rx.ClusterError,  # CLUSTERDOWN, MASTERDOWN, and redirections that ran out ("TTL exhausted")
    rx.TryAgainError,  # a multi-key command during a slot migration
    rx.AskError,  # MOVED / ASK that redis-py could not follow within its own redirection limit
    rx.SlotNotCoveredError,  # a slot without a master (mid-failover)
)
"""Cluster errors after which the same command may succeed a moment later."""

_DEFAULT_WAIT_TIMEOUT_MS = 1000


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """chainrt's options from a Redis URL's query string."""

    wait_replicas: int = 0
    wait_timeout_ms: int = _DEFAULT_WAIT_TIMEOUT_MS
    retry_for_s: float | None = None


def split_options(url: str) -> tuple[str, StoreOptions]:
    """``url`` without chainrt's own query options, and those options.

    ValueError (with a one-line reason) for a value that is not a whole number in range.
    """
    parts = urlsplit(url)
    if not parts.query:
        return url, StoreOptions()
    kept: list[tuple[str, str]] = []
    found: dict[str, Any] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        name = key.lower()
        if name == "retry_for_s":
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds <= 3600:  # NaN fails this too
                raise ValueError(
                    f"retry_for_s must be a number of seconds from 0 to 3600, got {value!r}"
                )
            found[name] = seconds
            continue
        if name not in ("wait_replicas", "wait_timeout_ms"):
            kept.append((key, value))
            continue
        low, high = (0, 16) if name == "wait_replicas" else (1, 60_000)
        if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
            raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        found[name] = int(value)
    rest = urlunsplit(parts._replace(query=urlencode(kept)))
    return rest, StoreOptions(**found)


def is_cluster_transient(exc: BaseException) -> bool:
    """True for an error of a cluster in transition (see :data:`CLUSTER_TRANSIENT`), including
    redis-py's "cannot be connected" when no node it knows answers right now."""
    if isinstance(exc, CLUSTER_TRANSIENT):
        return True
    return isinstance(exc, rx.RedisClusterException) and "cannot be connected" in str(exc)


async def is_cluster(client: aioredis.Redis) -> bool:
    """Whether the server ``client`` talks to is a Redis Cluster node (``INFO cluster``)."""
    try:
        info = await client.info("cluster")
    except rx.ResponseError as exc:
        # "SELECT is not allowed in cluster mode": a cluster node, and a URL naming a database
        # (cluster_client then says a cluster has only database 0). Anything else (a proxy, an
        # ACL without INFO): treat it as one node.
        return "cluster mode" in str(exc)
    try:
        return int(info.get("cluster_enabled", 0)) == 1
    except (TypeError, ValueError):
        return False


async def open_cluster(
    url: str,
    *,
    probe: aioredis.Redis | None = None,
    probe_options: dict[str, Any] | None = None,
    **options: Any,
) -> RedisCluster | None:
    """On a Redis Cluster, redis-py's cluster client for ``url`` (:func:`cluster_client` with
    ``options``), ready (the slot map read; closed again if that fails); None on one node.

    The question (:func:`is_cluster`) goes on ``probe``, a plain client of the caller's for
    ``url`` (left open), or else on a client of its own made with ``probe_options`` (default:
    ``options``), closed at once. ValueError (from :func:`cluster_client`) for a URL naming a
    database other than 0.
    """
    if probe is not None:
        found = await is_cluster(probe)
    else:
        own = aioredis.Redis.from_url(url, **(options if probe_options is None else probe_options))
        try:
            found = await is_cluster(own)
        finally:
            await own.aclose()
    if not found:
        return None
    client = cluster_client(url, **options)
    try:
        await client.initialize()
    except BaseException:
        await close_client(client)
        raise
    return client


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """redis-py's asyncio cluster client for ``url`` (any node of the cluster), with ``ASKING``
    sent on the connection of the command it allows (:class:`._cluster_asking.AskingSafeCluster`),
    at most ``max_connections`` (default ``CHAINRT_REDIS_MAX_CONNECTIONS``) connections per
    node with callers waiting for one (:class:`._cluster_bound.BoundedCluster`), and no rebuild
    of the whole slot map on ``MOVED`` (which drops the connections in flight).

    ValueError if the URL names a database other than 0: a cluster has only database 0, and a
    run must not silently land elsewhere than its URL says.
    """
    db = urlsplit(url).path.strip("/")
    if db not in ("", "0"):
        raise ValueError(
            f"a Redis Cluster has only database 0, but the URL names database {db}; "
            "drop the /db part of the URL"
        )
    # A MOVED patches the slot it names, never more: redis-py's default (reinitialize_steps=5)
    # rebuilds the map on every fifth MOVED and drops all of the client's connections then,
    # those of commands in flight included; a command whose reply is lost that way is sent
    # again, and one that is not idempotent (the serve queue's XADD) then runs twice.
    options.setdefault("reinitialize_steps", 0)
    # ASKING on the redirected command's own connection (see _cluster_asking), and at most
    # CHAINRT_REDIS_MAX_CONNECTIONS connections per node, callers past it waiting for a turn
    # (see _cluster_bound).
    options.setdefault("max_connections", get_settings().redis_max_connections)
    return BoundedCluster.from_url(url, **options)


async def close_client(client: Any) -> None:
    """Close a client of either kind, every connection included.

    redis-py's cluster client keeps the connection it read the slot map with on its "startup
    node" objects, which its ``aclose`` leaves open: they are closed here too. Never raises for a
    connection that would not close in time (redis-py gives up on one after
    ``socket_connect_timeout``): the others are closed all the same, and a caller closing a spare
    client (a lost connect race) must not fail for it.
    """
    try:
        await client.aclose()
    except Exception as exc:  # closing is best effort; the rest is still closed below
        logger.debug("closing a Redis client: %s: %s", type(exc).__name__, exc)
    if isinstance(client, RedisCluster):
        with contextlib.suppress(Exception):
            await client.nodes_manager.aclose("startup_nodes")
