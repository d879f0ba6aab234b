"""The fleet's side of the HTTP API: dead letters (``/v1/dlq``, the ``admin`` scope), where the
fleet stands (``/v1/fleet``: loops, served chains, runs no live runner serves), the fleet's
metrics, and Redis errors answered as 503 JSON rather than a plain-text 500."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge

from ._service import Service

__all__ = ["FleetMetrics", "fleet_routes", "handle_backend_errors"]


def _missing(dead_id: str) -> JSONResponse:
    body = {"type": "dead_letter_not_found", "message": f"no dead letter {dead_id!r}"}
    return JSONResponse({"error": body}, status_code=404)


def fleet_routes(service: Service) -> APIRouter:
    """``/v1/dlq`` (list, show, retry, drop) and ``/v1/fleet``."""
    router = APIRouter()

    @router.get("/v1/dlq")
    async def dead_letters(limit: int = Query(100, ge=1, le=1000)) -> list[dict[str, Any]]:
        """Entries whose handling failed for good, oldest first, with the reason."""
        return [letter.to_dict() for letter in await service.queue.dead_letters(limit)]

    @router.get("/v1/dlq/{dead_id}")
    async def dead_letter(dead_id: str) -> Any:
        """One dead letter."""
        letter = await service.queue.dead_letter(dead_id)
        return _missing(dead_id) if letter is None else letter.to_dict()

    @router.post("/v1/dlq/{dead_id}/retry")
    async def retry(dead_id: str) -> Any:
        """Queue the letter's run again (as a resume) and remove the letter."""
        letter = await service.queue.retry_dead(dead_id)
        return _missing(dead_id) if letter is None else {"retried": letter.to_dict()}

    @router.post("/v1/dlq/{dead_id}/drop")
    async def drop(dead_id: str) -> Any:
        """Remove the letter (its run stays as it is)."""
        letter = await service.queue.drop_dead(dead_id)
        return _missing(dead_id) if letter is None else {"dropped": letter.to_dict()}

    @router.get("/v1/fleet")
    async def fleet() -> dict[str, Any]:
        """This runner's loops, the chains live runners serve, and the queued runs of chains
        that no live runner serves (they wait until one does)."""
        served = await service.served_chains()
        depths = await service.queue.depth()
        unserved: dict[str, int] = {}
        if served is not None:
            for depth in depths:
                if depth.chain and depth.chain not in served and depth.waiting:
                    unserved[depth.chain] = unserved.get(depth.chain, 0) + depth.waiting
        return {
            "consumer": service.consumer,
            "chains": sorted(service.chains),
            "served": None if served is None else sorted(served),
            "unserved": [{"chain": c, "waiting": n} for c, n in sorted(unserved.items())],
            "loops": {
                name: {"up": h.up, "restarts": h.restarts, "error": h.last_error}
                for name, h in service.loops.items()
            },
            "dead_lettered_here": service.dead_lettered,
        }

    return router


class FleetMetrics:
    """Supervised loops (up, restarts), dead letters and runs no live runner serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.loop_up = Gauge(
            "chainrt_serve_loop_up",
            "1 while a background loop of this runner works, 0 while it is down.",
            ["loop"],
            registry=registry,
        )
        self.loop_restarts = Counter(
            "chainrt_serve_loop_restarts",
            "Times a background loop was started again after a failure.",
            ["loop"],
            registry=registry,
        )
        self.dead_letters = Gauge(
            "chainrt_queue_dead_letters", "Entries in the dead-letter stream.", registry=registry
        )
        self.dead_lettered = Counter(
            "chainrt_queue_dead_lettered",
            "Entries this runner moved to the dead letters.",
            registry=registry,
        )
        self.unserved = Gauge(
            "chainrt_queue_unserved_runs",
            "Queued runs of a chain that no live runner serves.",
            ["chain"],
            registry=registry,
        )
        self._counted: dict[str, int] = {}

    async def update(self, service: Service) -> None:
        """Read the service's state (at scrape time)."""
        for name, health in service.loops.items():
            self.loop_up.labels(loop=name).set(1 if health.up else 0)
            self._bump(self.loop_restarts.labels(loop=name), f"loop:{name}", health.restarts)
        self._bump(self.dead_lettered, "dead", service.dead_lettered)
        self.dead_letters.set(await service.queue.dead_count())
        served = await service.served_chains()
        if served is None:
            return
        waiting: dict[str, int] = {}
        for depth in await service.queue.depth():
            if depth.chain and depth.chain not in served:
                waiting[depth.chain] = waiting.get(depth.chain, 0) + depth.waiting
        for chain, count in waiting.items():
            self.unserved.labels(chain=chain).set(count)

    def _bump(self, counter: Any, key: str, total: int) -> None:
        seen = self._counted.get(key, 0)
        if total > seen:
            counter.inc(total - seen)
            self._counted[key] = total


def handle_backend_errors(app: FastAPI) -> None:
    """Redis errors that reach a handler (a dropped connection, Redis restarting) answer 503
    JSON: the request may be sent again."""
    try:
        from redis import exceptions as rx
    except ImportError:  # pragma: no cover - no Redis, no Redis errors
        return

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        body = {"type": "store_unavailable", "message": f"Redis: {type(exc).__name__}: {exc}"}
        return JSONResponse({"error": body}, status_code=503)

    app.add_exception_handler(rx.RedisError, unavailable)
