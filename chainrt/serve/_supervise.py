"""Supervised background loops of ``chainrt serve``: a loop that fails is started again.

A runner's loops (take, orphans, maintenance) talk to Redis all the time, and Redis goes away:
a dropped connection, a restart, a pause. A loop that ends on the first exception it did not
expect stops the runner silently. Here every loop runs under :func:`supervise`, which starts it
again after any exception with a growing pause, logs the outage once (when it starts, and when
the loop is back), and keeps a :class:`LoopHealth` that ``/health/ready`` and ``/metrics`` read.

The decision (how long to wait, whether to log) is :func:`after_failure`, a pure function with a
table test; :func:`supervise` is the thin driver around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Backoff", "LoopHealth", "Retry", "after_failure", "supervise"]

log = logging.getLogger("chainrt.serve")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses between restarts of a failing loop: ``first_s`` doubled per failure in a row, at
    most ``max_s``. ``max_s`` bounds how long after the backend answers again the loop works
    again (the goal is a fleet taking runs within 2 s of Redis coming back)."""

    first_s: float = 0.05
    max_s: float = 1.0

    def delay(self, failures: int) -> float:
        """The pause after the ``failures``-th failure in a row (1 for the first)."""
        return float(min(self.max_s, self.first_s * 2 ** max(0, min(failures, 32) - 1)))


@dataclass(frozen=True, slots=True)
class Retry:
    """What to do after a failure: wait ``delay_s``; ``log`` when this failure opens an
    outage (the loop was up), so that a long outage is one line and not one per retry."""

    delay_s: float
    log: bool


def after_failure(failures_before: int, backoff: Backoff) -> Retry:
    """The decision after a loop failed, given how many failures in a row came before."""
    failures = failures_before + 1
    return Retry(backoff.delay(failures), log=failures_before == 0)


@dataclass(slots=True)
class LoopHealth:
    """Where one supervised loop stands (read by health and metrics)."""

    name: str
    failures: int = 0
    """Failures in a row (0 while the loop works)."""
    restarts: int = 0
    """Times the loop was started again after a failure, since the process started."""
    down_since: float | None = None
    """Monotonic time of the first failure of the current outage; None while up."""
    last_error: str = ""
    outages: int = 0
    """Outages since the process started (a run of failures ended by a good round)."""

    @property
    def up(self) -> bool:
        """True unless the loop failed and has not yet got through a round since."""
        return self.down_since is None

    def ok(self) -> None:
        """The loop got through a round that talked to its backend: the outage (if any) ends.

        Cheap (no I/O): loops call it once per round."""
        if self.down_since is None:
            return
        log.warning(
            "%s loop working again after %.1fs (%d retries)",
            self.name,
            time.monotonic() - self.down_since,
            self.failures,
        )
        self.down_since = None
        self.failures = 0

    def failed(self, exc: BaseException) -> Retry:
        """Count a failure; the retry to make."""
        retry = after_failure(self.failures, BACKOFF)
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.outages += 1
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        return retry

    def describe(self) -> str:
        """One line for ``/health/ready`` while the loop is down."""
        if self.down_since is None:
            return f"{self.name} loop up"
        down = time.monotonic() - self.down_since
        return f"{self.name} loop down for {down:.1f}s ({self.failures} retries): {self.last_error}"


BACKOFF = Backoff()


async def supervise(health: LoopHealth, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` until it returns, starting it again after any exception (cancellation
    excepted) as :func:`after_failure` decides. ``body`` calls ``health.ok()`` after each round
    that reached its backend."""
    while True:
        try:
            await body()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry = health.failed(exc)
            if retry.log:
                log.warning(
                    "%s loop failed (%s: %s); retrying with backoff until it works again",
                    health.name,
                    type(exc).__name__,
                    exc,
                )
            else:
                log.debug("%s loop failed again: %s", health.name, exc)
        health.restarts += 1
        await asyncio.sleep(retry.delay_s)
