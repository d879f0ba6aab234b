"""The HTTP API of ``chainrt serve`` (docs/serve.md) on FastAPI (Starlette + uvicorn underneath,
as the worker's server).

:func:`create_app` builds the ASGI app around a :class:`~chainrt.serve.Service`; ``routes``
adds more (the dashboard mounts ``/ui/`` that way). Errors are one JSON shape,
``{"error": {"type", "message", "field"?}}``; a bad body is a 422 whose message names the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from .._api_tokens import load_tokens
from .._durations import parse_budget_ms
from .._errors import ChainRTError, RunNotFound
from .._records import RunRecord
from .._settings import get_settings
from ._answers import error, failure
from ._body import CheckedJSONRoute
from ._detail import run_detail
from ._direct import Direct, wait_seconds
from ._fleet_api import FleetMetrics, fleet_routes, handle_backend_errors
from ._guard import AccessPolicy, Guard
from ._listing import BadCursor, list_page
from ._metrics import ConnectionMetrics, ServeMetrics
from ._models import (
    ChainInfo,
    ErrorBody,
    ResumeRequest,
    RunAccepted,
    RunSummary,
    ServeConfig,
    SubmitRequest,
)
from ._service import Service
from ._signal_api import add_signal_route
from ._streams import CappedStream

__all__ = ["access_policy", "create_app"]

_KEEPALIVE_S = 15.0
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    422: {"model": ErrorBody},
}


_GET_RUN_PARAMETERS: dict[str, Any] = {
    "parameters": [
        {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}},
        {
            "name": "wait",
            "in": "query",
            "required": False,
            "description": 'Wait until the run is final: "10s".',
            "schema": {"type": "string"},
        },
    ]
}


def access_policy(config: ServeConfig) -> AccessPolicy:
    """The checks ``config`` asks for (``--tokens`` or ``CHAINRT_API_TOKENS``,
    ``--allowed-host``, ``--max-body``); InputError for a bad token file or line."""
    env = get_settings().api_tokens
    tokens = load_tokens(config.tokens, env.get_secret_value() if env is not None else None)
    hosts = list(config.allowed_hosts)
    if config.host not in ("0.0.0.0", "::", ""):
        hosts.append(config.host)  # the address it listens on names it too
    return AccessPolicy.build(tokens, hosts, config.max_body)


def _bad_field(field: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", field), "msg": message, "type": "value_error"}])


def _too_many_streams(limit: int) -> JSONResponse:
    message = f"{limit} event streams are open on this server (--max-streams); try again later"
    answer = error(429, "too_many_streams", message)
    answer.headers["Retry-After"] = "5"
    return answer


async def _summary(service: Service, run: RunRecord) -> RunSummary:
    """A list row; its ``reason``: why a queued run waits (no live runner serves its chain),
    else the run's error (the reason a refused or dead-lettered run failed)."""
    reason = run.error
    if run.status == "queued":
        reason = await service.waiting_reason(run.chain) or reason
    return RunSummary(
        run_id=run.run_id,
        chain=run.chain,
        status=run.status,
        budget={"total_ms": run.budget_total_ms, "used_ms": run.budget_used_ms},
        created_at=run.created_at,
        updated_at=run.updated_at,
        reason=reason,
    )


