"""Tools of bench/agent.py's chains."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any


async def noop() -> str:
    """Do nothing (the loop's own cost is what is measured)."""
    return "ok"


async def work(ms: float) -> str:
    """Work for ``ms`` milliseconds (a tool's own time)."""
    await asyncio.sleep(ms / 1000)
    return "done"


async def pause() -> str:
    """Work a while (``BENCH_AGENT_TOOL_MS`` milliseconds: a tool's own time)."""
    await asyncio.sleep(float(os.environ.get("BENCH_AGENT_TOOL_MS", "0")) / 1000)
    return "done"


def side(n: int, ctx: Any) -> int:
    """A side effect (the chaos drill): logs its idempotency key, works a little, returns 2n."""
    path = os.environ.get("CHAINRT_TEST_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": ctx.idempotency_key, "pid": os.getpid()}) + "\n")
    time.sleep(random.uniform(0.005, 0.03))
    return 2 * n
