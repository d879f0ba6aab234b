"""``within`` starts coroutines eagerly: work that needs no wait costs no turn of the loop.

The first stretch of the work runs under the task that owns the rest of it, so what a tool does
with ``asyncio.current_task()`` (``asyncio.timeout``, ``TaskGroup``) and with context variables
behaves as if it had been a task from the start.
"""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from chainrt._bounded import within

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="outer")


async def test_work_that_returns_at_once_takes_no_turn_of_the_loop() -> None:
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1

    async def quick() -> int:
        return 3

    loop = asyncio.get_running_loop()
    loop.call_soon(tick)  # runs at the loop's next turn: only if ``within`` yields to the loop
    assert await within(quick(), 1.0) == 3
    assert turns == 0
    await asyncio.sleep(0)
    assert turns == 1


async def test_an_error_raised_at_once_reaches_the_caller() -> None:
    async def broken() -> None:
        raise KeyError("at once")

    with pytest.raises(KeyError, match="at once"):
        await within(broken(), 1.0)


async def test_first_stretch_runs_as_the_task_that_owns_the_work() -> None:
    caller = asyncio.current_task()
    seen: list[asyncio.Task[object] | None] = []

    async def tool() -> str:
        seen.append(asyncio.current_task())
        await asyncio.sleep(0.01)
        seen.append(asyncio.current_task())
        return "done"

    assert await within(tool(), 5.0) == "done"
    assert seen[0] is seen[1]
    assert seen[0] is not None
    assert seen[0] is not caller
    assert asyncio.current_task() is caller  # the caller is current again afterwards


async def test_asyncio_timeout_inside_the_work_cancels_the_work_not_the_caller() -> None:
    async def tool() -> str:
        try:
            async with asyncio.timeout(0.02):  # entered in the first stretch
                await asyncio.sleep(10)
        except TimeoutError:
            return "own timeout"
        return "slept"

    assert await within(tool(), 5.0) == "own timeout"
    await asyncio.sleep(0.05)  # a stray cancellation of the caller would land here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_context_changes_of_the_work_stay_in_the_work() -> None:
    async def quick() -> str:
        _VAR.set("inner")
        return _VAR.get()

    async def slow() -> str:
        _VAR.set("inner-slow")
        await asyncio.sleep(0.01)
        return _VAR.get()

    assert await within(quick(), 1.0) == "inner"
    assert await within(slow(), 1.0) == "inner-slow"
    assert _VAR.get() == "outer"


async def test_work_that_waits_is_still_cut_at_its_limit() -> None:
    async def sleeper() -> None:
        await asyncio.sleep(10)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await within(sleeper(), 0.05)
    # Bounded by timeout + grace (5 ms); 2 s of margin for a loaded 2-core machine.
    assert loop.time() - started < 2.0
