"""``GET /v1/runs`` pages: newest first, filtered, continued by an opaque keyset cursor.

The cursor names the last run a page covered (``created_at, run_id``) and the next page starts
after it on the store's index: a page costs the same however many runs the store holds (no
offset). It is URL-safe base64 of a JSON pair, read back with ``json.loads`` and type checks
only. The status and chain filters are the store's: each walks an index of its own (a sorted
set per status and per chain on Redis, an SQL index on SQLite), so a filtered page reads the
runs it returns, not the runs it leaves out.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from .._errors import ChainRTError
from .._records import RunRecord

__all__ = ["BadCursor", "decode_cursor", "encode_cursor", "list_page"]


class BadCursor(ChainRTError):
    """A ``cursor`` that this API did not hand out."""


def encode_cursor(run: RunRecord) -> str:
    """The cursor of the page after ``run``."""
    raw = json.dumps([run.created_at, run.run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """``created_at, run_id`` from a cursor; :class:`BadCursor` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        value = None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int | float)
        and not isinstance(value[0], bool)
        and math.isfinite(value[0])
        and isinstance(value[1], str)
    ):
        return float(value[0]), value[1]
    raise BadCursor("not a cursor of this API (use the X-Next-Cursor header's value)")


async def list_page(
    store: Any, *, status: str | None, chain: str | None, limit: int, cursor: str | None
) -> tuple[list[RunRecord], str | None]:
    """One page of runs and the cursor of the next one (None when there is no more)."""
    before = None if cursor is None else decode_cursor(cursor)
    runs: list[RunRecord] = await store.list_runs(status, limit + 1, before=before, chain=chain)
    more = len(runs) > limit
    runs = runs[:limit]
    return runs, encode_cursor(runs[-1]) if more and runs else None
