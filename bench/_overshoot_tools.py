"""Tools for bench/overshoot.py: each sleeps ``ms`` (often past its step's allotment)."""

from __future__ import annotations

import asyncio
import time


def sync_sleep(ms: float) -> float:
    """Block this thread for ``ms`` (a sync tool is abandoned at its deadline)."""
    time.sleep(ms / 1000)
    return ms


async def async_sleep(ms: float) -> float:
    """Await for ``ms`` (an async tool is cancelled at its deadline)."""
    await asyncio.sleep(ms / 1000)
    return ms


async def async_stubborn(ms: float) -> float:
    """Await for ``ms``; when cancelled, finish a 50 ms clean-up before giving up.

    A tool that does not stop at once: the step must still end within its allotment plus a
    bounded grace, whatever the tool does after its cancellation.
    """
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        raise
    return ms
