"""Overshoot is bounded: work that does not stop when cancelled cannot hold a step past its end.

``asyncio.wait_for`` waits for cancelled work to finish being cancelled; :func:`within` gives it
a few milliseconds and then abandons it. The timing checks compare with what the stubborn work
would take (a full second of clean-up): a loaded machine delays the event loop by tens of
milliseconds, never by the 700 ms of margin these checks leave.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import chainrt
from chainrt._bounded import within

CLEANUP_S = 1.0


async def stubborn(events: list[str]) -> str:
    """Sleeps; once cancelled, takes CLEANUP_S to give up."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        events.append("cancelled")
        await asyncio.sleep(CLEANUP_S)
        events.append("cleaned up")
        raise
    return "never"


async def test_within_returns_the_result_in_time() -> None:
    async def quick() -> int:
        await asyncio.sleep(0)
        return 7

    assert await within(quick(), 1.0) == 7


async def test_within_passes_the_works_own_error_on() -> None:
    async def broken() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await within(broken(), 1.0)


async def test_within_abandons_work_that_is_slow_to_stop() -> None:
    events: list[str] = []
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        await within(stubborn(events), 0.05)
    elapsed = time.perf_counter() - started
    assert events == ["cancelled"]  # it was told to stop ...
    assert elapsed < CLEANUP_S - 0.7  # ... and not waited for (wait_for would take > 1 s)
    await asyncio.sleep(CLEANUP_S + 0.2)
    assert events == ["cancelled", "cleaned up"]  # the abandoned work ran to its end


async def test_cancelling_the_caller_cancels_the_work() -> None:
    events: list[str] = []
    caller = asyncio.ensure_future(within(stubborn(events), 10.0))
    await asyncio.sleep(0.02)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert events == ["cancelled"]


async def test_a_stubborn_async_tool_cannot_hold_its_step(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(
        "import asyncio\n"
        "async def slow():\n"
        "    try:\n"
        "        await asyncio.sleep(10)\n"
        "    except asyncio.CancelledError:\n"
        f"        await asyncio.sleep({CLEANUP_S})\n"
        "        raise\n"
    )
    (tmp_path / "chain.yaml").write_text(
        "name: stubborn\nbudget: 300ms\nsteps:\n  - id: slow\n    tool: tools.py:slow\n"
    )
    chain = chainrt.load(tmp_path / "chain.yaml")
    result = await chain.arun({}, store=f"sqlite:///{tmp_path / 'runs.db'}")
    step = result.steps[0]
    assert (result.status, step.status) == ("partial", "timed_out")
    # Held for its clean-up, the step would last 300 ms + 1 s.
    assert step.elapsed_ms < step.allotted_ms + (CLEANUP_S - 0.7) * 1000
    assert result.budget.used_ms < result.budget.total_ms + (CLEANUP_S - 0.7) * 1000
