"""Opening the SQLite store read-only: for ``runs`` and ``inspect``, and for ``?mode=ro`` URLs.

A read command must work on a file it may not write (a copy handed over for a post-mortem, a
store on a read-only mount, another user's file). It opens the file with SQLite's ``mode=ro``, so
nothing is created, converted to WAL, migrated or purged; a file that does not exist yet, or holds
no chainrt tables, reads as an empty store (``chainrt runs`` in a fresh folder says "no runs"
without creating ``.chainrt/``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from .._errors import CheckpointError, StoreUnavailable

__all__ = ["connect_read_only", "read_only_refusal"]


def connect_read_only(
    path: Path, schema: str, *, url: str, layout_version: int, busy_timeout_s: float
) -> sqlite3.Connection:
    """A connection that cannot write ``path``; an empty in-memory store if it has no tables."""
    if path.exists():
        try:
            conn, version, has_runs = _open(path, busy_timeout_s)
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                f"cannot read the SQLite checkpoint store {url}: {exc}", retryable=False
            ) from None
        if version > layout_version:
            conn.close()
            raise CheckpointError(
                f"the SQLite store {url} was created by a newer chainrt (table layout "
                f"{version}, this one knows {layout_version}); upgrade chainrt"
            )
        if has_runs:
            return conn
        conn.close()
    empty = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    empty.executescript(f"BEGIN;{schema}COMMIT;")
    return empty


def _open(path: Path, busy_timeout_s: float) -> tuple[sqlite3.Connection, int, bool]:
    """Open ``path`` read-only: plain ``mode=ro`` first, then as immutable.

    A WAL file needs its ``-shm`` index, which SQLite creates beside it; in a folder nobody may
    write (a read-only mount) that fails, and the file can only be read as immutable, which is
    what a read-only mount makes it.
    """
    last: sqlite3.Error | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(
                f"file:{quote(str(path.resolve()))}?{options}",
                uri=True,
                timeout=busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            last = exc
            continue
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            has_runs = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'"
            ).fetchone()
        except sqlite3.Error as exc:
            conn.close()
            last = exc
            continue
        return conn, int(version), has_runs is not None
    assert last is not None
    raise last


def read_only_refusal(url: str) -> CheckpointError:
    """The error of a write to a store opened read-only."""
    return CheckpointError(
        f"the store {url} is opened read-only: runs can be listed and inspected, not started, "
        "resumed or written (drop ?mode=ro, or check that the file is writable)"
    )
