"""Checkpoint stores: where runs and their steps are recorded, so a run can be resumed anywhere.

``open_store(url)`` picks the backend from the URL::

    sqlite:///relative/path.db     embedded default (``.chainrt/chainrt.db``), one file, WAL
    sqlite:////absolute/path.db
    redis://[:password@]host:port/db    shared by every runner process and host
    rediss://[:password@]host:port/db   the same over TLS

Both backends implement :class:`CheckpointStore` and pass the same conformance suite
(``chainrt.testing.store_conformance``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import CheckpointError
from .._records import (
    RECORD_SCHEMA,
    AttemptRecord,
    OwnerLease,
    RunProgress,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
)
from .._settings import get_settings
from ._protocol import DEFAULT_MAX_RECORD_BYTES, CheckpointStore
from ._sqlite import SQLiteStore
from ._url import ACCEPTED_FORMS, redact_url, sqlite_path, sqlite_read_only, store_scheme

if TYPE_CHECKING:
    from ._redis import RedisStore

__all__ = [
    "ACCEPTED_FORMS",
    "DEFAULT_MAX_RECORD_BYTES",
    "RECORD_SCHEMA",
    "AttemptRecord",
    "CheckpointStore",
    "OwnerLease",
    "RedisStore",
    "RunProgress",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "StepRecord",
    "StepStatus",
    "open_store",
    "redact_url",
]


def open_store(
    url: str | None = None,
    *,
    record_ttl_s: float | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    retry_for_s: float = 2.0,
    read_only: bool = False,
) -> CheckpointStore:
    """Open the checkpoint store ``url`` names (default: ``CHAINRT_STORE``).

    A SQLite file is created (with its directories) at once; a Redis store connects on first
    use, and raises StoreUnavailable naming the URL (password hidden) if Redis cannot be
    reached within ``retry_for_s``. An unknown scheme raises CheckpointError listing the
    accepted forms. ``record_ttl_s`` defaults to ``CHAINRT_RECORD_TTL_S``. ``read_only`` (or
    ``?mode=ro`` on a SQLite URL) opens a SQLite file without writing to it: reads work, writes
    raise CheckpointError; a Redis store ignores it.
    """
    if url is None:
        url = get_settings().store
    if store_scheme(url) == "sqlite":
        return SQLiteStore(
            sqlite_path(url),
            record_ttl_s=record_ttl_s,
            max_record_bytes=max_record_bytes,
            read_only=read_only or sqlite_read_only(url),
        )
    return _redis_store_class()(
        url,
        record_ttl_s=record_ttl_s,
        max_record_bytes=max_record_bytes,
        retry_for_s=retry_for_s,
    )


def _redis_store_class() -> type[RedisStore]:
    # redis-py is an optional dependency (``chainrt[redis]``): import it only when needed.
    try:
        from ._redis import RedisStore
    except ImportError as exc:
        raise CheckpointError(
            f"a Redis store needs the redis package ({exc}); install chainrt[redis]"
        ) from None
    return RedisStore


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        return _redis_store_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
