"""Semantic concurrency keys (docs/concurrency.md): per-user, per-session, per-model limits.

``open_limiter(store_url)`` picks the implementation that matches the checkpoint store: with a
Redis store the keys live in the same Redis and hold across every process and host
(:class:`RedisLimiter`); with the embedded store they live in the same SQLite file and hold across
every process of the host that shares it (:class:`SQLiteLimiter`). Only an in-memory store
(``sqlite:///:memory:``) falls back to :class:`LocalLimiter`, one instance shared by the whole
process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._errors import ChainRTError, ConcurrencyError
from ._local import LocalLimiter
from ._protocol import Holding, KeyRequest, KeyState, Limiter
from ._sqlite import SQLiteLimiter

if TYPE_CHECKING:
    from ._redis import RedisLimiter

__all__ = [
    "Holding",
    "KeyRequest",
    "KeyState",
    "Limiter",
    "LocalLimiter",
    "RedisLimiter",
    "SQLiteLimiter",
    "open_limiter",
]

_local: LocalLimiter | None = None
_local_lock = threading.Lock()


def _shared_local() -> LocalLimiter:
    global _local
    with _local_lock:
        if _local is None:
            _local = LocalLimiter()
        return _local


def open_limiter(store_url: str, *, lease_ttl_s: float = 10.0) -> Limiter:
    """The limiter for the store at ``store_url``.

    ``redis://`` and ``rediss://`` give a new :class:`RedisLimiter` on that server and
    ``sqlite:///path.db`` a new :class:`SQLiteLimiter` on that file (close either when done);
    ``sqlite:///:memory:`` gives the process-wide :class:`LocalLimiter`, so that every chain run in
    this process shares the same limits. ``lease_ttl_s`` is how soon the slot of a killed holder
    frees itself (local slots die with their process).
    """
    scheme = store_url.split("://", 1)[0].lower() if "://" in store_url else ""
    if scheme in ("redis", "rediss"):
        try:
            from ._redis import RedisLimiter
        except ImportError as exc:  # redis is an optional extra
            raise ConcurrencyError(
                f"store {scheme}://... needs the redis package: pip install -e '.[redis]' in the chainrt repository"
            ) from exc
        return RedisLimiter.from_url(store_url, lease_ttl_s=lease_ttl_s)
    if scheme == "sqlite":
        from ..store._url import sqlite_path, sqlite_read_only

        try:
            path = sqlite_path(store_url)
            read_only = sqlite_read_only(store_url)
        except ChainRTError as exc:
            raise ConcurrencyError(str(exc)) from None
        if path is not None and not read_only:  # a read-only store runs nothing to limit
            return SQLiteLimiter(path, lease_ttl_s=lease_ttl_s)
    return _shared_local()


def __getattr__(name: str) -> Any:
    # RedisLimiter is imported on first use so that the embedded mode runs without redis installed.
    if name == "RedisLimiter":
        from ._redis import RedisLimiter

        return RedisLimiter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
