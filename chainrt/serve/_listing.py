"""``GET /v1/runs`` pages: newest first, filtered, continued by an opaque keyset cursor.

The cursor names the last run a page covered (``created_at, run_id``) and the next page starts
after it on the store's index: a page costs the same however many runs the store holds (no
offset). It is URL-safe base64 of a JSON pair, read back with ``json.loads`` and type checks
only. The chain filter is applied here, so a page reads at most :data:`SCAN_MAX` runs: one
with fewer matches than asked for still carries a cursor when there are more runs to read.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from .._errors import ChainRTError
from ..store._records import RunRecord

__all__ = ["SCAN_MAX", "BadCursor", "decode_cursor", "encode_cursor", "list_page"]

SCAN_MAX = 5000
"""Most runs one request reads when it filters by chain."""


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
    if chain is None:
        runs: list[RunRecord] = await store.list_runs(status, limit + 1, before=before)
        more = len(runs) > limit
        runs = runs[:limit]
        return runs, encode_cursor(runs[-1]) if more and runs else None
    found: list[RunRecord] = []
    scanned = 0
    batch = max(limit, 200)
    while scanned < SCAN_MAX:
        page: list[RunRecord] = await store.list_runs(status, batch, before=before)
        for run in page:
            scanned += 1
            if run.chain == chain:
                found.append(run)
                if len(found) == limit:
                    return found, encode_cursor(run)
        if len(page) < batch:
            return found, None  # the store has no more
        before = (page[-1].created_at, page[-1].run_id)
    last = page[-1]
    return found, encode_cursor(last)
