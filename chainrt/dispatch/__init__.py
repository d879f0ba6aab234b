"""Dispatch of LLM steps to model backends (docs/dispatch.md).

    dispatcher = make_dispatcher("pool.yaml")          # models -> endpoints, plus "local"
    answer = await dispatcher.complete(LlmCall(model="primary", messages=[...],
                                               fallbacks=["local"]), deadline)
    await dispatcher.close()

The parts: the pool file (``_pool``), the shared HTTP client (``_client``), endpoint states
(``_endpoints``) judged by pure breakers (``_breaker``) and a pure weighted choice (``_choice``),
readiness polling (``_health``), the HTTP backend (``_http``; its wire format in ``_http_wire``,
the pool's shared client and table in ``_resources``), recent latency (``_latency``), the pure
retry/fallback decisions (``_policy``) and the loop that applies them (``_dispatcher``: its shared
state in ``_state``, each model's tries in ``_model_try``).
"""

from __future__ import annotations

import os

from .._hooks import NO_HOOKS, Hooks, observes
from ._backend import BackendAnswer, BackendError, LocalBackend, ModelBackend, TextSink
from ._dispatcher import Dispatcher, DispatchFailed
from ._http import HttpBackend
from ._latency import LatencyTracker
from ._pool import PoolConfig, load_pool_config, parse_pool_config, pool_backends
from ._types import LlmAnswer, LlmCall, Priority

__all__ = [
    "BackendAnswer",
    "BackendError",
    "DispatchFailed",
    "Dispatcher",
    "HttpBackend",
    "LatencyTracker",
    "LlmAnswer",
    "LlmCall",
    "LocalBackend",
    "ModelBackend",
    "PoolConfig",
    "Priority",
    "TextSink",
    "load_pool_config",
    "make_dispatcher",
    "parse_pool_config",
    "pool_backends",
]


def make_dispatcher(
    pool: str | os.PathLike[str] | PoolConfig | None = None, *, hooks: Hooks = NO_HOOKS
) -> Dispatcher:
    """A dispatcher for the pool file at ``pool`` (or a parsed :class:`PoolConfig`).

    ``None``: only the in-process ``local`` model. ``local`` stays the in-process model unless
    the pool maps ``local`` to endpoints. :class:`~chainrt.SpecError` when the file is invalid.
    With tracing ``hooks``, every backend is wrapped so that each attempt is an ``llm.dispatch``
    span (:class:`chainrt.tracing._backend.TracedBackend`).
    """
    backends: dict[str, ModelBackend] = {"local": LocalBackend()}
    window = 20
    if pool is not None:
        config = pool if isinstance(pool, PoolConfig) else load_pool_config(pool)
        backends.update(pool_backends(config))
        window = config.latency_window
    if observes(hooks):
        from ..tracing._backend import trace_backends

        backends = trace_backends(backends, hooks)
    return Dispatcher(backends, latency=LatencyTracker(size=window, min_samples=min(3, window)))
