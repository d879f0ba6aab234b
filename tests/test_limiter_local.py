"""The in-process limiter (embedded mode) against the shared conformance suite, plus its extras."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

from chainrt.concurrency import KeyRequest, Limiter, LocalLimiter, open_limiter
from chainrt.testing.limiter_conformance import LimiterConformance


class TestLocalLimiter(LimiterConformance):
    """Every conformance test, on a fresh LocalLimiter."""

    @pytest.fixture
    async def limiter(self) -> AsyncIterator[Limiter]:
        lim = LocalLimiter()
        yield lim
        await lim.close()


def test_public_names_are_pinned() -> None:
    import chainrt.concurrency as concurrency

    assert sorted(concurrency.__all__) == [
        "Holding",
        "KeyRequest",
        "KeyState",
        "Limiter",
        "LocalLimiter",
        "RedisLimiter",
        "SQLiteLimiter",
        "open_limiter",
    ]
    assert all(getattr(concurrency, name) is not None for name in concurrency.__all__)


async def test_in_memory_stores_share_one_process_wide_limiter() -> None:
    first = open_limiter("sqlite:///:memory:")
    assert isinstance(first, LocalLimiter)
    assert open_limiter("sqlite:///:memory:") is first
    await first.close()  # a no-op: the shared instance keeps working
    holding = await first.acquire([KeyRequest("k", 1)], timeout_s=0, holder="h")
    await holding.release()


def test_limits_hold_across_event_loops_in_threads() -> None:
    """Sync entry points run their own loops in threads; one LocalLimiter serves them all."""
    limiter = LocalLimiter()
    key = KeyRequest("user:u1", 2)
    lock = threading.Lock()
    intervals: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    async def work(name: str) -> None:
        for _ in range(15):
            async with await limiter.acquire([key], timeout_s=10, holder=name):
                enter = time.monotonic()
                await asyncio.sleep(0.002)
                with lock:
                    intervals.append((enter, time.monotonic()))

    def thread_main(name: str) -> None:
        try:
            asyncio.run(work(name))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(intervals) == 60
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    assert peak == 2
