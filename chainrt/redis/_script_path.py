"""One Lua script call: on a bare connection when it can, else through redis-py's client.

The store and the limiter send their scripts the same way. First as a packed ``EVALSHA`` on a
bare connection (:class:`~._lean.LeanRedis`; on a cluster the master of the keys' slot,
:class:`~._cluster_lean.ClusterLean`): :func:`send_bare`. That call is not made again there
when its outcome is unknown or it did not run: a lost connection (:data:`~._cluster_lean.LOST`),
``NOSCRIPT`` (the server lost its scripts: a restart, a failover, ``SCRIPT FLUSH``), or on a
cluster a redirection (:data:`~._cluster_lean.REDIRECTED`: ``MOVED``, ``ASK``, ``TRYAGAIN``,
``CLUSTERDOWN``). It goes again through redis-py's client instead (:func:`eval_through`), which
follows the redirection and patches the slot map the next bare call is routed by, reconnects,
and loads the script; the caller wraps that in its own retries and error messages. Every script
sent this way is idempotent, so sending it twice is safe.

The hot paths of one node (the store's commit, the limiter's try and release on the pipe) make
the same decisions inline, with no coroutine around the pipe's future (issue 18).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis import exceptions as rx

from ._cluster_lean import LOST, REDIRECTED, ClusterLean
from ._lean import LeanRedis

__all__ = ["FALLBACK", "eval_through", "send_bare"]

FALLBACK: Any = object()
"""What :func:`send_bare` returns for a call that must go again through the client."""


async def send_bare(
    command: bytes,
    lean: LeanRedis,
    masters: ClusterLean | None = None,
    *,
    pipelined: bool = False,
    lost: tuple[type[BaseException], ...] = LOST,
    noscript: Callable[[], Awaitable[Any]] | None = None,
) -> Any:
    """The script call ``command`` (packed) on ``lean``: on its pipe if ``pipelined``, else on a
    connection of its own. On a cluster ``masters`` is the :class:`ClusterLean` ``lean`` came
    from.

    Returns the reply: a value, or a Redis error reply as a ``ResponseError`` instance (returned,
    not raised: the caller names it). Returns :data:`FALLBACK` where the call must go through the
    client: a failure in ``lost`` (on a cluster the node's connections are closed), ``NOSCRIPT``
    (on one node ``noscript`` is awaited first: the caller's chance to load its scripts again),
    or on a cluster a redirection (the connections of a node that no longer serves a slot are
    closed).
    """
    try:
        if pipelined:
            reply = await lean.pipelined(command)
        else:
            (reply,) = await lean.call([command])
    except lost:
        if masters is not None:
            await masters.refresh(lost=lean)
        return FALLBACK
    if masters is not None:
        if isinstance(reply, REDIRECTED):  # (NOSCRIPT among them)
            await masters.refresh()
            return FALLBACK
    elif isinstance(reply, rx.NoScriptError):
        if noscript is not None:
            await noscript()
        return FALLBACK
    return reply


async def eval_through(
    client: Any, sha: str, source: str, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """The script (``source``, whose SHA-1 is ``sha``) through redis-py's ``client`` (one node's
    or a cluster's): ``EVALSHA``, and after ``NOSCRIPT`` (first use on this server, or it
    restarted, failed over or flushed its scripts) ``EVAL``, which runs the script and caches it
    on the node that serves ``keys``. Errors are redis-py's, raised."""
    try:
        return await client.evalsha(sha, len(keys), *keys, *args)
    except rx.NoScriptError:
        return await client.eval(source, len(keys), *keys, *args)
