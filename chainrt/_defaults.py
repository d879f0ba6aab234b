"""The process-wide default runtimes behind ``chain.run``/``arun`` and ``chainrt.resume`` (§11).

Calling ``chain.arun`` in a loop must pay no per-run set-up, and breakers must remember across
runs, so the runtime those calls use is kept: one per (store, pool, settings, event loop). It
belongs to the loop that opened it (its connections do), and it is closed on that loop when the
loop shuts down: a small async generator registered with the loop is finalised by
``loop.shutdown_asyncgens()`` — which ``asyncio.run`` and every runner call — and closes it.

The sync ``chain.run`` has no loop of its own to keep, so its runs go to one private background
loop (a thread, started on first use): every sync call reuses that loop's runtime.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from ._runtime import PoolLike, Runtime, StoreLike

__all__ = ["default_runtime", "run_sync"]

T = TypeVar("T")

_MAX_PER_LOOP = 8
"""Default runtimes kept per loop (least recently used closed first): tests that change the
working directory or settings for each case must not pile up open stores."""


class _Entry:
    """A default runtime and the async generator that closes it when its loop shuts down."""

    __slots__ = ("closer", "runtime")

    def __init__(self, runtime: Runtime, closer: AsyncGenerator[None, None]) -> None:
        self.runtime = runtime
        self.closer = closer  # kept alive here: the loop only holds it weakly


_by_loop: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, OrderedDict[tuple[Any, ...], _Entry]
] = weakref.WeakKeyDictionary()


async def _close_at_loop_end(
    entries: OrderedDict[tuple[Any, ...], _Entry], key: tuple[Any, ...], runtime: Runtime
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        entry = entries.get(key)
        if entry is not None and entry.runtime is runtime:
            del entries[key]
        await runtime.aclose()


def _key(store: StoreLike, pool: PoolLike) -> tuple[Any, ...]:
    # Objects passed in are kept by identity (the runtime holds them, so ids are not reused);
    # URLs and paths with the working directory (a relative sqlite path names another file
    # elsewhere) and the settings that shape a runtime.
    # The settings are read from CHAINRT_* variables only: those variables are their key
    # (building the Settings object on every call would cost more than the rest of the lookup).
    store_key = store if store is None or isinstance(store, str) else id(store)
    pool_key = pool if pool is None or isinstance(pool, str) else id(pool)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith("CHAINRT_")))
    return (store_key, pool_key, os.getcwd(), env)


async def default_runtime(store: StoreLike = None, pool: PoolLike = None) -> Runtime:
    """The running loop's default runtime for (store, pool), opened on first use."""
    loop = asyncio.get_running_loop()
    key = _key(store, pool)
    entries = _by_loop.setdefault(loop, OrderedDict())
    entry = entries.get(key)
    if entry is not None:
        entries.move_to_end(key)
        return entry.runtime
    runtime = Runtime(store, pool)
    await runtime.open()
    closer = _close_at_loop_end(entries, key, runtime)
    await closer.__anext__()  # registers it with the loop's async-generator finaliser
    entries[key] = _Entry(runtime, closer)
    while len(entries) > _MAX_PER_LOOP:
        _, old = entries.popitem(last=False)
        with contextlib.suppress(Exception):
            await old.closer.aclose()
    return runtime


# -- the sync API's background loop -------------------------------------------------------------

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_SHUTDOWN_S = 5.0


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="chainrt-sync-loop", daemon=True
            )
            thread.start()
            _loop, _thread = loop, thread
            atexit.register(_shutdown)
        return _loop


def _shutdown() -> None:
    global _loop, _thread
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
    if loop is None or thread is None:
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(_SHUTDOWN_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_SHUTDOWN_S)
    if not thread.is_alive():
        loop.close()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and wait for it (KeyboardInterrupt cancels it)."""
    loop = _background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError(
            "chain.run (sync) was called from code running on chainrt's own loop; "
            "use await chain.arun(...) there"
        )
    future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
