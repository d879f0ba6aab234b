"""The records of runs this server has just submitted, for its own taker (issue 39).

A run submitted to ``chainrt serve`` is written to the store, queued, and — on a single server,
or whenever this server takes its own entry — read back from the store a moment later by the
entry handler, which then claims it. The read costs a round trip and the record's decoding on the
path from ``POST`` to the first step. The record the submit wrote is kept here for a short while
and handed to the taker instead. That is safe because a queued run changes only through a claim
(a start or a cancel, each with the next fencing token): a record that went stale here fails the
claim on its token, exactly as a record read from the store and changed before the claim would.

Kept: at most :data:`KEEP_MAX` records, none older than :data:`KEEP_S` (runs another server of
the fleet took are dropped that way; nothing is kept once taken).
"""

from __future__ import annotations

import collections
import time

from .._records import RunRecord

__all__ = ["KEEP_MAX", "KEEP_S", "JustSubmitted"]

KEEP_MAX = 64
"""Most records kept at once (a record holds its input: up to the server's ``--max-body``)."""
KEEP_S = 2.0
"""How long a record is kept for the taker."""


class JustSubmitted:
    """Records of runs submitted here, until taken (:meth:`take`) or dropped."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[str, tuple[float, RunRecord]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, record: RunRecord) -> None:
        """Keep ``record`` (just written, ``queued``, not yet queued) for the taker."""
        now = time.monotonic()
        kept = self._kept
        kept[record.run_id] = (now, record)
        kept.move_to_end(record.run_id)
        while kept and (len(kept) > KEEP_MAX or now - next(iter(kept.values()))[0] > KEEP_S):
            kept.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop the record of ``run_id`` (its entry could not be queued)."""
        self._kept.pop(run_id, None)

    def take(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id`` if it was kept and is still fresh; never the same twice."""
        got = self._kept.pop(run_id, None)
        if got is None or time.monotonic() - got[0] > KEEP_S:
            return None
        return got[1]
