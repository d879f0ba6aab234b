"""Fault injection for tests and drills; served only with ``--enable-fault-injection``.

``POST /admin/faults`` takes one JSON object; every key is optional and applied in this order:

* ``{"reset": true}`` — clear every fault (and release hung requests);
* ``{"oom": N}`` — the next N generations hit an out-of-memory error *inside the engine*, at the
  point where the engine's own OOM would surface (``Engine.faults``), so recovery runs exactly as
  for a real one;
* ``{"latency_ms": 300}`` — every request waits this long before entering the engine;
* ``{"error_rate": 0.05}`` — this share of requests fails with a 500 before the engine;
* ``{"hang": true}`` — requests are accepted and never answered, until a reset or their deadline.

``GET /admin/faults`` shows what is armed.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chainrt.engines import EngineFaults

__all__ = ["FaultInjector", "FaultsRequest", "InjectedError"]


class FaultsRequest(BaseModel):
    """Body of ``POST /admin/faults``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    reset: bool = False
    oom: int | None = Field(default=None, ge=0, le=1_000_000)
    latency_ms: float | None = Field(default=None, ge=0, le=600_000)
    error_rate: float | None = Field(default=None, ge=0, le=1)
    hang: bool | None = None


class InjectedError(Exception):
    """A request picked by ``error_rate``: answered with a 500."""


class FaultInjector:
    """The armed faults of one worker (HTTP-side ones here, engine-side ones in EngineFaults)."""

    def __init__(self, engine_faults: EngineFaults) -> None:
        self._engine_faults = engine_faults
        self.latency_ms = 0.0
        self.error_rate = 0.0
        self.hang = False
        self._released = asyncio.Event()

    def apply(self, change: FaultsRequest) -> dict[str, Any]:
        """Arm or clear faults; returns the state afterwards."""
        if change.reset:
            self._engine_faults.reset()
            self.latency_ms = self.error_rate = 0.0
            self._set_hang(False)
        if change.oom is not None:
            self._engine_faults.arm_oom(change.oom)
        if change.latency_ms is not None:
            self.latency_ms = change.latency_ms
        if change.error_rate is not None:
            self.error_rate = change.error_rate
        if change.hang is not None:
            self._set_hang(change.hang)
        return self.state()

    def state(self) -> dict[str, Any]:
        """What is armed now."""
        return {
            "oom": self._engine_faults.pending_oom,
            "latency_ms": self.latency_ms,
            "error_rate": self.error_rate,
            "hang": self.hang,
        }

    def _set_hang(self, on: bool) -> None:
        if on and not self.hang:
            self._released = asyncio.Event()
        elif not on and self.hang:
            self._released.set()  # every hung request goes on
        self.hang = on

    async def before_engine(self, deadline: float | None) -> None:
        """Apply latency, errors and hangs to one request (raises InjectedError / TimeoutError)."""
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        if self.error_rate > 0 and random.random() < self.error_rate:
            raise InjectedError("injected error (fault injection error_rate)")
        if self.hang:
            timeout = None if deadline is None else max(0.0, deadline - time.time())
            await asyncio.wait_for(self._released.wait(), timeout)
