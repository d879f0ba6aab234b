"""Tools of the dashboard browser tests."""

from __future__ import annotations

import asyncio


async def nap(seconds: float) -> str:
    """Sleeps ``seconds`` (cancelled when the run is)."""
    await asyncio.sleep(seconds)
    return "rested"
