"""One timer for many same-length deadlines (chainrt._watchdog): every call is bounded,
also those that start after the timer was set, and a cancellation from elsewhere stays one."""

from __future__ import annotations

import asyncio
import time

import pytest

from chainrt._watchdog import Watchdog

BOUND_S = 0.2


async def test_a_call_that_outlives_its_bound_times_out_and_the_others_finish() -> None:
    dog = Watchdog(BOUND_S)

    async def quick() -> str:
        return await dog.run(asyncio.sleep(0.01, "quick"))

    async def stuck(delay: float) -> float:
        await asyncio.sleep(delay)  # starts while the timer is set for an earlier call
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await dog.run(asyncio.sleep(60))
        return time.monotonic() - started

    async with asyncio.timeout(10):  # a watchdog that never fires fails here, not by hanging
        results = await asyncio.gather(quick(), stuck(0.05), stuck(0.1), quick())
    assert results[0] == results[3] == "quick"
    assert min(results[1], results[2]) >= BOUND_S  # timers never fire early
    assert dog._running == {}
    dog.stop()


async def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    dog = Watchdog(BOUND_S)
    task = asyncio.create_task(dog.run(asyncio.sleep(60)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # and the timer, still set for that call, fires on nothing and stops
    await asyncio.sleep(BOUND_S + 0.05)
    assert dog._timer is None


async def test_a_timed_out_task_can_go_on_awaiting() -> None:
    dog = Watchdog(BOUND_S)
    with pytest.raises(TimeoutError):
        await dog.run(asyncio.sleep(60))
    # the cancellation was taken back (uncancel): the task is not cancelled again later
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert await dog.run(asyncio.sleep(0.01, "after")) == "after"
    dog.stop()


async def _inline(dog: Watchdog, seconds: float) -> str:
    """What the run journal does around a commit: enter, await in this task, leave."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    assert dog.enter(loop, task, BOUND_S)
    assert not dog.enter(loop, task, BOUND_S)  # bounded already: a nested call is told so
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if dog.timed_out(task):
            return "timed out"
        raise
    finally:
        dog.leave(task)
    return "done"


async def test_inline_bounds_time_out_finish_and_tell_a_cancellation_from_elsewhere() -> None:
    dog = Watchdog(60.0)
    async with asyncio.timeout(10):
        started = time.monotonic()
        assert await _inline(dog, 60) == "timed out"
        assert time.monotonic() - started >= BOUND_S  # never early
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        assert await _inline(dog, 0.01) == "done"
        elsewhere = asyncio.create_task(_inline(dog, 60))
        await asyncio.sleep(0.01)
        elsewhere.cancel()
        with pytest.raises(asyncio.CancelledError):
            await elsewhere
    assert dog._running == {}
    assert dog._expired == set()
    dog.stop()
