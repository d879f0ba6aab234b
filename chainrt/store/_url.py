"""Store URLs: which backend a URL names, where a SQLite file lives, and a printable form.

Accepted forms::

    sqlite:///relative/path.db       relative to the current directory
    sqlite:////absolute/path.db      absolute
    sqlite:///:memory:               a private in-memory database (tests)
    sqlite:///path.db?mode=ro        read-only: list and inspect runs, write nothing
    redis://[[user]:password@]host:port/db[?option=value...]
    rediss://...                     the same over TLS
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from .._errors import CheckpointError
from .._redact import redact_text, redact_url

__all__ = [
    "ACCEPTED_FORMS",
    "check_redis_url",
    "redact_text",
    "redact_url",
    "sqlite_path",
    "sqlite_read_only",
    "store_scheme",
]

ACCEPTED_FORMS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "redis://[:password@]host:port/db, rediss://[:password@]host:port/db"
)
"""The URL forms ``open_store`` accepts, for error messages."""


def check_redis_url(url: str) -> None:
    """CheckpointError unless ``url`` is ``redis[s]://[...@]host[:port][/db]`` with a numeric db.

    redis-py silently ignores a database part it cannot parse; a typo must not send the
    checkpoints of a run to database 0.
    """
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as exc:
        # Never the parser's own words: "Port could not be cast to integer value as 's3c'"
        # quotes the start of a password that held a '/' (redis://:s3c/ret@host).
        raise CheckpointError(
            f"invalid Redis store URL {redact_url(url)!r}: {_why_unparsable(str(exc))}"
        ) from None
    db = parts.path.lstrip("/")
    if not parts.hostname or (db and not db.isdigit()):
        raise CheckpointError(
            f"invalid Redis store URL {redact_url(url)!r}: write "
            "redis://[:password@]host:port/db with a numeric db"
        )
    options = {key.lower() for key, _ in parse_qsl(parts.query)}
    if options & {"decode_responses", "db"}:
        # The store reads raw bytes and takes the db from the path only.
        raise CheckpointError(
            f"invalid Redis store URL {redact_url(url)!r}: the options decode_responses and db "
            "are not supported; give the db as the path (redis://host:port/2)"
        )


def _why_unparsable(error: str) -> str:
    """Why urlsplit refused a URL, in words that quote nothing of it."""
    if "IPv6" in error:
        what = "a '[' or ']' that does not enclose an IPv6 address"
    elif "Port" in error:
        what = "no port number from 0 to 65535 after the host"
    else:
        what = "a host part that does not parse"
    return (
        f"it has {what}; write redis://[:password@]host:port/db, and percent-encode a "
        "password holding '/', '?', '#', '@', '[' or ']' (e.g. '/' as %2F)"
    )


def store_scheme(url: str) -> str:
    """``"sqlite"`` or ``"redis"`` (``rediss`` included); CheckpointError for anything else."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("redis", "rediss"):
        return "redis"
    raise CheckpointError(
        f"unsupported checkpoint store URL {redact_url(url)!r}: use one of {ACCEPTED_FORMS}"
    )


def sqlite_path(url: str) -> Path | None:
    """The database file a ``sqlite:`` URL names (None for ``sqlite:///:memory:``).

    ``sqlite:///a/b.db`` is relative to the current directory, ``sqlite:////a/b.db`` absolute
    (the SQLAlchemy convention). A host part (``sqlite://host/x.db``) is an error.
    """
    prefix = "sqlite://"
    if not url.lower().startswith(prefix):
        raise CheckpointError(f"not a SQLite store URL: {redact_url(url)!r}")
    rest = url[len(prefix) :]
    if not rest.startswith("/") or len(rest) < 2:
        raise CheckpointError(
            f"SQLite store URL {url!r} names no file: write sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    path = rest[1:].partition("?")[0]
    if path == ":memory:":
        return None
    if not path or path.endswith("/"):
        raise CheckpointError(f"SQLite store URL {url!r} names a directory, not a database file")
    return Path(path)


_SQLITE_MODES = {"ro": True, "rw": False, "rwc": False}


def sqlite_read_only(url: str) -> bool:
    """True for ``sqlite:///path.db?mode=ro``; CheckpointError for any other option or mode.

    An option the store would not honour is refused rather than silently ignored.
    """
    query = url.partition("?")[2]
    read_only = False
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key != "mode" or value not in _SQLITE_MODES:
            got = f"{key}={value}" if len(key) + len(value) < 80 else f"{key[:40]}=..."
            raise CheckpointError(
                f"SQLite store URL {url[:120]!r}: the only option is mode=ro (read-only) or "
                f"mode=rw, got {got!r}"
            )
        read_only = _SQLITE_MODES[value]
    return read_only
