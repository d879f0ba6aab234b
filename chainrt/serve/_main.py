"""Running ``chainrt serve``: uvicorn with this process's own SIGTERM/SIGINT handling.

uvicorn's handlers would first wait for open HTTP connections (event streams stay open for as
long as a run lasts) and only then let the app drain. Here a signal drains at once: the runner
stops taking runs, its runs stop at their next step boundary (at most ``--drain`` later) and are
handed over, and then the HTTP server stops.

Connections are accepted by :class:`~chainrt.serve._accept.ConnectionGate` (at most
``--max-connections`` open) and served by :mod:`~chainrt.serve._timeouts`' protocol (header and
body deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import signal
import socket
from collections.abc import Sequence
from typing import Any

import uvicorn

from .._settings import get_settings
from ..errors import InputError
from ._accept import ConnectionGate, bound_socket
from ._app import access_policy, create_app
from ._guard import is_loopback
from ._models import ServeConfig
from ._service import Service
from ._streams import default_max_streams
from ._timeouts import connection_protocol
from ._ui import dashboard_routes

__all__ = ["serve"]

log = logging.getLogger("chainrt.serve")


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gate: ConnectionGate) -> None:
        super().__init__(config)
        self.gate = gate

    def install_signal_handlers(self) -> None:  # ours are installed in serve()
        pass

    async def startup(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """uvicorn's start, then the gate accepts on the listening sockets."""
        await super().startup(list(sockets) if sockets is not None else None)
        if self.started and sockets:
            config = self.config
            factory = functools.partial(
                config.http_protocol_class,  # type: ignore[call-arg]  # uvicorn's own call
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
            )
            self.gate.take_over(sockets, factory, self.server_state.connections)

    async def shutdown(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """The gate stops accepting, then uvicorn's stop."""
        self.gate.close()
        await super().shutdown(list(sockets) if sockets is not None else None)


def http_protocol(
    header_timeout_s: float, body_timeout_s: float, gate: ConnectionGate
) -> type[Any]:
    """The HTTP/1.1 protocol class with the connection deadlines (:mod:`._timeouts`), on the
    parser ``CHAINRT_SERVE_HTTP`` names: ``auto`` httptools (llhttp, in C; :mod:`._timeouts_tools`)
    where it is installed, else h11; ``httptools``; ``h11``. InputError for httptools asked for
    and not installed."""
    wanted = get_settings().serve_http
    if wanted != "h11":
        try:
            from ._timeouts_tools import tools_protocol
        except ImportError as exc:
            if wanted == "httptools":
                raise InputError(
                    f"CHAINRT_SERVE_HTTP=httptools, but it cannot be imported ({exc}): "
                    "pip install httptools, or CHAINRT_SERVE_HTTP=auto"
                ) from None
        else:
            return tools_protocol(header_timeout_s, body_timeout_s, gate)
    return connection_protocol(header_timeout_s, body_timeout_s, gate)


def _configure_logging(level: str) -> None:
    """``--log-level`` for chainrt's own lines, with a time stamp (a server's log is read
    later, not watched). An embedder's own logging configuration is left alone."""
    logger = logging.getLogger("chainrt")
    logger.setLevel(level.upper())
    if logging.getLogger().handlers:
        return
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logger.handlers:
        handler.setFormatter(formatter)


def _log_start(service: Service) -> None:
    """One start-up line: where it listens, its store, the chains it serves (and the files
    skipped, already logged one per line)."""
    config = service.config
    chains = ", ".join(sorted(service.chains)) or "(none)"
    skipped = f"; {len(service.chain_errors)} files skipped" if service.chain_errors else ""
    log.info(
        "chainrt serve on http://%s:%d, store %s, queue %s, chains from %s: %s%s",
        config.host,
        config.port,
        service.runtime.store.url,
        "redis" if service.redis else "in-process",
        config.chains,
        chains,
        skipped,
    )


def _stream_cap(config: ServeConfig, max_connections: int) -> int:
    """``--max-streams``, below the connection cap: streams that took every connection would
    leave none for anything else (a health check included). InputError when both are given
    and do not fit; a default that does not fit becomes half the connection cap."""
    if config.max_streams is not None:
        if config.max_streams >= max_connections:
            raise InputError(
                f"--max-streams {config.max_streams} must be below --max-connections "
                f"{max_connections}: streams holding every connection leave none for other "
                "requests (health checks included)"
            )
        return config.max_streams
    default = default_max_streams()
    return default if default < max_connections else max(1, max_connections // 2)


async def serve(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop. Without API tokens it listens on a
    loopback address only, unless ``config.insecure_no_auth`` (InputError otherwise)."""
    _configure_logging(config.log_level)
    policy = access_policy(config)
    if policy.tokens is None and not is_loopback(config.host) and not config.insecure_no_auth:
        raise InputError(
            f"--host {config.host} is reachable from other machines and no API tokens are set: "
            "give --tokens FILE (or CHAINRT_API_TOKENS; `chainrt token new`), or "
            "--insecure-no-auth to serve everyone everything"
        )
    gate = ConnectionGate(config.max_connections)
    streams = _stream_cap(config, gate.limit)
    listening = bound_socket(config.host, config.port)  # before any run is taken
    service = Service(config)
    service.streams.limit = streams
    app = create_app(service, routes=dashboard_routes(), manage=False, policy=policy)
    await service.start()
    _log_start(service)
    app.state.connection_gate = gate  # its figures in /metrics
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level.lower(),
        access_log=config.access_log,
        lifespan="on",
        timeout_graceful_shutdown=1,
        # Slow clients are dropped: headers within --header-timeout, bodies within
        # --body-timeout, idle keep-alive connections after --idle-timeout.
        http=http_protocol(config.header_timeout_s, config.body_timeout_s, gate),
        timeout_keep_alive=max(1, math.ceil(config.idle_timeout_s)),  # whole seconds
    )
    server = _Server(uv_config, gate)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.ensure_future(server.serve(sockets=[listening]))
    try:
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        log.info("draining: %d runs in flight, up to %.1fs", service.in_flight(), config.drain_s)
        await service.stop()
    finally:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await serving
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
