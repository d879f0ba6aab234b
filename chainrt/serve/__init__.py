"""``chainrt serve`` (docs/serve.md): a long-lived runner with an HTTP API and a share of the queue.

    from chainrt.serve import Service, ServeConfig, create_app
    service = Service(ServeConfig(chains="chains", store="redis://...", max_runs=16))
    app = create_app(service, routes=[...])     # an ASGI app; its lifespan starts and drains

Needs ``chainrt[serve]`` (FastAPI, uvicorn, prometheus-client; redis for a fleet).
"""

from __future__ import annotations

from ._app import create_app
from ._listing import BadCursor
from ._main import serve
from ._models import ServeConfig, SubmitRequest
from ._queue import PRIORITIES, Entry, LocalQueue, RedisQueue, RunQueue
from ._service import Draining, Service, UnknownChain

__all__ = [
    "PRIORITIES",
    "BadCursor",
    "Draining",
    "Entry",
    "LocalQueue",
    "RedisQueue",
    "RunQueue",
    "ServeConfig",
    "Service",
    "SubmitRequest",
    "UnknownChain",
    "create_app",
    "serve",
]
