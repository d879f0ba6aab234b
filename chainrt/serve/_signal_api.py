"""Signals in ``chainrt serve``: ``POST /v1/runs/{id}/signal`` and the loop that watches waits.

A waiting run costs the fleet nothing but its records: its entry was acknowledged when it parked,
it holds no runner slot, no owner lease and no concurrency key. A signal that finds it parked at
that wait queues it again (priority ``high``), and whichever runner takes the entry continues
it. The ``waits`` loop (every :data:`WAITS_EVERY_S`) queues the waiting runs that must move
although no request came here: a wait whose timeout passed (``on_timeout`` decides), or a
signal kept while no runner could queue it (sent with ``chainrt signal --no-resume``, or while
the runners were down, or while the run was still ending its execution on the runner that
received the signal).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from .._errors import ChainRTError, SignalRefused
from .._records import RunRecord
from ..runs._signals import parked_wait, send_signal, waits_on
from ._queue import Entry

if TYPE_CHECKING:
    from ._service import Service

__all__ = [
    "WAITS_EVERY_S",
    "SignalAccepted",
    "SignalRequest",
    "add_signal_route",
    "due",
    "signal_run",
    "waits_loop",
]

WAITS_EVERY_S = 5.0
"""How often a runner looks for waiting runs that must move (a timeout passed, a signal kept):
one read of each waiting run's signal per round, its steps only once its timeout may be up."""

_MAX_LISTED = 10_000


class SignalRequest(BaseModel):
    """``POST /v1/runs/{id}/signal``: the signal a run's ``wait`` step waits for."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The signal's name (the wait's `signal:`).")
    payload: Any = Field(default=None, description="Any JSON value; checked against the schema.")


class SignalAccepted(BaseModel):
    """The answer to a signal: kept, and whether the run was queued to continue."""

    run_id: str
    status: str = Field(description="The run's status when the signal was kept.")
    signal: str
    stored: bool = Field(description="False when the same signal had been kept before.")
    queued: bool = Field(description="True when the run was parked at this wait and is queued.")


async def signal_run(service: Service, run_id: str, name: str, payload: Any) -> SignalAccepted:
    """Keep the signal (SignalRefused: nothing kept) and queue the run if it was parked at it."""
    store = service.runtime.store
    sent = await send_signal(store, run_id, name, payload)
    record = await waits_on(store, sent)
    if record is not None:
        await _queue(service, record)
    return SignalAccepted(
        run_id=run_id,
        status=sent.status,
        signal=name,
        stored=sent.stored,
        queued=record is not None,
    )


async def _queue(service: Service, record: RunRecord) -> None:
    await service.queue.put(Entry(record.run_id, "resume", None, record.chain), "high")


def add_signal_route(app: FastAPI, service: Service) -> None:
    """Add ``POST /v1/runs/{run_id}/signal`` (scope ``operate``) and its error answers."""

    @app.exception_handler(SignalRefused)
    async def refused(request: Request, exc: SignalRefused) -> JSONResponse:
        status = 409 if exc.conflict else 422
        body: dict[str, Any] = {"type": "signal_refused", "message": exc.message}
        if not exc.conflict:
            body["field"] = "payload"
        return JSONResponse({"error": body}, status_code=status)

    @app.post(
        "/v1/runs/{run_id}/signal",
        status_code=202,
        response_model=SignalAccepted,
        responses={404: {}, 409: {}, 422: {}},
    )
    async def signal(run_id: str, body: SignalRequest) -> SignalAccepted:
        """Send a run the signal its ``wait`` step waits for. The payload must match the wait's
        schema (else 422, and the run keeps waiting); a signal sent before the run reaches its
        wait is kept. A run parked at that wait is queued, and any runner continues it."""
        return await signal_run(service, run_id, body.name, body.payload)


async def due(service: Service, record: RunRecord, now: float) -> bool:
    """True when the waiting run ``record`` must be continued now: its signal is kept, or its
    wait's timeout has passed."""
    store = service.runtime.store
    wait = await parked_wait(store, record)
    if wait is None:
        return False
    if await store.get_signal(record.run_id, wait.signal) is not None:
        return True
    if wait.timeout is None or now < record.created_at + wait.timeout / 1000:
        return False  # the wait began after the run was created: its timeout is not up yet
    for step in (await store.get_steps(record.run_id)).values():
        parked = step.output if step.status == "waiting" else None
        if isinstance(parked, dict) and parked.get("signal") == wait.signal:
            until = parked.get("until")
            return isinstance(until, int | float) and now >= until
    return False


async def waits_loop(service: Service) -> None:
    """Queue the waiting runs that are :func:`due` (supervised like the runner's other loops)."""
    health = service.loops["waits"]
    store = service.runtime.store
    while not service.draining:
        now = time.time()
        for record in await store.list_runs(status="waiting", limit=_MAX_LISTED):
            if record.run_id in service.runtime.active():
                continue
            try:
                if await due(service, record, now):
                    await _queue(service, record)
            except ChainRTError:
                continue  # expired or unreadable meanwhile: the next round looks again
        health.ok()
        await asyncio.sleep(WAITS_EVERY_S)
