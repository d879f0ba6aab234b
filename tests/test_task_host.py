"""``TaskHost``: one task hosts a run's tool calls, one after another (issue 18).

Work runs its first stretch as the host's task and, if it waits, is continued by that same task,
exactly as a task of its own would run it: what ``asyncio.current_task()`` says, ``asyncio.timeout``
and context variables behave as in ``tests/test_bounded_eager.py``. Cancellations aimed at one piece
of work do not reach the next, busy hosts give way to a task of their own, and abandoned work
keeps its task while the host moves on to a new one.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from pathlib import Path

import pytest

from chainrt._bounded import TaskHost, within
from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import make_dispatcher
from chainrt.spec import spec_from_dict
from chainrt.store import open_store

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="outer")


def _me() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def test_work_that_finishes_at_once_runs_as_the_hosts_task_and_makes_no_task() -> None:
    host = TaskHost()
    caller = _me()
    seen: list[asyncio.Task[object]] = []

    async def quick(n: int) -> int:
        seen.append(_me())
        return n * 2

    assert await within(quick(1), 1.0, host=host) == 2
    tasks = len(asyncio.all_tasks())
    assert [await within(quick(n), 1.0, host=host) for n in range(2, 12)] == list(range(4, 24, 2))
    assert len(asyncio.all_tasks()) == tasks  # ten calls, not one task more
    assert len(set(seen)) == 1
    assert seen[0] is not caller
    assert _me() is caller
    host.close()


async def test_work_that_waits_is_continued_by_the_host_which_then_takes_the_next() -> None:
    host = TaskHost()
    seen: list[asyncio.Task[object]] = []

    async def waits(n: int) -> int:
        seen.append(_me())
        await asyncio.sleep(0.01)
        seen.append(_me())
        await asyncio.sleep(0)
        return n

    assert [await within(waits(n), 5.0, host=host) for n in range(3)] == [0, 1, 2]
    assert len(set(seen)) == 1
    assert not seen[0].done()  # waiting for the next piece of work
    host.close()
    await asyncio.wait_for(asyncio.shield(seen[0]), 5.0)  # closed: its task ends
    assert seen[0].done()
    assert not seen[0].cancelled()


async def test_asyncio_timeout_inside_hosted_work_cancels_the_work_and_nothing_after() -> None:
    host = TaskHost()
    tasks: list[asyncio.Task[object]] = []

    async def own_timeout() -> str:
        tasks.append(_me())
        try:
            async with asyncio.timeout(0.02):
                await asyncio.sleep(10)
        except TimeoutError:
            return "own timeout"
        return "slept"

    async def after() -> int:
        tasks.append(_me())
        await asyncio.sleep(0.01)
        return _me().cancelling()

    assert await within(own_timeout(), 5.0, host=host) == "own timeout"
    assert await within(after(), 5.0, host=host) == 0
    assert tasks[0] is tasks[1]
    await asyncio.sleep(0.05)  # a stray cancellation of the caller would land here
    assert _me().cancelling() == 0
    host.close()


async def test_work_cut_at_its_limit_does_not_leave_the_next_work_cancelled() -> None:
    host = TaskHost()
    tasks: list[asyncio.Task[object]] = []

    async def sleeper() -> None:
        tasks.append(_me())
        await asyncio.sleep(10)

    async def quick_after_a_wait() -> str:
        tasks.append(_me())
        await asyncio.sleep(0.01)
        return "fine"

    with pytest.raises(TimeoutError):
        await within(sleeper(), 0.05, host=host)
    assert await within(quick_after_a_wait(), 5.0, host=host) == "fine"
    assert tasks[0] is tasks[1]  # the cut work stopped at once: the host took the next
    host.close()


async def test_work_that_ignores_its_cancellation_is_abandoned_and_the_host_moves_on() -> None:
    host = TaskHost()
    tasks: list[asyncio.Task[object]] = []
    finished = asyncio.Event()

    async def stubborn() -> str:
        tasks.append(_me())
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # winds down well past the grace
            finished.set()
            raise
        return "slept"

    async def next_work() -> str:
        tasks.append(_me())
        await asyncio.sleep(0)
        return "next"

    with pytest.raises(TimeoutError):
        await within(stubborn(), 0.05, host=host)
    assert not finished.is_set()
    assert await within(next_work(), 5.0, host=host) == "next"
    assert tasks[0] is not tasks[1]  # a new task: the old one still winds the work down
    await asyncio.wait_for(finished.wait(), 5.0)
    await asyncio.wait_for(asyncio.shield(tasks[0]), 5.0)  # abandoned: ends with its work
    host.close()


async def test_errors_reach_the_caller_and_the_host_takes_the_next_work() -> None:
    host = TaskHost()

    async def broken_at_once() -> None:
        raise KeyError("at once")

    async def broken_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("later")

    async def fine() -> str:
        await asyncio.sleep(0)
        return "fine"

    with pytest.raises(KeyError, match="at once"):
        await within(broken_at_once(), 1.0, host=host)
    with pytest.raises(ValueError, match="later"):
        await within(broken_later(), 1.0, host=host)
    assert await within(fine(), 1.0, host=host) == "fine"
    host.close()


async def test_context_changes_of_hosted_work_stay_in_that_work() -> None:
    host = TaskHost()

    async def sets(value: str) -> str:
        before = _VAR.get()
        _VAR.set(value)
        await asyncio.sleep(0)
        return f"{before}->{_VAR.get()}"

    assert await within(sets("a"), 1.0, host=host) == "outer->a"
    assert await within(sets("b"), 1.0, host=host) == "outer->b"
    assert _VAR.get() == "outer"
    host.close()


async def test_work_calling_within_while_its_host_is_busy_gets_a_task_of_its_own() -> None:
    host = TaskHost()

    async def inner() -> asyncio.Task[object]:
        await asyncio.sleep(0)
        return _me()

    async def outer() -> tuple[asyncio.Task[object], asyncio.Task[object]]:
        await asyncio.sleep(0)
        return _me(), await within(inner(), 1.0, host=host)

    mine, theirs = await within(outer(), 1.0, host=host)
    assert mine is not theirs
    host.close()


async def test_cancelling_the_caller_cancels_hosted_work() -> None:
    host = TaskHost()
    cancelled = asyncio.Event()

    async def sleeper() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(within(sleeper(), 30.0, host=host))
    await asyncio.sleep(0.02)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 5.0)
    host.close()


_TOOLS = """
import asyncio


