"""A Redis Cluster client whose connections per node are bounded, and whose callers wait for one.

redis-py's asyncio cluster client keeps a pool per node of at most ``max_connections``
connections (redis-py 6 and 7: 2**31, unbounded; 8.1 and 8.2: 100), and a command that finds them all busy
fails at once with ``MaxConnectionsError`` instead of waiting (``ClusterNode.acquire_connection``).
One node's client (``_redis_client``) waits for a free connection of its
``BlockingConnectionPool``; a cluster client must do the same, or a burst of requests either
opens a connection per request (file descriptors run out) or fails.

:class:`BoundedCluster` lets at most ``max_connections`` commands and pipelines run through the
client at once (an ``asyncio.Semaphore``), and sets redis-py's per-node limit to the same number:
a command holds at most one connection of a node and a pipeline one per node it sends to, so no
node ever needs more, and a caller past the bound waits for a turn instead of failing. A command
that redis-py sends from inside a pipeline (a redirected one, sent again alone) runs in the
pipeline's turn (a context variable says so): it never waits for a turn its own pipeline holds.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from redis.asyncio.cluster import ClusterPipeline

from ._cluster_asking import AskingSafeCluster

__all__ = ["BoundedCluster"]

_IN_TURN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "chainrt_cluster_turn", default=False
)


class BoundedCluster(AskingSafeCluster):
    """``AskingSafeCluster`` with at most ``max_connections`` commands and pipelines in flight;
    see the module."""

    def __init__(self, *args: Any, max_connections: int, **kw: Any) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        kw["max_connections"] = max_connections
        super().__init__(*args, **kw)
        self.turns = asyncio.Semaphore(max_connections)
        """Commands and pipelines that may run at once."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if _IN_TURN.get():
            return await super().execute_command(*args, **kwargs)
        async with self.turns:
            token = _IN_TURN.set(True)
            try:
                return await super().execute_command(*args, **kwargs)
            finally:
                _IN_TURN.reset(token)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # (redis-py refuses it)
        # (redis-py's annotations leave _event_dispatcher abstract; ClusterPipeline sets it.)
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]


class _BoundedPipeline(ClusterPipeline):
    """A cluster pipeline that runs in a turn of its client (:class:`BoundedCluster`)."""

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = self.cluster_client
        turns: asyncio.Semaphore | None = getattr(client, "turns", None)
        if turns is None or _IN_TURN.get():
            return await super().execute(raise_on_error, allow_redirections)
        async with turns:
            token = _IN_TURN.set(True)
            try:
                return await super().execute(raise_on_error, allow_redirections)
            finally:
                _IN_TURN.reset(token)
