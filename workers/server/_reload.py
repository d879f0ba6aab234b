"""Hot reload (``POST /admin/reload``): a new engine beside the old one, swapped in atomically.

The worker serves through :class:`ServingEngines`: each generation leases the current engine
once its slot is granted and keeps that engine until its answer ends, so a swap never moves a
request that already started. :class:`ReloadManager` builds the new engine with the worker's
engine factory, loads it while the old one keeps serving, runs the readiness generation on it,
then swaps: requests that take their lease from then on get the new engine. The old engine is
retired (:meth:`~chainrt.engines.Engine.retire`): requests leased on it whose generation had not
started yet (queued behind the one it is generating) are handed back and run on the new engine
(:func:`generate_on`, :func:`stream_on`), so only generations already under way finish on the
old one, which is closed once its last lease is released. Readiness never changes. A new engine
that cannot load (bad path, out of memory) is closed and the old one keeps serving.

The names a client may use only grow: after a reload to ``served_model_name: v2`` requests for
``v1`` are still accepted (a client mid-rollout must not get 404) and answered by ``v2``, whose
name the response's ``model`` field carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chainrt.engines import Engine, EngineRetired, GenerationRequest, GenerationResult, StreamDelta
from chainrt.errors import EngineOOM, WorkerError

from ._health import HealthMonitor, probe_engine
from ._http import aclose
from ._metrics import WorkerMetrics
from ._recovery import RecoveryManager

__all__ = [
    "EngineFactory",
    "EngineLease",
    "ReloadError",
    "ReloadManager",
    "ReloadRequest",
    "ServedEngine",
    "ServingEngines",
    "generate_on",
    "stream_on",
]

log = logging.getLogger("chainrt.worker")

EngineFactory = Callable[[str | None, str | None], Engine]
"""``(model, served name) ->`` a new, not yet started engine of the worker's kind."""


@dataclass(eq=False)
class ServedEngine:
    """One loaded engine, the names it answers as, and how many requests hold it."""

    engine: Engine
    names: list[str]
    model: str | None
    """What it was loaded from (``--model`` or the reload body; None: the engine's default)."""
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no request holds this engine."""

    def __post_init__(self) -> None:
        self.idle.set()

    def answer_name(self, requested: str) -> str:
        """The ``model`` of a response: the requested name if this engine has it, else its own."""
        return requested if requested in self.names else self.names[0]


class EngineLease:
    """A request's hold on one engine; :meth:`release` once (later calls do nothing)."""

    __slots__ = ("_released", "served")

    def __init__(self, served: ServedEngine) -> None:
        self.served = served
        self._released = False
        served.inflight += 1
        served.idle.clear()

    @property
    def engine(self) -> Engine:
        """The engine this request runs on."""
        return self.served.engine

    def release(self) -> None:
        """The request is done with the engine (the last release lets a drained engine close)."""
        if self._released:
            return
        self._released = True
        self._let_go(self.served)

    def move_to(self, served: ServedEngine) -> None:
        """Hold ``served`` instead: the request had not started on the engine it held."""
        if self._released or served is self.served:
            return
        old, self.served = self.served, served
        served.inflight += 1
        served.idle.clear()
        self._let_go(old)

    @staticmethod
    def _let_go(served: ServedEngine) -> None:
        served.inflight -= 1
        if served.inflight == 0:
            served.idle.set()


class ServingEngines:
    """The engine new requests get, and every name the worker answers to."""

    def __init__(self, engine: Engine, names: list[str], model: str | None) -> None:
        self.current = ServedEngine(engine, list(names), model)
        self.names: list[str] = list(names)
        """Accepted model names: the current engine's first, then earlier ones (aliases)."""

    def lease(self) -> EngineLease:
        """Hold the current engine for one request."""
        return EngineLease(self.current)

    def swap(self, new: ServedEngine) -> ServedEngine:
        """Make ``new`` current; returns the engine it replaced."""
        old, self.current = self.current, new
        self.names = list(dict.fromkeys([*new.names, *self.names]))
        return old

    def hand_over(self, lease: EngineLease, retired: EngineRetired) -> None:
        """Move ``lease`` to the current engine after its engine handed the request back.

        Raises ``retired`` if the lease already holds the current engine (a current engine is
        never retired: that would be a bug, reported as the request's engine error).
        """
        if lease.served is self.current:
            raise retired
        log.debug("reload: a request queued on %s moves to %s", lease.served.names[0],
                  self.current.names[0])  # fmt: skip
        lease.move_to(self.current)


async def generate_on(
    engines: ServingEngines, lease: EngineLease, request: GenerationRequest
) -> GenerationResult:
    """Generate on the lease's engine; if a reload retired it first, on the engine after it."""
    while True:
        try:
            return await lease.engine.generate(request)
        except EngineRetired as retired:
            engines.hand_over(lease, retired)


async def stream_on(
    engines: ServingEngines, lease: EngineLease, request: GenerationRequest
) -> tuple[AsyncIterator[StreamDelta], StreamDelta]:
    """Start streaming on the lease's engine: the stream and its first delta.

    If a reload retired the engine before the generation started, the request starts again on
    the engine after it (the lease moves); the caller closes the returned stream.
    """
    while True:
        pieces = lease.engine.stream(request)
        try:
            return pieces, await anext(pieces)
        except EngineRetired as retired:
            await aclose(pieces)
            engines.hand_over(lease, retired)
        except BaseException:
            await aclose(pieces)
            raise


