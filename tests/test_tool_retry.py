"""Tool steps' retries: the dispatcher's retry decision (decide_retry) driven by tenacity.

Real tools on the real loop and real threads; only the tools' behaviour is scripted. Timing
checks are lower bounds (a wait that must have happened) or carry margins of seconds against a
backoff that must not have happened, which load on the machine cannot bridge.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from chainrt._run import run_tool

BACKOFF_MS = 100.0


async def _run(tool: Any, *, within_s: float, **retry: Any) -> Any:
    settings: dict[str, Any] = {
        "attempts": 3,
        "backoff_ms": BACKOFF_MS,
        "max_backoff_ms": 5000.0,
        "attempt_timeout_ms": None,
    }
    settings.update(retry)
    return await run_tool(
        tool, {}, run_id="r1", step_id="s1", deadline=time.time() + within_s, **settings
    )


async def test_failed_attempts_are_retried_after_a_doubling_backoff_capped_at_max() -> None:
    starts: list[float] = []

    def flaky() -> str:
        starts.append(time.monotonic())
        if len(starts) < 3:
            raise RuntimeError(f"failure {len(starts)}")
        return "third time"

    outcome = await _run(flaky, within_s=10, max_backoff_ms=150.0)
    assert (outcome.status, outcome.output, outcome.attempts) == ("completed", "third time", 3)
    assert [a.status for a in outcome.attempt_log] == ["error", "error", "ok"]
    detail = outcome.attempt_log[0].detail or ""
    assert detail.startswith("RuntimeError: failure 1 (at tests/test_tool_retry.py:")
    first_wait, second_wait = starts[1] - starts[0], starts[2] - starts[1]
    assert first_wait >= BACKOFF_MS / 1000  # 100 ms
    assert second_wait >= 0.15  # doubled to 200 ms, capped at max_backoff 150 ms


async def test_an_attempt_cut_by_attempt_timeout_is_retried_at_once() -> None:
    starts: list[float] = []

    async def hangs_once() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            await asyncio.sleep(60)
        return "second try"

    outcome = await _run(hangs_once, within_s=20, attempt_timeout_ms=200, backoff_ms=5000)
    assert (outcome.status, outcome.output, outcome.attempts) == ("completed", "second try", 2)
    assert [a.status for a in outcome.attempt_log] == ["timeout", "ok"]
    # At once, not after the 5 s backoff: the gap is the 0.2 s attempt timeout; 2.5 s of margin.
    assert starts[1] - starts[0] < 2.5


async def test_a_retry_that_does_not_fit_before_the_deadline_is_not_made() -> None:
    calls = 0

    def fails() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("no")

    started = time.time()
    outcome = await _run(fails, within_s=3, backoff_ms=10_000)
    assert (outcome.status, outcome.attempts, calls) == ("failed", 1, 1)
    assert (outcome.error or "").startswith("ValueError: no (at tests/test_tool_retry.py:")
    assert time.time() - started < 3  # it gave up at once instead of sleeping 10 s


async def test_tries_spent_on_attempt_timeouts_fail_the_step_before_its_deadline() -> None:
    async def hangs() -> None:
        await asyncio.sleep(60)

    outcome = await _run(hangs, within_s=20, attempts=2, attempt_timeout_ms=100)
    assert (outcome.status, outcome.attempts) == ("failed", 2)
    assert [a.status for a in outcome.attempt_log] == ["timeout", "timeout"]
    assert outcome.error is not None
    assert outcome.error.startswith("timed out after")


async def test_a_sync_tool_running_past_the_deadline_is_abandoned_and_timed_out() -> None:
    def sleeps() -> str:
        time.sleep(3)
        return "late"

    started = time.monotonic()
    outcome = await _run(sleeps, within_s=0.3, attempts=3)
    assert (outcome.status, outcome.attempts) == ("timed_out", 1)
    assert [a.status for a in outcome.attempt_log] == ["timeout"]
    assert time.monotonic() - started < 2.5  # abandoned at 0.3 s, not waited for (3 s)
