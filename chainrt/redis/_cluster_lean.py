"""The hot path on a Redis Cluster: bare connections to each master, chosen by the key's slot.

On one node the commit and limiter scripts go out packed on bare connections (:mod:`._lean`). On a
cluster, redis-py's cluster client adds slot routing, its node pools, its redirection loop and its
per-command bookkeeping around every call: about twice the client CPU of a step on one node.
:class:`ClusterLean` keeps one :class:`~._lean.LeanRedis` per master and picks it by the slot of
the call's first key, read from the cluster client's own slot map (every key of one script shares
a hash tag, so one slot). It never follows a redirection itself: a call answered ``MOVED``,
``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN`` (any :data:`REDIRECTED` reply), or one that loses its
connection, is sent again by the caller through the cluster client, which follows the
redirection, retries within the caller's window and patches (or re-reads) its slot map; the next
call here reads that map. Every script sent this way is idempotent, so sending it again is safe.
"""

from __future__ import annotations

from typing import Any

from redis import exceptions as rx
from redis.crc import key_slot

from ._lean import LeanRedis

__all__ = ["LOST", "REDIRECTED", "ClusterLean"]

REDIRECTED: tuple[type[BaseException], ...] = (
    rx.AskError,  # ASK, and MOVED (MovedError is an AskError): the slot is elsewhere
    rx.TryAgainError,  # a multi-key command while its slot migrates
    rx.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    rx.ReadOnlyError,  # a master turned replica under our feet
    rx.NoScriptError,  # a node that never saw the script (the client path loads it)
)
"""Error replies after which the call goes again through the cluster client."""

LOST: tuple[type[BaseException], ...] = (rx.ConnectionError, rx.TimeoutError, TimeoutError, OSError)
"""Failures of a bare call whose outcome is unknown (sent again through the cluster client)."""


class ClusterLean:
    """Bare connections to the masters of ``client`` (a ``redis.asyncio.cluster.RedisCluster``).

    ``timeout_s`` bounds one call, as :class:`~._lean.LeanRedis`'s. Bound to the event loop it
    is first used on, like the client.
    """

    def __init__(self, client: Any, *, timeout_s: float | None) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._nodes: dict[str, LeanRedis] = {}

    def for_key(self, key: str | bytes) -> LeanRedis | None:
        """The bare connections of the master that serves ``key``'s slot now, as the cluster
        client's map says; None while the map has no master for it (not read yet, or being
        re-read): the caller then goes through the cluster client."""
        return self.at_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def at_slot(self, slot: int) -> LeanRedis | None:
        """:meth:`for_key` for a slot already computed (``redis.crc.key_slot``): a commit
        computes its run's slot once and routes by it."""
        try:
            node = self._client.nodes_manager.slots_cache[slot][0]
        except (KeyError, IndexError, TypeError):
            return None
        lean = self._nodes.get(node.name)
        if lean is None:
            lean = self._nodes[node.name] = LeanRedis.of_node(node, timeout_s=self._timeout_s)
        return lean

    def master_of(self, key: str | bytes) -> str:
        """The name (``host:port``) of the master that serves ``key``'s slot now, as the cluster
        client's map says; "" while the map has none for it."""
        return self.master_at(key_slot(key.encode() if isinstance(key, str) else key))

    def master_at(self, slot: int) -> str:
        """:meth:`master_of` for a slot already computed."""
        try:
            return str(self._client.nodes_manager.slots_cache[slot][0].name)
        except (KeyError, IndexError, TypeError):
            return ""

    async def refresh(self, lost: LeanRedis | None = None) -> None:
        """After a call went through the cluster client: close ``lost`` (its node failed a
        call: its idle connections may be dead too) and the connections of every node that no
        longer serves a slot in the client's map."""
        serving = {nodes[0].name for nodes in self._client.nodes_manager.slots_cache.values()}
        for name, lean in list(self._nodes.items()):
            if lean is lost or name not in serving:
                del self._nodes[name]
                await lean.aclose()

    async def aclose(self) -> None:
        """Close every connection (a later :meth:`for_key` opens new ones)."""
        nodes, self._nodes = self._nodes, {}
        for lean in nodes.values():
            await lean.aclose()
