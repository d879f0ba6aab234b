"""Readiness from a real generation, not a ping.

The probe asks the engine for a short deterministic answer ("Say OK", 2 tokens, temperature 0)
under a deadline. Ready means the last probe produced at least one token in time. The probe runs at
start-up, after every recovery, and every ``health_interval_s`` unless real traffic already proved
the engine generates (a request that finished with tokens within the interval is that proof, and
spares a busy engine a probe that would queue behind long generations and time out falsely). A
failed periodic probe hands the engine to recovery. The first answer is kept as a baseline: a later probe that answers differently
is reported (``matches_baseline: false``) — a sign of a corrupted model — without flapping
readiness, since batched engines may legitimately differ in the last digit of a logit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chainrt.engines import ChatMessage, Engine, GenerationRequest
from chainrt.errors import EngineDead, EngineOOM

from ._metrics import WorkerMetrics

__all__ = ["HealthMonitor", "ProbeResult", "probe_engine"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One readiness generation."""

    ok: bool
    text: str
    seconds: float
    at: float
    """Unix time it finished."""
    error: str | None = None
    failure: str | None = None
    """``oom``, ``engine_dead`` or ``error`` when the engine raised (None otherwise)."""


async def probe_engine(engine: Engine, timeout_s: float) -> ProbeResult:
    """One readiness generation on ``engine`` ("Say OK", 2 tokens, temperature 0, in time)."""
    request = GenerationRequest(
        messages=[ChatMessage("user", "Say OK")],
        max_tokens=2,
        temperature=0.0,
        seed=0,
        priority=0,
        request_id="readiness-probe",
        deadline=time.time() + timeout_s,
    )
    started = time.perf_counter()
    error: str | None = None
    failure: str | None = None
    text = ""
    try:
        # The engine honours the deadline; wait_for guards an engine that does not.
        result = await asyncio.wait_for(engine.generate(request), timeout_s + 1)
        text = result.text
        if result.completion_tokens < 1:
            error = f"no token within {timeout_s}s ({result.finish_reason})"
    except Exception as exc:  # any failure of the engine is a failed probe
        error = f"{type(exc).__name__}: {exc}"
        failure = (
            "oom"
            if isinstance(exc, EngineOOM)
            else "engine_dead"
            if isinstance(exc, EngineDead)
            else "error"
        )
    seconds = time.perf_counter() - started
    return ProbeResult(error is None, text, seconds, time.time(), error, failure)


class HealthMonitor:
    """Tracks readiness; runs the probe generation."""

    def __init__(self, engine: Engine, metrics: WorkerMetrics, *, timeout_s: float) -> None:
        self._engine = engine
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._ready = asyncio.Event()
        self.reason: str | None = "starting"
        """Why the worker is not ready (None when ready)."""
        self.last: ProbeResult | None = None
        self.baseline: str | None = None
        self.probes = 0
        self._last_success = 0.0  # time.monotonic() of the last generation that produced tokens

    @property
    def ready(self) -> bool:
        """True when the last probe passed and no failure happened since."""
        return self._ready.is_set()

    def note_success(self) -> None:
        """A real request just produced tokens: the engine works (defers the next probe)."""
        self._last_success = time.monotonic()

    def mark_not_ready(self, reason: str) -> None:
        """An engine failure happened: refuse work until a probe passes again."""
        self._ready.clear()
        self.reason = reason
        self._metrics.ready.set(0)

    async def wait_ready(self, max_wait_s: float) -> bool:
        """Wait up to ``max_wait_s`` seconds for readiness; True if ready."""
        if self._ready.is_set():
            return True
        if max_wait_s <= 0:
            return False
        try:
            await asyncio.wait_for(self._ready.wait(), max_wait_s)
        except TimeoutError:
            return False
        return True

    @property
    def engine(self) -> Engine:
        """The engine the probe exercises."""
        return self._engine

    def use_engine(self, engine: Engine, first: ProbeResult) -> None:
        """A hot reload swapped engines: probe ``engine`` from now on.

        ``first`` is the new engine's passing probe (run before the swap); it becomes the last
        probe and the new baseline, and readiness is not touched (it never drops in a reload).
        """
        self._engine = engine
        self.last = first
        self.baseline = first.text
        self.probes += 1
        self.note_success()

    async def probe(self) -> ProbeResult:
        """Run the readiness generation; set ready or not-ready from its outcome."""
        outcome = await probe_engine(self._engine, self._timeout_s)
        if outcome.failure == "oom":
            self._metrics.oom_events.inc()
        elif outcome.failure == "engine_dead":
            self._metrics.engine_dead_events.inc()
        self.probes += 1
        self.last = outcome
        if outcome.ok:
            self.note_success()
            if self.baseline is None:
                self.baseline = outcome.text
            self.reason = None
            self._ready.set()
            self._metrics.ready.set(1)
        else:
            self.mark_not_ready(f"readiness generation failed: {outcome.error}")
        return outcome

    async def run_periodically(
        self, interval_s: float, on_failure: Callable[[str], Awaitable[None] | None]
    ) -> None:
        """Probe every ``interval_s`` while ready; a failure goes to ``on_failure`` (recovery)."""
        while True:
            await asyncio.sleep(interval_s)
            if not self.ready:
                continue  # recovery owns the engine now and probes when it is done
            if time.monotonic() - self._last_success < interval_s:
                continue  # traffic proved the engine generates since the last look
            outcome = await self.probe()
            if not outcome.ok:
                pending = on_failure(outcome.error or "readiness generation failed")
                if pending is not None:
                    await pending

    def snapshot(self) -> dict[str, Any]:
        """The JSON body of ``/health/ready``."""
        last = self.last
        return {
            "status": "ready" if self.ready else "not_ready",
            "reason": self.reason,
            "engine": self._engine.name,
            "model": self._engine.model_name,
            "probe": None
            if last is None
            else {
                "ok": last.ok,
                "text": last.text,
                "ms": round(last.seconds * 1000, 2),
                "at": last.at,
                "error": last.error,
                "matches_baseline": self.baseline is not None and last.text == self.baseline,
            },
            "probes": self.probes,
            "engine_state": self._engine.state(),
        }