def _me():
    task = asyncio.current_task()
    return [id(task), task.get_name()]  # (a task's id may be reused once it is freed)


async def at_once():
    return _me()


async def waits():
    before = _me()
    await asyncio.sleep(0.01)
    return [before, _me()]
"""


def _hosts() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "chainrt-tool-host"]


async def test_a_runs_tool_calls_share_one_task_which_ends_with_the_run(tmp_path: Path) -> None:
    (tmp_path / "host_tools.py").write_text(_TOOLS, encoding="utf-8")
    steps = [
        {"id": "a", "tool": "host_tools.py:at_once"},
        {"id": "b", "tool": "host_tools.py:waits"},
        {"id": "c", "tool": "host_tools.py:at_once"},
    ]
    spec = spec_from_dict({"name": "hosted", "budget": "10s", "steps": steps})
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    runner = Runner(store, make_dispatcher(None), LocalLimiter())
    try:
        result = await runner.run(spec, {}, source_dir=tmp_path)
        records = await store.get_steps(result.run_id)
    finally:
        await store.close()
    assert result.status == "completed", result.error
    a, (b1, b2), c = (records[s].output for s in ("a", "b", "c"))
    assert a == b1 == b2 == c  # one task for the three calls, before and after a wait
    assert a[1] == "chainrt-tool-host"
    assert a[0] != id(_me())
    await asyncio.sleep(0)  # closed with the run: its task ends at the loop's next turn
    assert _hosts() == []


async def test_a_closed_host_leaves_nothing_for_the_cycle_collector() -> None:
    """A runner process leaves no cyclic garbage per step or run (docs/performance.md, round
    8): the host's task, its coroutine and its context are freed by reference counting."""

    async def quick() -> int:
        return 1

    async def used_and_closed() -> None:
        host = TaskHost()
        assert await within(quick(), 1.0, host=host) == 1
        host.close()
        for _ in range(3):
            await asyncio.sleep(0)  # its task ends

    await used_and_closed()  # first use: caches, interned names
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await used_and_closed()
        found = gc.collect()
        leftovers = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert found == 0, leftovers
