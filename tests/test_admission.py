"""Admission: the pure memory decision (table) and the priority queue of engine slots."""

from __future__ import annotations

import asyncio

import pytest

from chainrt.engines import MemoryStats
from workers.server import (
    AdmissionQueue,
    Admit,
    NeverFits,
    QueueFull,
    RetryLater,
    capacity_tokens,
    decide,
)

KV = 1000  # bytes per token
GB = MemoryStats(total_bytes=10_000 * KV, free_bytes=10_000 * KV, kv_bytes_per_token=KV)
HALF_USED = MemoryStats(total_bytes=10_000 * KV, free_bytes=5_000 * KV, kv_bytes_per_token=KV)
CTX_2K = MemoryStats(
    total_bytes=10_000 * KV,
    free_bytes=10_000 * KV,
    kv_bytes_per_token=KV,
    extra={"context_tokens": 2048.0},
)

# (case, stats, prompt, max_tokens, watermark, reserved tokens, expected kind, advice max_tokens)
TABLE = [
    ("fits easily", GB, 100, 100, 0.85, 0, Admit, None),
    ("exactly at the watermark", GB, 8000, 500, 0.85, 0, Admit, None),
    ("one token over the watermark forever", GB, 8000, 501, 0.85, 0, NeverFits, 500),
    ("prompt alone never fits", GB, 8500, 1, 0.85, 0, NeverFits, None),
    ("half used: fits in what is left", HALF_USED, 1000, 1000, 0.85, 0, Admit, None),
    ("half used: too big now", HALF_USED, 1000, 3000, 0.85, 0, RetryLater, 2500),
    ("reservations count as used", GB, 1000, 1000, 0.85, 7000, RetryLater, 500),
    ("nothing fits now: advise what fits later", GB, 1000, 1000, 0.85, 8400, RetryLater, 1000),
    ("watermark 1.0 uses everything", GB, 5000, 5000, 1.0, 0, Admit, None),
    ("context caps a request", CTX_2K, 1000, 1049, 0.85, 0, NeverFits, 1048),
    ("context fits", CTX_2K, 1000, 1048, 0.85, 0, Admit, None),
    ("engine cannot tell", None, 10**6, 10**6, 0.85, 0, Admit, None),
]


@pytest.mark.parametrize(
    ("case", "stats", "prompt", "max_tokens", "watermark", "reserved", "kind", "advice"),
    TABLE,
    ids=[row[0] for row in TABLE],
)
def test_decide(
    case: str,
    stats: MemoryStats | None,
    prompt: int,
    max_tokens: int,
    watermark: float,
    reserved: int,
    kind: type,
    advice: int | None,
) -> None:
    decision = decide(
        stats,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        watermark=watermark,
        reserved_bytes=reserved * KV,
    )
    assert type(decision) is kind
    if isinstance(decision, Admit):
        expected = 0 if stats is None else (prompt + max_tokens) * KV
        assert decision.reserve_bytes == expected
    elif isinstance(decision, RetryLater):
        assert decision.advice_max_tokens == advice
        assert 0.1 <= decision.retry_after_s <= 60
        assert f"lower max_tokens to {advice}" in decision.message
    else:
        assert isinstance(decision, NeverFits)
        assert decision.advice_max_tokens == advice
        assert "never fit" in decision.message or "shorten the prompt" in decision.message


def test_advice_is_admitted() -> None:
    """Asking for the max_tokens the advice names is admitted (never-fits advice: when idle)."""
    cases = [(HALF_USED, 1000, 3000, 0), (GB, 300, 7000, 2000), (GB, 300, 9000, 0)]
    for stats, prompt, want, reserved in cases:
        first = decide(
            stats, prompt_tokens=prompt, max_tokens=want, watermark=0.85,
            reserved_bytes=reserved * KV,
        )  # fmt: skip
        assert isinstance(first, RetryLater | NeverFits)
        assert first.advice_max_tokens is not None
        again = decide(
            stats, prompt_tokens=prompt, max_tokens=first.advice_max_tokens, watermark=0.85,
            reserved_bytes=reserved * KV,
        )  # fmt: skip
        assert isinstance(again, Admit)


def test_retry_after_grows_with_the_shortfall() -> None:
    small = decide(HALF_USED, prompt_tokens=10, max_tokens=3600, watermark=0.85)
    large = decide(
        HALF_USED, prompt_tokens=10, max_tokens=3600, watermark=0.85, reserved_bytes=3000 * KV
    )
    assert isinstance(small, RetryLater)
    assert isinstance(large, RetryLater)
    assert small.retry_after_s < large.retry_after_s
    slow = decide(
        HALF_USED, prompt_tokens=10, max_tokens=3600, watermark=0.85, drain_tokens_per_s=1
    )
    assert isinstance(slow, RetryLater)
    assert slow.retry_after_s == 60  # capped


async def test_free_slot_is_taken_at_once() -> None:
    queue = AdmissionQueue(slots=2, max_waiting=10)
    a = await queue.acquire(3)
    b = await queue.acquire(3)
    assert (queue.in_use, queue.depth) == (2, 0)
    a.release()
    a.release()  # idempotent
    assert queue.in_use == 1
    b.release()
    assert queue.in_use == 0


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=10)
    holder = await queue.acquire(2)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        slot = await queue.acquire(priority)
        order.append(name)
        await asyncio.sleep(0)
        slot.release()

    tasks = []
    for name, priority in [("low1", 3), ("normal", 2), ("low2", 3), ("critical", 0), ("high", 1)]:
        tasks.append(asyncio.create_task(wait(name, priority)))
        await asyncio.sleep(0)
    assert queue.depth == 5
    holder.release()
    await asyncio.gather(*tasks)
    assert order == ["critical", "high", "normal", "low1", "low2"]
    assert (queue.in_use, queue.depth) == (0, 0)


async def test_queue_full_and_timeout() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=1)
    holder = await queue.acquire(2)
    waiter = asyncio.create_task(queue.acquire(2))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match="1 requests are already waiting"):
        await queue.acquire(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    with pytest.raises(TimeoutError):
        await queue.acquire(2, max_wait_s=0.01)
    assert queue.depth == 0
    holder.release()
    assert queue.in_use == 0  # no cancelled or timed-out waiter kept the slot


async def test_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=10)
    holder = await queue.acquire(2)
    first = asyncio.create_task(queue.acquire(0))
    second = asyncio.create_task(queue.acquire(1))
    await asyncio.sleep(0)
    holder.release()  # hands the slot to `first`, which has not resumed yet
    first.cancel()  # ... and is cancelled before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await asyncio.wait_for(second, 1)
    assert queue.in_use == 1
    slot.release()
    assert queue.in_use == 0


async def test_reservations_are_returned_with_the_slot() -> None:
    queue = AdmissionQueue(slots=2, max_waiting=0)
    a = await queue.acquire(2)
    b = await queue.acquire(2)
    queue.reserve(a, 500)
    queue.reserve(b, 300)
    assert queue.reserved_bytes == 800
    a.release()
    assert queue.reserved_bytes == 300
    b.release()
    assert queue.reserved_bytes == 0


def test_capacity_tokens() -> None:
    assert capacity_tokens(GB, 0.85) == 8500
    assert capacity_tokens(CTX_2K, 0.85) == 2048
    assert capacity_tokens(CTX_2K, 0.1) == 1000
    assert capacity_tokens(None, 0.85) is None