def create_app(
    service: Service,
    *,
    routes: Sequence[BaseRoute] = (),
    manage: bool = True,
    policy: AccessPolicy | None = None,
) -> FastAPI:
    """The ASGI app of ``service``. ``routes`` are added as they are; with ``manage`` the app's
    lifespan starts the service and stops (drains) it. Every request passes ``policy``'s checks
    (default: :func:`access_policy` of the service's options; docs/security.md)."""
    metrics = ServeMetrics()
    fleet_metrics = FleetMetrics(metrics.registry)
    connection_metrics = ConnectionMetrics(metrics.registry)
    policy = policy if policy is not None else access_policy(service.config)
    max_budget_ms = service.config.max_budget_ms

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage:
            await service.start()
        service.runtime.event_sinks.append(metrics.observe)
        try:
            yield
        finally:
            if manage:
                await service.stop()

    app = FastAPI(
        title="chainrt serve",
        version="1",
        summary="Submit, watch and cancel chain runs; runs are queued and run by the fleet.",
        lifespan=lifespan,
        # Swagger UI and ReDoc load their scripts from a CDN: off. /openapi.json stays.
        docs_url=None,
        redoc_url=None,
    )
    app.router.route_class = CheckedJSONRoute  # JSON bodies checked as --input is
    app.state.access_policy = policy
    # The hot routes answered directly, inside the access checks (Guard is added last: outermost).
    app.add_middleware(Direct, service=service)
    app.add_middleware(Guard, policy=policy)

    def _bounded(budget: str | float | None) -> None:
        if budget is not None:
            try:
                parse_budget_ms(budget, what="budget", max_ms=max_budget_ms)
            except ChainRTError as exc:
                raise _bad_field("budget", exc.message) from None

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid"}
        if first.get("type") == "json_invalid":
            why = (first.get("ctx") or {}).get("error", "")
            return error(422, "invalid_request", f"the body is not valid JSON: {why}".strip())
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or None
        if field is None and first.get("type") in ("model_attributes_type", "dict_type"):
            message = "the body must be a JSON object (send Content-Type: application/json)"
            return error(422, "invalid_request", message)
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        return error(422, "invalid_request", message, field)

    @app.exception_handler(ChainRTError)  # RunNotFound, UnknownChain, InputError included
    async def chainrt_error(request: Request, exc: ChainRTError) -> JSONResponse:
        return failure(exc)

    @app.post(
        "/v1/runs",
        status_code=202,
        response_model=RunAccepted,
        responses={200: {"model": RunAccepted}, **_ERRORS},
    )
    async def submit(body: SubmitRequest) -> Response:
        """Queue a run. The same ``run_id`` with the same body again answers 200 and that run;
        with another body, 409."""
        _bounded(body.budget)
        outcome = await service.submit(body)
        accepted = {"run_id": outcome.run.run_id, "status": outcome.run.status}
        if outcome.kind == "conflict":
            return error(
                409,
                "run_id_conflict",
                f"run {outcome.run.run_id} exists with another chain, input or budget",
                "run_id",
            )
        return JSONResponse(accepted, status_code=202 if outcome.kind == "created" else 200)

    # The hot read: its path and query parameters are read here, not declared to FastAPI,
    # whose per-request handling of a declared parameter cost more than the rest of the route.
    @app.get("/v1/runs/{run_id}", responses=_ERRORS, openapi_extra=_GET_RUN_PARAMETERS)
    async def get_run(request: Request) -> dict[str, Any]:
        """The run as ``chainrt run --json`` prints it."""
        run_id: str = request.path_params["run_id"]
        try:
            wait_s = wait_seconds(request.query_params.get("wait"))
        except ChainRTError as exc:
            raise RequestValidationError(
                [{"loc": ("query", "wait"), "msg": exc.message, "type": "value_error"}]
            ) from None
        result = await service.result(run_id, wait_s)
        body = result.model_dump(mode="json")
        if result.status == "queued" and (reason := await service.waiting_reason(result.chain)):
            body["reason"] = reason  # e.g. no live runner serves its chain
        return body

    @app.get("/v1/runs/{run_id}/record", responses=_ERRORS)
    async def get_record(run_id: str) -> dict[str, Any]:
        """The run with what the dashboard draws: its input, trace link, the chain's steps in
        order (optional ones marked) and each written step's record (times, attempts, waits,
        output), as ``chainrt inspect --json``."""
        store = service.runtime.store
        record = await store.get_run(run_id)
        steps = await store.get_steps(run_id)
        return run_detail(record, steps, service.runtime.hooks)

    @app.get("/v1/runs", response_model=list[RunSummary])
    async def list_runs(
        response: Response,
        status: str | None = Query(None, description="Only runs with this status."),
        chain: str | None = Query(None, description="Only runs of this chain."),
        limit: int = Query(50, ge=1, le=1000),
        run_id: str | None = Query(None, description="Only the run with this id (a search)."),
        cursor: str | None = Query(
            None, description="The X-Next-Cursor header of the page before: the next page."
        ),
    ) -> list[RunSummary]:
        """Runs, newest first. When there may be more, the ``X-Next-Cursor`` header holds the
        ``cursor`` of the next page (keyset: it holds with any number of runs)."""
        store = service.runtime.store
        if run_id is not None:
            try:
                found = await store.get_run(run_id)
            except RunNotFound:
                return []
            keep = (status is None or found.status == status) and chain in (None, found.chain)
            return [await _summary(service, found)] if keep else []
        try:
            runs, after = await list_page(
                store, status=status, chain=chain, limit=limit, cursor=cursor
            )
        except BadCursor as exc:
            raise RequestValidationError(
                [{"loc": ("query", "cursor"), "msg": exc.message, "type": "value_error"}]
            ) from None
        if after is not None:
            response.headers["X-Next-Cursor"] = after
        return [await _summary(service, r) for r in runs]

    @app.get("/v1/chains", response_model=list[ChainInfo])
    async def chains() -> list[ChainInfo]:
        """The chains this runner serves, with their declared inputs."""
        return [
            ChainInfo(name=c.name, description=c.spec.description, inputs=dict(c.spec.inputs))
            for c in sorted(service.chains.values(), key=lambda c: c.name)
        ]

    @app.post(
        "/v1/runs/{run_id}/cancel", status_code=202, response_model=RunAccepted, responses=_ERRORS
    )
    async def cancel(run_id: str) -> RunAccepted:
        """Cancel a run: a queued one never starts, a running one stops within a second."""
        result = await service.cancel(run_id)
        return RunAccepted(run_id=run_id, status=result.status)

    @app.post(
        "/v1/runs/{run_id}/resume", status_code=202, response_model=RunAccepted, responses=_ERRORS
    )
    async def resume(run_id: str, body: ResumeRequest | None = None) -> RunAccepted:
        """Queue a resume of a run that stopped (partial, failed, rejected, cancelled)."""
        _bounded(body.budget if body else None)
        record = await service.resume(run_id, body.budget if body else None)
        return RunAccepted(run_id=run_id, status=record.status)

    add_signal_route(app, service)  # POST /v1/runs/{run_id}/signal (chainrt/serve/_signal_api.py)

    @app.get("/v1/runs/{run_id}/events", responses=_ERRORS)
    async def events(run_id: str) -> Response:
        """Server-Sent Events: the run's history (with the events of its step in flight), then
        live events, ending after run_finished. 429 while ``--max-streams`` streams are open."""
        release = service.streams.take()  # first: a refused stream costs no store read
        if release is None:
            return _too_many_streams(service.streams.limit)
        try:
            await service.runtime.store.get_run(run_id)  # 404 before the stream starts
        except BaseException:
            release()
            raise

        async def stream() -> AsyncIterator[bytes]:
            source = service.events(run_id).__aiter__()
            pending = asyncio.ensure_future(source.__anext__())
            try:
                while True:
                    done, _ = await asyncio.wait({pending}, timeout=_KEEPALIVE_S)
                    if not done:
                        yield b": keep-alive\n\n"
                        continue
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    body = json.dumps(event.to_dict(), ensure_ascii=False)
                    yield f"event: {event.type}\ndata: {body}\n\n".encode()
                    pending = asyncio.ensure_future(source.__anext__())
            finally:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
                with contextlib.suppress(BaseException):
                    await source.aclose()  # type: ignore[attr-defined]

        return CappedStream(
            stream(),
            release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @app.get("/v1/events/runs")
    async def runs_events(
        last_event_id: str | None = Header(None, description="Set by EventSource on reconnect."),
    ) -> Response:
        """Server-Sent Events of the runs list: a ``run`` event (``change``: created or status,
        and the fields of a ``GET /v1/runs`` row) each time a run is created or changes status.
        A client that reconnects with ``Last-Event-ID`` gets what it missed, or a ``reload``
        event (read the list again); a new stream starts with ``reload``. 429 while
        ``--max-streams`` streams are open."""
        release = service.streams.take()
        if release is None:
            return _too_many_streams(service.streams.limit)
        return CappedStream(
            service.feed.stream(last_event_id),
            release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        """The process answers."""
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        """Ready: the store answers and chains are loaded."""
        ok, why = await service.ready()
        return JSONResponse(
            {"status": "ready" if ok else "not_ready", "reason": why},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus metrics."""
        metrics.in_flight.set(service.in_flight())
        # chainrt serve's connection gate (serve/_main.py); absent when served another way.
        connection_metrics.update(getattr(app.state, "connection_gate", None), service.streams)
        with contextlib.suppress(Exception):
            waiting: dict[str, tuple[int, float]] = {}
            for depth in await service.queue.depth():  # one row per stream: summed per class
                count, age = waiting.get(depth.priority, (0, 0.0))
                waiting[depth.priority] = (count + depth.waiting, max(age, depth.oldest_age_s))
            for priority, (count, age) in waiting.items():
                metrics.queue_depth.labels(priority=priority).set(count)
                metrics.queue_age.labels(priority=priority).set(age)
        with contextlib.suppress(Exception):  # Redis away: the loops' figures still count
            await fleet_metrics.update(service)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(fleet_routes(service))
    handle_backend_errors(app)
    app.router.routes.extend(routes)
    return app
