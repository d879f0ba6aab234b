"""The supervisor of the runner's loops: the pure backoff decision (table) and its driver."""

from __future__ import annotations

import asyncio
import logging

import pytest

from chainrt.serve._supervise import Backoff, LoopHealth, Retry, after_failure, supervise


@pytest.mark.parametrize(
    ("failures_before", "expected"),
    [
        (0, Retry(0.05, log=True)),  # the first failure opens an outage: logged
        (1, Retry(0.1, log=False)),
        (2, Retry(0.2, log=False)),
        (4, Retry(0.8, log=False)),
        (5, Retry(1.0, log=False)),  # capped: back within 1 s of the backend
        (10_000, Retry(1.0, log=False)),  # no overflow after a long outage
    ],
)
def test_after_failure_doubles_the_pause_up_to_the_cap_and_logs_only_the_first(
    failures_before: int, expected: Retry
) -> None:
    assert after_failure(failures_before, Backoff(first_s=0.05, max_s=1.0)) == expected


def test_health_goes_down_on_a_failure_and_up_on_the_next_good_round() -> None:
    health = LoopHealth("take")
    assert health.up
    health.failed(ConnectionError("gone"))
    health.failed(ConnectionError("still gone"))
    assert not health.up
    assert health.failures == 2
    assert "take loop down" in health.describe()
    assert "still gone" in health.describe()
    health.ok()
    assert health.up
    assert health.failures == 0
    assert health.outages == 1


async def test_a_loop_that_raises_anything_is_started_again_and_logged_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Odd(Exception):  # inherits from nothing a loop would think of catching
        pass

    health = LoopHealth("take")
    rounds: list[str] = []

    async def body() -> None:
        rounds.append("start")
        if len(rounds) <= 4:
            raise Odd(f"failure {len(rounds)}")
        health.ok()  # a good round: the outage ends
        if len(rounds) == 5:
            raise Odd("a second outage")
        # the sixth start returns: the loop ended on its own

    with caplog.at_level(logging.DEBUG, logger="chainrt.serve"):
        await asyncio.wait_for(supervise(health, body), 30)
    assert len(rounds) == 6
    assert health.restarts == 5
    assert health.outages == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    failed = [m for m in warnings if "loop failed" in m]
    assert len(failed) == 2  # one line per outage, not one per retry
    assert "failure 1" in failed[0]
    assert "a second outage" in failed[1]
    assert any("working again" in m for m in warnings)


async def test_a_cancel_ends_the_supervised_loop() -> None:
    health = LoopHealth("orphans")

    async def body() -> None:
        await asyncio.sleep(3600)

    task = asyncio.ensure_future(supervise(health, body))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert health.restarts == 0