class ReloadRequest(BaseModel):
    """The body of ``POST /admin/reload`` (empty: reload the current model's weights)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, min_length=1, max_length=4096)
    """What to load: a GGUF file (local), an HF folder or id (vllm, torch). Omitted: the same."""
    served_model_name: str | None = Field(default=None, min_length=1, max_length=256)
    """The name the new model answers as (omitted: the current names)."""


class ReloadError(Exception):
    """A reload refused or failed; the old engine keeps serving."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class ReloadManager:
    """Runs one hot reload at a time (a second one meanwhile gets 409)."""

    def __init__(
        self,
        engines: ServingEngines,
        factory: EngineFactory,
        *,
        health: HealthMonitor,
        recovery: RecoveryManager,
        metrics: WorkerMetrics,
        probe_timeout_s: float,
    ) -> None:
        self._engines = engines
        self._factory = factory
        self._health = health
        self._recovery = recovery
        self._metrics = metrics
        self._probe_timeout_s = probe_timeout_s
        self._lock = asyncio.Lock()
        self._drain: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True from a reload's start until the engine it replaced is closed."""
        return self._lock.locked()

    async def reload(self, request: ReloadRequest) -> dict[str, Any]:
        """Load, probe and swap in the new engine; answers once it serves (409 if busy)."""
        if self._lock.locked():
            self._metrics.reloads.labels(outcome="busy").inc()
            raise ReloadError(
                409, "reload_in_progress", "a reload is already running; retry when it answers"
            )
        await self._lock.acquire()
        try:
            result = await self._load_and_swap(request)
        except BaseException:
            self._lock.release()
            raise
        return result

    async def close(self) -> None:
        """Server shutdown: finish closing a replaced engine."""
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain

    async def _load_and_swap(self, request: ReloadRequest) -> dict[str, Any]:
        started = time.perf_counter()
        old = self._engines.current
        model = request.model if request.model is not None else old.model
        names = [request.served_model_name] if request.served_model_name else list(old.names)
        engine = self._new_engine(model, names[0])
        log.info("reload: loading %s as %s beside the serving engine", model or "default", names)
        try:
            await engine.start()
        except (EngineOOM, MemoryError) as exc:
            await self._discard(engine, "oom")
            raise ReloadError(
                507,
                "insufficient_memory",
                f"the new model does not fit beside the serving one ({exc}); nothing changed",
            ) from None
        except WorkerError as exc:
            await self._discard(engine, "bad_model")
            raise ReloadError(400, "invalid_request_error", f"cannot load {model}: {exc}") from None
        loaded = time.perf_counter() - started
        probe = await probe_engine(engine, self._probe_timeout_s)
        if not probe.ok:
            await self._discard(engine, "probe_failed")
            raise ReloadError(
                500,
                "reload_failed",
                f"the new model loaded but its readiness generation failed ({probe.error}); "
                "the old model keeps serving",
            )
        try:  # the old engine's prompt cache, carried over: no cold first requests after swap
            await engine.warm_like(old.engine)
        except Exception as exc:  # best effort: a cold cache is slower, not wrong
            log.warning("reload: warming the new engine failed (%s); swapping anyway", exc)
        new = ServedEngine(engine, names, model)
        self._engines.swap(new)
        # Queued on the old engine, not started: handed back, they run on the new one.
        handed = old.engine.retire()
        self._health.use_engine(engine, probe)
        self._recovery.use_engine(engine)
        seconds = time.perf_counter() - started
        self._metrics.reloads.labels(outcome="ok").inc()
        self._metrics.reload_seconds.observe(seconds)
        draining = max(0, old.inflight - handed)
        log.info(
            "reload: %s serves (%.2fs); %d request(s) finish on %s before it closes, "
            "%d queued on it moved to the new model",
            names[0], seconds, draining, old.names[0], handed,
        )  # fmt: skip
        self._drain = asyncio.create_task(self._close_when_drained(old))
        return {
            "status": "reloaded",
            "model": names[0],
            "served_model_names": list(self._engines.names),
            "previous": old.names[0],
            "load_seconds": round(loaded, 3),
            "seconds": round(seconds, 3),
            "draining": draining,
            "handed_over": handed,
        }

    def _new_engine(self, model: str | None, name: str) -> Engine:
        try:
            return self._factory(model, name)
        except WorkerError as exc:
            self._metrics.reloads.labels(outcome="bad_model").inc()
            raise ReloadError(400, "invalid_request_error", f"cannot load {model}: {exc}") from None

    async def _discard(self, engine: Engine, outcome: str) -> None:
        self._metrics.reloads.labels(outcome=outcome).inc()
        with contextlib.suppress(Exception):
            await engine.close()

    async def _close_when_drained(self, old: ServedEngine) -> None:
        try:
            await old.idle.wait()
            await old.engine.close()
            log.info("reload: the replaced engine (%s) drained and closed", old.names[0])
        finally:
            self._lock.release()
