"""Tools of bench/parallel.py."""

from __future__ import annotations

import asyncio


async def sleep_ms(ms: float) -> int:
    """Sleep ``ms`` milliseconds on the loop."""
    await asyncio.sleep(ms / 1000)
    return 1


async def noop(value: object = None) -> int:
    """Return at once."""
    return 1
