"""Signals kept beside a run: what a ``wait`` step waits for (docs/chain-format.md, Waits).

A signal is kept under its run and its name, the first one of a name wins (a second with the same
payload is a harmless retry; another payload is refused), and it is kept whether or not the run
has reached its wait yet: a signal sent early is not lost. Keeping it and reading the run's status
happen in one atomic step, so a sender learns whether the run was parked (``waiting``) at that
moment and must be continued, and a runner that parks after the signal was kept finds it when it
looks again (``chainrt/runs/_signals.py``).

Layout: Redis (:mod:`._signals_redis`) keeps each signal as a string ``chainrt:{<run_id>}:signal:<name>`` (the run's hash
tag: one Redis Cluster slot with the run, so one script reads the run and writes the signal);
SQLite keeps them in the table ``signals`` of the store's file (the signals of runs purged after
they expired are deleted by the next signal sent).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._errors import CorruptRecord, SignalRefused
from ..redis.keys import check_run_id
from ._codec import FINAL_STATUSES, not_found
from ._sqlite_conn import SQLiteConnection

__all__ = [
    "SIGNAL_KEEP_S",
    "KeptSignal",
    "SignalRecord",
    "SqliteSignals",
    "refused_for_status",
]

SIGNAL_KEEP_S = 400 * 86_400
"""How long Redis keeps a signal (:mod:`._signals_redis`) (longer than any wait's timeout); a run's own keys expire after
it finishes, its signals after this."""


class SignalRecord(BaseModel):
    """One signal: its name, its payload (any JSON value) and when it was kept (unix s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    payload: Any = None
    at: float = Field(default_factory=time.time)


class KeptSignal(BaseModel):
    """What keeping a signal found: the signal kept (this one, or the first of its name), the
    run's status at that moment, and whether this call stored it (False: it was there)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signal: SignalRecord
    status: str
    stored: bool


def refused_for_status(run_id: str, status: str) -> SignalRefused:
    """The refusal of a signal to a run that has ended."""
    return SignalRefused(
        f"run {run_id!r} has ended ({status}); a signal can only be sent to a run that is "
        "queued, running or waiting",
        conflict=True,
    )


def _decode(raw: str | bytes, run_id: str, where: str) -> SignalRecord:
    try:
        return SignalRecord.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptRecord(
            f"a signal of run {run_id!r} in {where} does not parse: "
            f"{exc.errors()[0].get('msg', exc)}; nothing was loaded from it"
        ) from None


def _encoded(run_id: str, signal: SignalRecord, limit: int) -> str:
    data = signal.model_dump_json()
    if len(data) > limit:
        raise SignalRefused(
            f"the payload of signal {signal.name!r} for run {run_id!r} is {len(data)} bytes as "
            f"JSON, over the store's limit of {limit}"
        )
    return data


def _same(kept: SignalRecord, new: SignalRecord, run_id: str) -> None:
    """A second signal of a name is a retry when its payload is the same; else refused."""
    if kept.payload != new.payload:
        raise SignalRefused(
            f"run {run_id!r} already has signal {new.name!r} (kept at {kept.at:.3f}) with "
            "another payload; a signal name is delivered once per run",
            conflict=True,
        )


# ------------------------------------------------------------------------------------ SQLite

_TABLE = """
CREATE TABLE IF NOT EXISTS signals (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    record TEXT NOT NULL,           -- SignalRecord JSON
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID"""


class SqliteSignals(SQLiteConnection):
    """The signal half of :class:`~chainrt.store._sqlite.SQLiteStore` (a base of it)."""

    max_record_bytes: int

    async def put_signal(self, run_id: str, signal: SignalRecord) -> KeptSignal:
        """Keep ``signal`` for ``run_id`` unless one of its name is kept already (same payload:
        a retry; another: SignalRefused). RunNotFound if no such run; SignalRefused (nothing
        kept) if the run has ended. Returns what was kept and the run's status then."""
        check_run_id(run_id)
        data = _encoded(run_id, signal, self.max_record_bytes)
        now = time.time()
        with self._transaction() as conn:
            conn.execute(_TABLE)
            row = conn.execute(
                "SELECT status FROM runs WHERE run_id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (run_id, now),
            ).fetchone()
            if row is None:
                raise not_found(run_id, self.url)
            status = str(row[0])
            if status in FINAL_STATUSES:
                raise refused_for_status(run_id, status)
            old = conn.execute(
                "SELECT record FROM signals WHERE run_id = ? AND name = ?", (run_id, signal.name)
            ).fetchone()
            if old is not None:
                kept = _decode(old[0], run_id, self.url)
                _same(kept, signal, run_id)
                return KeptSignal(signal=kept, status=status, stored=False)
            conn.execute(
                "INSERT INTO signals (run_id, name, record) VALUES (?, ?, ?)",
                (run_id, signal.name, data),
            )
            # The signals of runs purged since (their records expired): sent by people, they
            # are few, and each send sweeps them in the same transaction.
            conn.execute("DELETE FROM signals WHERE run_id NOT IN (SELECT run_id FROM runs)")
        return KeptSignal(signal=signal, status=status, stored=True)

    async def get_signal(self, run_id: str, name: str) -> SignalRecord | None:
        """The signal ``name`` kept for ``run_id``, or None."""
        check_run_id(run_id)
        with self._transaction(write=False) as conn:
            try:
                row = conn.execute(
                    "SELECT record FROM signals WHERE run_id = ? AND name = ?", (run_id, name)
                ).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # no signal was ever sent to this file
                    return None
                raise
        return None if row is None else _decode(row[0], run_id, self.url)


def payload_json(payload: Any) -> Any:
    """``payload`` as the JSON value it will be kept as (SignalRefused if it is not JSON)."""
    try:
        return json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise SignalRefused(f"a signal's payload must be JSON: {exc}") from None
