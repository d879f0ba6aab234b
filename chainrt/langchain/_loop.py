"""One private event-loop thread behind LangChain's sync entry points (invoke, stream, batch).

chainrt's async resources (a dispatcher's pooled HTTP client, a Redis connection) belong to the
loop that made them. Sync LangChain calls arrive on any thread: a fresh loop per call would rebuild
those resources every time, and the caller's own loop (if any) is blocked while it waits. So sync
calls hand their coroutine to one long-lived daemon loop and wait for it. The caller's context
variables (LangChain's run config, OpenTelemetry's current span) travel with the coroutine.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["iterate_sync", "on_loop", "on_shutdown", "run_sync"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_cleanups: list[Callable[[], Awaitable[None]]] = []
_SHUTDOWN_S = 5.0
"""How long the loop may take at interpreter exit to close what was opened on it."""


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="chainrt-langchain-loop", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
            atexit.register(_shutdown)
        return _loop


def _on_background_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def on_shutdown(cleanup: Callable[[], Awaitable[None]]) -> None:
    """Run ``cleanup()`` on the loop at interpreter exit (close dispatchers opened on it)."""
    with _lock:
        _cleanups.append(cleanup)


def _shutdown() -> None:
    global _loop, _thread
    with _lock:
        loop, thread, _loop, _thread = _loop, _thread, None, None
        cleanups = list(_cleanups)
        _cleanups.clear()
    if loop is None or thread is None:
        return

    async def close_all() -> None:
        for cleanup in cleanups:
            with contextlib.suppress(Exception):
                await cleanup()

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=_SHUTDOWN_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_SHUTDOWN_S)
    if not thread.is_alive():
        loop.close()


def _refuse_on_loop_thread(coro: Coroutine[Any, Any, Any]) -> None:
    if _on_background_thread():
        coro.close()
        raise RuntimeError(
            "a sync LangChain call (invoke/stream/batch) was made from code that runs on "
            "chainrt's own event loop; it would wait for itself — use ainvoke/astream/abatch there"
        )


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and block this thread until it ends.

    If the waiting thread is interrupted (KeyboardInterrupt), the coroutine is cancelled.
    """
    _refuse_on_loop_thread(coro)
    future = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


async def on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the background loop from any other loop (cancellation propagates)."""
    loop = _background_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


_ITEM, _END, _ERROR = 0, 1, 2


def iterate_sync(stream: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async iterator from sync code: it runs on the background loop.

    The producer runs ahead of the consumer (its items are small events); closing the returned
    iterator early cancels the producer and waits briefly for its clean-up.
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
    _refuse_on_loop_thread(coro)
    future = asyncio.run_coroutine_threadsafe(coro, _background_loop())
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
