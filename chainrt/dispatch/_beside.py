"""A fallback started beside a running attempt (docs/dispatch.md): the driver of
:func:`~._adapt.fallback_start`.

An attempt with no retry elsewhere after it is not cut to leave the next fallback its reserve.
It runs until the step's deadline, and the fallbacks start beside it — at once when its answer
can no longer come before the fallbacks' own expected time (it has run past its slow mark, or
its endpoint is slow now), else when only that time is left. The first answer wins; the other
side is cancelled (an attempt's HTTP connection closed, a queued local generation dropped). In a
spike several runs fall back at the same moment: started beside, none of them first waits for a
cut, so the queue on the fallback starts as early as it can.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError
from ._adapt import fallback_start
from ._backend import BackendAnswer
from ._types import LlmAnswer

__all__ = ["Beside", "run_beside"]

_WIND_DOWN_S = 0.05
"""How long the winner waits for the loser's cancellation to finish."""

Log = Callable[[str, float, str | None, str, int | None], None]
"""Writes one attempt-log entry: status, elapsed ms, endpoint, detail, and the place in the log
to put it at (None: at the end)."""


@dataclass(frozen=True, slots=True)
class Beside:
    """What the driver needs to know of the running attempt and the fallbacks."""

    deadline: float
    """The step's deadline (unix seconds)."""
    need_s: float
    """Time kept for the fallbacks (:func:`~._policy.reserve_for`)."""
    expected_s: float | None
    """The attempt's expected time (its p90 behind its queue; None: unknown)."""
    slow_mark_s: float | None
    """After this long the attempt itself is the sign its endpoint is slow (None: unknown)."""
    own_slow: Callable[[], bool]
    """Whether the attempt's endpoint is slow now."""
    picked: Callable[[], str | None]
    """The endpoint the attempt went to (None: not known yet)."""


async def run_beside(
    attempt: Coroutine[Any, Any, BackendAnswer],
    fallbacks: Callable[[], Awaitable[tuple[LlmAnswer | None, bool]]],
    view: Beside,
    log: Log,
    on_failure: Callable[[BackendError], None],
    logged: Callable[[], int] = lambda: 0,
) -> BackendAnswer | LlmAnswer | None:
    """Run ``attempt``; start ``fallbacks()`` beside it when :func:`~._adapt.fallback_start`
    says. The attempt's answer, the fallbacks' answer, or None when neither answered. A failure
    of the attempt before the fallbacks start is raised (the caller's retry decides); after,
    it is logged here (``on_failure`` hears of it) and the fallbacks run on. ``logged``: the
    attempt log's length, read when the fallbacks start: the attempt cancelled for their answer
    is logged at that place, before their entries."""
    task = asyncio.ensure_future(attempt)
    begun = time.time()
    others: asyncio.Future[tuple[LlmAnswer | None, bool]] | None = None
    try:
        while True:
            now = time.time()
            stuck = view.slow_mark_s is not None and now - begun >= view.slow_mark_s
            unknown = stuck or view.own_slow()
            start = fallback_start(
                now=now,
                deadline=view.deadline,
                need_s=view.need_s,
                expected_end=None if unknown else begun + (view.expected_s or 0.0),
            )
            if start is None:
                return await task
            wake = (
                start if stuck or view.slow_mark_s is None else min(start, begun + view.slow_mark_s)
            )
            if wake <= now:
                break
            done, _ = await asyncio.wait({task}, timeout=wake - now)
            if done:
                return task.result()
        switched_ms = (time.time() - begun) * 1000
        place = logged()
        others = asyncio.ensure_future(fallbacks())
        pending: set[asyncio.Future[Any]] = {task, others}
        while pending:
            ended, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if task in ended:
                try:
                    return task.result()
                except BackendError as exc:
                    detail = f"{exc.message}; the fallback started beside it after {switched_ms:.0f}ms runs on"
                    log(exc.error_class, (time.time() - begun) * 1000, exc.endpoint, detail, None)
                    on_failure(exc)
            if others in ended:
                answer, _ = others.result()
                if answer is not None:
                    if not task.done():
                        task.cancel()
                        await asyncio.wait({task}, timeout=_WIND_DOWN_S)
                        log(
                            "cancelled",
                            (time.time() - begun) * 1000,
                            view.picked(),
                            f"the fallback started beside it after {switched_ms:.0f}ms answered "
                            "first; its connection was closed",
                            place,
                        )
                    return answer
        return None
    finally:
        for future in (task, others):
            if future is not None and not future.done():
                future.cancel()
        if others is not None and not others.done():
            await asyncio.wait({others}, timeout=_WIND_DOWN_S)
