"""The worker HTTP service: an OpenAI-compatible API over one engine (docs/workers.md).

    from workers.server import WorkerConfig, create_app
    app = create_app(engine, WorkerConfig(watermark=0.85, slots=1))   # a Starlette app

Admission (:func:`decide`, :class:`AdmissionQueue`) is usable on its own; :class:`RequestObserver`
is the seam tracing plugs into.
"""

from __future__ import annotations

from ._admission import (
    PRIORITIES,
    AdmissionQueue,
    Admit,
    Decision,
    NeverFits,
    QueueFull,
    RetryLater,
    Slot,
    capacity_tokens,
    decide,
)
from ._app import create_app
from ._config import WorkerConfig
from ._context import NullObserver, RequestContext, RequestObserver, current_request

__all__ = [
    "PRIORITIES",
    "AdmissionQueue",
    "Admit",
    "Decision",
    "NeverFits",
    "NullObserver",
    "QueueFull",
    "RequestContext",
    "RequestObserver",
    "RetryLater",
    "Slot",
    "WorkerConfig",
    "capacity_tokens",
    "create_app",
    "current_request",
    "decide",
]
