"""In-process recovery after an engine failure: no process restart.

On ``EngineOOM`` or ``EngineDead`` the request that hit it fails alone (503 + ``Retry-After``,
answered by the caller at once); here the worker marks itself not-ready, awaits
``engine.recover()`` (free memory / restart the engine core), runs the readiness generation and is
ready again. One recovery at a time: failures during a recovery join it. The time from the failure
to ready again lands in ``chainrt_worker_recovery_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from chainrt.engines import Engine
from chainrt.errors import EngineDead, EngineOOM

from ._health import HealthMonitor
from ._metrics import WorkerMetrics

__all__ = ["RecoveryManager"]

log = logging.getLogger("chainrt.worker")

_BACKOFF_S = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)
"""Pause before each recovery attempt; the last value repeats until the engine comes back."""


class RecoveryManager:
    """Brings the engine back after a failure, one recovery at a time."""

    def __init__(self, engine: Engine, health: HealthMonitor, metrics: WorkerMetrics) -> None:
        self._engine = engine
        self._health = health
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self.last_seconds: float | None = None
        """Duration of the last completed recovery."""

    @property
    def recovering(self) -> bool:
        """True while a recovery runs."""
        return self._task is not None and not self._task.done()

    def use_engine(self, engine: Engine) -> None:
        """A hot reload swapped engines: recover ``engine`` from now on."""
        self._engine = engine

    def retry_after_s(self) -> int:
        """What to put in ``Retry-After`` while recovering (whole seconds, at least 1).

        The engine's own estimate when it has one (vLLM: the last swap to its standby core, or
        how long building an engine core took), else the last recovery's duration, else 1.
        """
        seconds = self._engine.recovery_estimate_s() or self.last_seconds or 1.0
        return max(1, math.ceil(seconds))

    def engine_failed(self, exc: BaseException) -> None:
        """Count the failure and start recovering (joins a recovery already under way)."""
        if isinstance(exc, EngineOOM):
            self._metrics.oom_events.inc()
            cause = "oom"
        elif isinstance(exc, EngineDead):
            self._metrics.engine_dead_events.inc()
            cause = "engine_dead"
        else:
            cause = "probe_failed"
        self.start(cause, f"recovering from {cause}: {exc}")

    def start(self, cause: str, reason: str) -> None:
        """Mark not-ready and run a recovery in the background unless one is running."""
        self._health.mark_not_ready(reason)
        if not self.recovering:
            self._task = asyncio.create_task(self._recover(cause, time.perf_counter()))

    async def probe_failed(self, error: str) -> None:
        """Hook for the periodic readiness probe: recover and wait until done."""
        self.start("probe_failed", f"recovering after a failed readiness generation: {error}")
        if self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Stop a recovery in progress (server shutdown)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _recover(self, cause: str, started: float) -> None:
        attempt = 0
        while True:
            await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
            attempt += 1
            try:
                await self._engine.recover()
            except Exception as exc:  # keep trying: the worker must come back by itself
                log.warning("engine recovery attempt %d failed: %s", attempt, exc)
                continue
            outcome = await self._health.probe()
            if outcome.ok:
                self.last_seconds = time.perf_counter() - started
                self._metrics.recovery_seconds.observe(self.last_seconds)
                self._metrics.recoveries.labels(cause=cause).inc()
                log.info("engine recovered from %s in %.3fs", cause, self.last_seconds)
                return
            log.warning("readiness generation after recovery failed: %s", outcome.error)
