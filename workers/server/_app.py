"""The worker's Starlette app: routes, start-up (engine + first readiness generation), shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chainrt.engines import Engine, create_engine

from ._admission import AdmissionQueue
from ._config import WorkerConfig
from ._context import NullObserver, RequestObserver
from ._faults import FaultInjector, FaultsRequest
from ._handler import GenerationHandler
from ._health import HealthMonitor
from ._http import HttpError, json_response, read_body
from ._metrics import WorkerMetrics
from ._openai import error_body
from ._recovery import RecoveryManager
from ._reload import EngineFactory, ReloadError, ReloadManager, ReloadRequest, ServingEngines

__all__ = ["create_app"]

log = logging.getLogger("chainrt.worker")

_CLOSE_TIMEOUT_S = 6.0
"""How long shutdown waits for the engine to close before ending its child processes: below the
10 s a supervisor (systemd, Kubernetes, the tests) usually leaves between SIGTERM and SIGKILL."""


def create_app(
    engine: Engine,
    config: WorkerConfig | None = None,
    *,
    observer: RequestObserver | None = None,
    engine_factory: EngineFactory | None = None,
    model: str | None = None,
) -> Starlette:
    """An OpenAI-compatible app serving ``engine``.

    Start-up loads the engine and runs the first readiness generation (a worker whose engine
    cannot load does not start). ``observer`` is the tracing seam (see ``_context``).
    ``engine_factory`` builds the engine a hot reload loads (default: another engine of the same
    kind, made like ``chainrt-worker serve`` makes it); ``model`` is what ``engine`` was loaded
    from (a reload without a model loads it again).
    """
    config = config or WorkerConfig()
    names = list(config.served_model_names or [engine.model_name])
    metrics = WorkerMetrics(engine.name, names[0])
    metrics.memory_watermark.set(config.watermark)
    health = HealthMonitor(engine, metrics, timeout_s=config.probe_timeout_s)
    recovery = RecoveryManager(engine, health, metrics)
    engines = ServingEngines(engine, names, model)
    reloads = ReloadManager(
        engines,
        engine_factory or _same_kind(engine),
        health=health,
        recovery=recovery,
        metrics=metrics,
        probe_timeout_s=config.probe_timeout_s,
    )
    faults = FaultInjector(engine.faults) if config.enable_fault_injection else None
    handler = GenerationHandler(
        engines,
        config,
        queue=AdmissionQueue(config.slots, config.max_waiting),
        health=health,
        recovery=recovery,
        metrics=metrics,
        faults=faults,
        observer=observer or NullObserver(),
    )
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        if not (await health.probe()).ok:
            recovery.start("probe_failed", f"first readiness generation failed: {health.reason}")
        periodic = asyncio.create_task(
            health.run_periodically(config.health_interval_s, recovery.probe_failed)
        )
        log.info("worker ready: engine=%s model=%s", engine.name, ", ".join(names))
        try:
            yield
        finally:
            periodic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await periodic
            await recovery.close()
            await reloads.close()
            await close_engine(engines.current.engine, _CLOSE_TIMEOUT_S)

    async def models(request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "chainrt"}
            for name in engines.names
        ]
        return json_response({"object": "list", "data": data})

    async def live(request: Request) -> Response:
        return json_response({"status": "alive"})

    async def ready(request: Request) -> Response:
        return json_response(health.snapshot(), 200 if health.ready else 503)

    async def metrics_route(request: Request) -> Response:
        metrics.queue_depth.set(handler.queue.depth)
        metrics.slots_in_use.set(handler.queue.in_use)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def admin_faults(request: Request) -> Response:
        assert faults is not None
        if request.method == "GET":
            return json_response(faults.state())
        try:
            change = FaultsRequest.model_validate_json(await read_body(request, 64 * 1024))
        except HttpError as err:
            return err.response()
        except ValidationError as exc:
            return json_response(error_body("invalid_request_error", _problems(exc)), 400)
        state = faults.apply(change)
        log.warning("fault injection changed: %s", state)
        return json_response(state)

    async def admin_reload(request: Request) -> Response:
        assert config.admin_token is not None
        if not _authorized(request, config.admin_token.get_secret_value()):
            return json_response(
                error_body("unauthorized", "POST /admin/reload needs the worker's admin token"),
                401,
                {"WWW-Authenticate": "Bearer"},
            )
        try:
            body = await read_body(request, 64 * 1024)
            change = ReloadRequest.model_validate_json(body or b"{}")
            return json_response(await reloads.reload(change))
        except HttpError as err:
            return err.response()
        except ValidationError as exc:
            return json_response(error_body("invalid_request_error", _problems(exc)), 400)
        except ReloadError as exc:
            log.warning("reload refused: %s", exc.message)
            return json_response(error_body(exc.kind, exc.message), exc.status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return json_response(error_body(kind, message), exc.status_code, exc.headers)

    routes = [
        Route("/v1/chat/completions", handler.chat, methods=["POST"]),
        Route("/v1/completions", handler.completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health/live", live, methods=["GET"]),
        Route("/health/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    if faults is not None:  # without the flag the route does not exist: 404
        routes.append(Route("/admin/faults", admin_faults, methods=["GET", "POST"]))
    if config.admin_token is not None:  # without a token the route does not exist: 404
        routes.append(Route("/admin/reload", admin_reload, methods=["POST"]))
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
    app.state.handler = handler
    app.state.health = health
    app.state.metrics = metrics
    app.state.engines = engines
    return app


def _problems(exc: ValidationError) -> str:
    """A pydantic error as one line: ``field: message; ...``."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )


def _authorized(request: Request, token: str) -> bool:
    """True when ``Authorization: Bearer <token>`` matches (constant-time comparison)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8"))


def _same_kind(engine: Engine) -> EngineFactory:
    """Reload factory: a new engine of ``engine``'s kind (what ``chainrt-worker serve`` makes)."""

    def build(model: str | None, name: str | None) -> Engine:
        return create_engine(engine.name, model, model_name=name)

    return build


async def close_engine(engine: Engine, timeout_s: float) -> None:
    """Close ``engine`` within ``timeout_s``, then end every child process still alive.

    A vLLM engine core being built (a warm standby) cannot be stopped from the thread that builds
    it, so a close waits for the build (tens of seconds), and a worker killed meanwhile left that
    core process behind. Past the timeout, or when a close leaves one, the children this process
    started (``multiprocessing``: vLLM's engine cores) are killed; their own children (vLLM's
    ``VLLM::Worker``) are killed with them (a core killed mid-start leaves its worker running).
    """
    try:
        await asyncio.wait_for(engine.close(), timeout_s)
    except TimeoutError:
        log.warning("the engine did not close within %.0f s; ending its processes", timeout_s)
    for child in multiprocessing.active_children():
        log.warning("ending child process %s (pid %s) left by the engine", child.name, child.pid)
        for pid in _descendants(child.pid):  # a core still starting has not armed their exit yet
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        child.kill()
        child.join(5)


def _descendants(pid: int | None) -> list[int]:
    """The process ids under ``pid`` (psutil, which vLLM brings; none without it)."""
    if pid is None:
        return []
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing, or the process is gone
        return []
