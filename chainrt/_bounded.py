"""Awaiting work with a hard time limit: the caller gets control back at the limit, come what may.

``asyncio.wait_for`` cancels the work at its timeout and then waits for the work to *finish being
cancelled*: a tool that cleans up for a second after its cancellation, or a client whose
cancellation blocks on a socket, holds the step that long past its deadline. :func:`within`
cancels the work at the limit, gives it ``grace_s`` to wind down, and otherwise abandons it
(the abandoned task still runs to its end; its outcome is collected so that nothing is
reported as never retrieved). Steps therefore end within their allotment plus a bounded grace
(issue 14: overshoot), whatever the code they run does once cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["CANCEL_GRACE_S", "within"]

T = TypeVar("T")

CANCEL_GRACE_S = 0.005
"""How long cancelled work may take to wind down before it is abandoned."""


async def within(work: Awaitable[T], timeout_s: float, *, grace_s: float = CANCEL_GRACE_S) -> T:
    """``await work``, or raise ``TimeoutError`` at most ``timeout_s + grace_s`` from now.

    At the timeout the work is cancelled; if it has not stopped ``grace_s`` later it is left to
    finish on its own. Cancelling the caller cancels the work too.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task,), timeout=max(timeout_s, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        return task.result()
    task.cancel()
    try:
        await asyncio.wait((task,), timeout=grace_s)
    except asyncio.CancelledError:
        task.add_done_callback(_collect)
        raise
    if not task.done():
        task.add_done_callback(_collect)
    elif not task.cancelled() and task.exception() is None:
        # It finished in the grace (it ignored the cancellation): the answer is late, but here.
        return task.result()
    raise TimeoutError(f"not done within {timeout_s * 1000:.0f}ms")


def _collect(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome (an exception nobody awaits is not an error)."""
    if not task.cancelled():
        task.exception()
