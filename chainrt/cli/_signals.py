"""SIGINT and SIGTERM during ``run`` and ``resume``: stop the run cleanly, then say so in one line.

Docker and Kubernetes stop a process with SIGTERM, a person with Ctrl-C (SIGINT); both are
handled alike (README.md, Using it). The signal cancels the command's task: the step in flight is
abandoned, the runner records the budget used, gives its owner lease and its concurrency slots
back (in ``finally`` blocks, shielded), and the command exits with ``128 + signal number`` (130
for SIGINT, 143 for SIGTERM) and one line naming the run to resume. A second signal while that
clean-up runs cancels it too (the lease then expires by itself).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from .._progress import Progress

if TYPE_CHECKING:
    from .._records import RunRecord, StepRecord
    from .._result import RunResult
    from ..spec import StepSpec

__all__ = ["RunWatch", "Stopped", "stoppable", "stopped_message"]

_T = TypeVar("_T")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """The command was stopped by ``signum`` after its run (if any) was released."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number."""
        return 128 + self.signum


class RunWatch(Progress):
    """Passes every event on to ``inner`` and remembers the run once it exists."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.run_id: str | None = None
        self.resumed = False

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        """Remember the run, then pass the event on."""
        self.run_id = record.run_id
        self.resumed = resumed
        self.inner.run_started(record, resumed=resumed)

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        """Pass the event on."""
        self.inner.step_started(step, allotted_ms, model)

    def step_finished(self, record: StepRecord) -> None:
        """Pass the event on."""
        self.inner.step_finished(record)

    def run_finished(self, result: RunResult) -> None:
        """Pass the event on."""
        self.inner.run_finished(result)


async def stoppable(work: Awaitable[_T]) -> _T:
    """Await ``work`` in this task; SIGINT or SIGTERM cancel it and raise :class:`Stopped`."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    for signum in _SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await work
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        raise Stopped(received[0]) from None
    finally:
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)


def stopped_message(stop: Stopped, watch: RunWatch, command: str, run_id: str | None) -> str:
    """The one line a stopped ``run`` or ``resume`` prints."""
    if watch.run_id is not None:
        return (
            f"chainrt: stopped by {stop.name}; run {watch.run_id} was checkpointed and released "
            f"(still running, not finished); resume it with `chainrt resume {watch.run_id}`"
        )
    if command == "resume" and run_id is not None:
        return (
            f"chainrt: stopped by {stop.name} before run {run_id} was taken over; nothing changed"
        )
    return f"chainrt: stopped by {stop.name} before the run started; nothing was recorded"
