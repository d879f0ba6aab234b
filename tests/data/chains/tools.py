"""Tools used by the test chains. Calls are logged to the file named by CHAINRT_TEST_LOG."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from chainrt import StepContext


def _log(name: str, **extra: Any) -> None:
    path = os.environ.get("CHAINRT_TEST_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"tool": name, "pid": os.getpid(), "t": time.time(), **extra}) + "\n"
            )


def record(name: str, sleep_s: float = 0.0, value: Any = None) -> dict[str, Any]:
    """Log the call, optionally sleep, return what it was given."""
    _log(name)
    if sleep_s:
        time.sleep(sleep_s)
    return {"name": name, "value": value}


def crash_once(name: str, marker: str) -> dict[str, Any]:
    """Kill the whole process (no cleanup, like kill -9) the first time; succeed afterwards."""
    _log(name)
    flag = Path(marker)
    if not flag.exists():
        flag.write_text("crashed")
        os._exit(17)
    return {"name": name, "survived": True}


def sleepy(seconds: float) -> str:
    """A sync tool that sleeps (it is abandoned at its deadline)."""
    _log("sleepy")
    time.sleep(seconds)
    return "woke"


async def async_sleepy(seconds: float) -> str:
    """An async tool that sleeps (it is cancelled at its deadline)."""
    _log("async_sleepy")
    await asyncio.sleep(seconds)
    return "woke"


async def noop() -> int:
    """Does nothing, fast (the overhead benchmark's step)."""
    return 1


def with_ctx(ctx: StepContext) -> dict[str, Any]:
    """Returns what the step context says."""
    return {"key": ctx.idempotency_key, "attempt": ctx.attempt, "left": ctx.seconds_left() > 0}


_FLAKY: dict[str, int] = {}


def flaky(name: str, failures: int) -> str:
    """Fails ``failures`` times per name (in this process), then succeeds."""
    count = _FLAKY.get(name, 0)
    _FLAKY[name] = count + 1
    if count < failures:
        raise RuntimeError(f"flaky failure {count + 1}")
    return f"ok after {count} failures"


def not_json() -> object:
    """Returns something that cannot be checkpointed."""
    return object()


def add(a: int, b: int) -> int:
    """Adds two numbers (checks that native types survive templates)."""
    return a + b


async def hold(name: str, seconds: float) -> dict[str, float]:
    """Log entry and exit times around an async sleep (for concurrency checks)."""
    entered = time.time()
    await asyncio.sleep(seconds)
    left = time.time()
    _log(name, entered=entered, left=left)
    return {"entered": entered, "left": left}


async def sleep_unless(name: str, marker: str, seconds: float) -> dict[str, Any]:
    """Logs the call; sleeps ``seconds`` (cancelled at the deadline) unless ``marker`` exists."""
    _log(name)
    if not Path(marker).exists():
        await asyncio.sleep(seconds)
    return {"name": name}
