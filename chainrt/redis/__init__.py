"""chainrt's one home for Redis: keys, URL options, cluster detection, and the fast wire layer.

The store, the limiter, the serve queue, the bus and the answer cache reach Redis through the
names below and nothing else of this package (``tests/test_redis_home.py`` fails on an import of
one of its private modules from outside it):

- :mod:`chainrt.redis.keys`: every key and pub/sub channel chainrt uses (``docs/redis-cluster.md``
  lists them, checked against it).
- URL options and cluster detection: :func:`split_options` takes chainrt's own options
  (``wait_replicas``, ``wait_timeout_ms``, ``retry_for_s``: :class:`StoreOptions`) off a URL;
  :func:`is_cluster` asks a node whether it is a Redis Cluster node, :func:`open_cluster` /
  :func:`cluster_client` build redis-py's cluster client as chainrt uses it, :func:`close_client`
  closes a client of either kind; :data:`CLUSTER_TRANSIENT` and :func:`is_cluster_transient`
  tell a cluster in transition.
- The fast connection: :class:`LeanRedis` sends commands packed once (:func:`pack`,
  :func:`pack_args`) on bare connections, or pipelined on one connection
  (:meth:`LeanRedis.pipelined`), and reads the replies with chainrt's own RESP parser;
  :class:`ClusterLean` keeps one per master of a cluster, routed by the cluster client's slot
  map. A call that failed with one of :data:`LOST` or was answered with one of
  :data:`REDIRECTED` goes again through redis-py's client. :class:`BareSubscription` hears
  pub/sub messages on a bare connection the same way.
- One Lua script call, written once for the store and the limiter: :func:`send_bare` sends it on
  a bare connection and says when it must go through the client instead (:data:`FALLBACK`: a
  lost connection, ``NOSCRIPT``, ``MOVED``/``ASK``), :func:`eval_through` sends it through
  redis-py's client (``EVALSHA``, then ``EVAL`` after ``NOSCRIPT``).

Importing the package loads no Redis client: redis-py is imported when one of the names above
other than :mod:`~chainrt.redis.keys` is first used (a process on SQLite never pays for it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import keys

if TYPE_CHECKING:
    from ._cluster import (
        CLUSTER_TRANSIENT,
        StoreOptions,
        close_client,
        cluster_client,
        is_cluster,
        is_cluster_transient,
        open_cluster,
        split_options,
    )
    from ._cluster_lean import LOST, REDIRECTED, ClusterLean
    from ._lean import NOT_SENT, LeanRedis, pack, pack_args
    from ._script_path import FALLBACK, eval_through, send_bare
    from ._subscription import BareSubscription

__all__ = [
    "CLUSTER_TRANSIENT",
    "FALLBACK",
    "LOST",
    "NOT_SENT",
    "REDIRECTED",
    "BareSubscription",
    "ClusterLean",
    "LeanRedis",
    "StoreOptions",
    "close_client",
    "cluster_client",
    "eval_through",
    "is_cluster",
    "is_cluster_transient",
    "keys",
    "open_cluster",
    "pack",
    "pack_args",
    "send_bare",
    "split_options",
]

_HOMES = {
    "CLUSTER_TRANSIENT": "_cluster",
    "StoreOptions": "_cluster",
    "close_client": "_cluster",
    "cluster_client": "_cluster",
    "is_cluster": "_cluster",
    "is_cluster_transient": "_cluster",
    "open_cluster": "_cluster",
    "split_options": "_cluster",
    "LOST": "_cluster_lean",
    "REDIRECTED": "_cluster_lean",
    "ClusterLean": "_cluster_lean",
    "LeanRedis": "_lean",
    "NOT_SENT": "_lean",
    "pack": "_lean",
    "pack_args": "_lean",
    "FALLBACK": "_script_path",
    "eval_through": "_script_path",
    "send_bare": "_script_path",
    "BareSubscription": "_subscription",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once: later lookups skip this function
    return value
