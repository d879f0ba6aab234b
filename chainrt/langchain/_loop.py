"""One private event loop behind LangChain's sync entry points (invoke, stream, batch): an anyio
blocking portal.

chainrt's async resources (a dispatcher's pooled HTTP client, a Redis connection) belong to the
loop that made them. Sync LangChain calls arrive on any thread: a fresh loop per call would rebuild
those resources every time, and the caller's own loop (if any) is blocked while it waits. So every
call goes to one long-lived portal (:func:`anyio.from_thread.start_blocking_portal`, started on
first use, on asyncio) and waits for it. The caller's context variables (LangChain's run config,
OpenTelemetry's current span) travel with the call: anyio schedules it with the caller's context.

At interpreter exit the clean-ups registered with :func:`on_shutdown` run on the portal, then the
portal stops, cancelling what still runs; its thread gets :data:`_SHUTDOWN_S` to end (it is a
daemon: a task that ignores cancellation cannot hold the process).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

__all__ = ["aiterate_on_loop", "iterate_sync", "on_loop", "on_shutdown", "run_sync"]

T = TypeVar("T")

_lock = threading.Lock()
_portal: BlockingPortal | None = None
_manager: AbstractContextManager[BlockingPortal] | None = None
_thread: threading.Thread | None = None
_cleanups: list[Callable[[], Awaitable[None]]] = []
_SHUTDOWN_S = 5.0
"""How long the loop may take at interpreter exit to close what was opened on it."""


def _background_portal() -> BlockingPortal:
    global _portal, _manager, _thread
    with _lock:
        if _portal is None:
            manager = start_blocking_portal("asyncio", name="chainrt-langchain-loop")
            portal = manager.__enter__()  # left at interpreter exit, in _shutdown
            _thread = portal.call(threading.current_thread)
            _portal, _manager = portal, manager
            atexit.register(_shutdown)
        return _portal


def _on_portal_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def on_shutdown(cleanup: Callable[[], Awaitable[None]]) -> None:
    """Run ``cleanup()`` on the loop at interpreter exit (close dispatchers opened on it)."""
    with _lock:
        _cleanups.append(cleanup)


def _shutdown() -> None:
    global _portal, _manager, _thread
    with _lock:
        portal, manager, thread = _portal, _manager, _thread
        _portal = _manager = _thread = None
        cleanups = list(_cleanups)
        _cleanups.clear()
    if portal is None or manager is None or thread is None:
        return

    async def close_all() -> None:
        for cleanup in cleanups:
            with contextlib.suppress(Exception):
                await cleanup()

    with contextlib.suppress(Exception):
        portal.start_task_soon(close_all).result(timeout=_SHUTDOWN_S)
    with contextlib.suppress(Exception):
        portal.start_task_soon(portal.stop, True).result(timeout=_SHUTDOWN_S)
    thread.join(timeout=_SHUTDOWN_S)
    if not thread.is_alive():
        manager.__exit__(None, None, None)  # the portal has stopped: this returns at once


def _refuse_on_portal_thread(coro: Coroutine[Any, Any, Any]) -> None:
    if _on_portal_thread():
        coro.close()
        raise RuntimeError(
            "a sync LangChain call (invoke/stream/batch) was made from code that runs on "
            "chainrt's own event loop; it would wait for itself — use ainvoke/astream/abatch there"
        )


async def _await(coro: Coroutine[Any, Any, T]) -> T:
    return await coro


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and block this thread until it ends.

    If the waiting thread is interrupted (KeyboardInterrupt), the coroutine is cancelled.
    """
    _refuse_on_portal_thread(coro)
    future: Future[T] = _background_portal().start_task_soon(_await, coro)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


async def on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the background loop from any other loop (cancellation propagates)."""
    portal = _background_portal()
    if _on_portal_thread():
        return await coro
    result: T = await portal.call_async(_await, coro)
    return result


_ITEM, _END, _ERROR = 0, 1, 2


def iterate_sync(stream: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async iterator from sync code: it runs on the background loop.

    The producer runs ahead of the consumer (its items are small events, and a run must not
    wait for the consumer); closing the returned iterator early cancels the producer and waits
    briefly for its clean-up.
    """
    items: queue.Queue[tuple[int, Any]] = queue.Queue()
    finished = threading.Event()

    async def pump() -> None:
        try:
            async for item in stream:
                items.put((_ITEM, item))
        except asyncio.CancelledError:
            items.put((_END, None))
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            items.put((_ERROR, exc))
        else:
            items.put((_END, None))
        finally:
            finished.set()

    coro = pump()
    _refuse_on_portal_thread(coro)
    future = _background_portal().start_task_soon(_await, coro)
    try:
        while True:
            kind, value = items.get()
            if kind == _ITEM:
                yield value
            elif kind == _ERROR:
                raise value
            else:
                return
    finally:
        if not future.done():
            future.cancel()
            # The cancelled future settles at once; the producer's clean-up (a run giving its
            # lease back) runs on the loop afterwards, and is worth waiting for.
            finished.wait(timeout=_SHUTDOWN_S)


async def aiterate_on_loop(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """Iterate an async iterator that runs on the background loop, from any other loop.

    Items cross loops through ``call_soon_threadsafe`` as they are produced; closing this
    iterator early (or cancelling its consumer) cancels the producer.
    """
    if _on_portal_thread():
        async for item in stream:
            yield item
        return
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    def put(kind: int, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the consumer's loop is closed: nobody waits
            loop.call_soon_threadsafe(items.put_nowait, (kind, value))

    async def pump() -> None:
        try:
            async for item in stream:
                put(_ITEM, item)
        except asyncio.CancelledError:
            put(_END, None)
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_ERROR, exc)
        else:
            put(_END, None)

    future = _background_portal().start_task_soon(pump)
    try:
        while True:
            kind, value = await items.get()
            if kind == _ITEM:
                yield value
            elif kind == _ERROR:
                raise value
            else:
                return
    finally:
        if not future.done():
            future.cancel()
