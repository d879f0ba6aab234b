"""Tools of the crash-drill chain (``chain.yaml``): log the call, wait a few ms, derive the output.

Each call appends one JSON line ``{key, step, pid, attempt, t}`` to ``<log_dir>/<run_id>.jsonl``
*before* it does its work, so a call cut short by ``kill -9`` is still on record. The output is
``chainrt.testing.drill.next_value(prev, step_id)``: it depends on every earlier step, so a resume
that fed a step the wrong input would show in the run's final output.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from chainrt import StepContext
from chainrt.testing.drill import next_value


def _log(log_dir: str, ctx: StepContext) -> None:
    line = {
        "key": ctx.idempotency_key,
        "step": ctx.step_id,
        "pid": os.getpid(),
        "attempt": ctx.attempt,
        "t": time.time(),
    }
    # One O_APPEND write of one short line: a kill cannot leave half a line behind.
    fd = os.open(Path(log_dir) / f"{ctx.run_id}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def step_sync(prev: Any, sleep_ms: float, log_dir: str, ctx: StepContext) -> dict[str, Any]:
    """A sync step (it runs in a thread): log, sleep, return the next value."""
    _log(log_dir, ctx)
    time.sleep(sleep_ms / 1000)
    return next_value(prev, ctx.step_id)


async def step_async(prev: Any, sleep_ms: float, log_dir: str, ctx: StepContext) -> dict[str, Any]:
    """An async step (it runs on the loop): log, sleep, return the next value."""
    _log(log_dir, ctx)
    await asyncio.sleep(sleep_ms / 1000)
    return next_value(prev, ctx.step_id)


def step_pick(prev: Any, log_dir: str, ctx: StepContext) -> dict[str, Any]:
    """The flow drill's switch input (``flow.yaml``): log, then the branch and map items the
    previous output picks (``chainrt.testing._drill_flow.pick_value``)."""
    from chainrt.testing._drill_flow import pick_value

    _log(log_dir, ctx)
    return pick_value(prev, ctx.step_id)
