"""Tools of the API access tests."""

from __future__ import annotations

import asyncio


async def nap(seconds: float) -> str:
    """Sleeps ``seconds`` (cancelled when the run is)."""
    await asyncio.sleep(seconds)
    return "rested"


async def noop() -> int:
    """Returns at once."""
    return 1
