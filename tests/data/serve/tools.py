"""Tools of the serve tests. Each call is logged (run, step, pid) to CHAINRT_TEST_LOG."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from chainrt import StepContext


def _log(ctx: StepContext, **extra: object) -> None:
    path = os.environ.get("CHAINRT_TEST_LOG")
    if path:
        line = {"run": ctx.run_id, "step": ctx.step_id, "pid": os.getpid(), "t": time.time()}
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({**line, **extra}) + "\n")


async def add(ctx: StepContext, total: int, i: int, seconds: float) -> int:
    """Sleeps ``seconds`` on the loop, then returns ``total + i`` (a chain of them sums up)."""
    _log(ctx)
    await asyncio.sleep(seconds)
    return total + i


async def nap(ctx: StepContext, seconds: float) -> str:
    """Sleeps ``seconds`` (cancelled when the run is)."""
    _log(ctx)
    await asyncio.sleep(seconds)
    return "rested"


async def noop() -> int:
    """Returns at once."""
    return 1
