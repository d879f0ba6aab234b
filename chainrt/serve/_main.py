"""Running ``chainrt serve``: uvicorn with this process's own SIGTERM/SIGINT handling.

uvicorn's handlers would first wait for open HTTP connections (event streams stay open for as
long as a run lasts) and only then let the app drain. Here a signal drains at once: the runner
stops taking runs, its runs stop at their next step boundary (at most ``--drain`` later) and are
handed over, and then the HTTP server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn

from ._app import create_app
from ._models import ServeConfig
from ._service import Service
from ._ui import dashboard_routes

__all__ = ["serve"]

log = logging.getLogger("chainrt.serve")


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # ours are installed in serve()
        pass


async def serve(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop."""
    service = Service(config)
    app = create_app(service, routes=dashboard_routes(), manage=False)
    await service.start()
    server = _Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.ensure_future(server.serve())
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
