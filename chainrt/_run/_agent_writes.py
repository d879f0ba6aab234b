"""An agent's record writes that run beside its next model request (issue 38).

The calls of a turn with tools end with their records to write. When the next turn is the last
one (no tools), its request goes out at once and those writes run beside it: they leave the
critical path of the final answer. The last turn's own record is written only once theirs are
(:meth:`PendingWrites.settle` first), so a resume never replays a turn whose preceding call
records are missing. Were a record refused by the store (the call's entry then carries the
error, as the model must be told), the request sent with the result is not the one the records
describe: the caller asks again with the corrected results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from .._records import StepRecord

__all__ = ["PendingWrites", "beside"]

_T = TypeVar("_T")


@dataclass(slots=True)
class _Pending:
    task: asyncio.Future[StepRecord]
    record: StepRecord
    entry: dict[str, Any] | None
    """The call's entry in the step's ``calls`` (what the model is told); None: a turn's."""


class PendingWrites:
    """Record writes started and not yet waited for (a turn's calls', a cut turn's)."""

    def __init__(self, write: Callable[[StepRecord], Awaitable[StepRecord]]) -> None:
        self._write = write
        self._pending: list[_Pending] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def start(self, record: StepRecord, entry: dict[str, Any] | None = None) -> None:
        """Start writing ``record``; ``entry``: the call's entry, corrected in place when the
        store refuses the record (``{name, arguments, error}``, as a refused write gives)."""
        task = asyncio.ensure_future(self._write(record))
        self._pending.append(_Pending(task, record, entry))

    async def settle(self) -> bool:
        """Wait until every write started has ended; True when the store refused a call's
        record (its entry now says so). A write that raised raises here, once all have ended."""
        pending, self._pending = self._pending, []
        if not pending:
            return False
        ended = await asyncio.gather(*(p.task for p in pending), return_exceptions=True)
        refused = False
        raised: BaseException | None = None
        for item, got in zip(pending, ended, strict=True):
            if isinstance(got, BaseException):
                raised = raised or got
            elif got is not item.record and item.entry is not None:
                entry = item.entry
                told = {"name": entry.get("name"), "arguments": entry.get("arguments")}
                entry.clear()
                entry.update(told, error=got.error)
                refused = True
        if raised is not None:
            raise raised
        return refused


async def beside(
    asking: Coroutine[Any, Any, _T], settle: Callable[[], Awaitable[bool]]
) -> _T | None:
    """``asking`` (the last turn's request) sent while the records before it are being written
    (``settle`` waits for them): its result once they are; None, the request cancelled, when
    the store refused a call's record (the request told the model a result the records do not
    hold: the caller asks again)."""
    asked = asyncio.ensure_future(asking)
    try:
        refused = await settle()
    except BaseException:
        asked.cancel()
        raise
    if refused:
        asked.cancel()
        await asyncio.wait([asked])
        return None
    return await asked
