"""Tools of the control-flow test chains. Calls are logged to the file named by CHAINRT_TEST_LOG."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any


def _log(name: str, **extra: Any) -> None:
    path = os.environ.get("CHAINRT_TEST_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tool": name, "pid": os.getpid(), "t": time.time(), **extra}))
            fh.write("\n")


async def step(name: str, value: Any = None, ms: float = 0) -> Any:
    """Log the call, sleep ``ms`` (cancelled at the deadline), return ``value`` (or the name)."""
    _log(name)
    if ms:
        await asyncio.sleep(ms / 1000)
    return name if value is None else value


def intent(question: str) -> dict[str, Any]:
    """A stand-in for a classifier: the intent and the order id in the question."""
    _log("intent")
    words = question.split()
    order = next((w for w in words if w.startswith("A") and w[1:].isdigit()), None)
    kind = "refund" if "refund" in words else "status" if "status" in words else "other"
    return {"intent": kind, "order_id": order}


async def item(name: str, index: int, value: Any, slow_from: int, slow_ms: float, ms: float) -> Any:
    """A map item: ``ms`` of work, or ``slow_ms`` from index ``slow_from`` on."""
    _log(name, index=index)
    await asyncio.sleep((slow_ms if index >= slow_from else ms) / 1000)
    return {"index": index, "value": value}


async def wait_for_kill(name: str, marker: str) -> str:
    """The first time: say so in ``marker`` and wait to be killed; afterwards return at once."""
    _log(name)
    flag = Path(marker)
    if not flag.exists():
        flag.write_text("reached")
        await asyncio.sleep(60)
    return name


async def hold(name: str, ms: float) -> dict[str, float]:
    """Log entry and exit times around an async sleep (for concurrency-key checks)."""
    entered = time.time()
    await asyncio.sleep(ms / 1000)
    left = time.time()
    _log(name, entered=entered, left=left)
    return {"entered": entered, "left": left}


_FLAKY: dict[str, int] = {}


def flaky(name: str, failures: int) -> str:
    """Fails ``failures`` times per name (in this process), then succeeds."""
    count = _FLAKY.get(name, 0)
    _FLAKY[name] = count + 1
    _log(name)
    if count < failures:
        raise RuntimeError(f"flaky failure {count + 1}")
    return f"ok after {count} failures"
