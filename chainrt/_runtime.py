"""Assembling a runner from settings: store, dispatcher, limiter and hooks, opened and closed once.

Tracing is put together here, around the parts rather than inside them: with tracing on, the
store, the limiter and the model backends are wrapped in their traced versions and the runner
gets the tracing interceptor (:mod:`chainrt.tracing._intercept`); with tracing off nothing is
wrapped and nothing of tracing is imported.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ._hooks import NO_HOOKS, Hooks, observes
from ._progress import NO_PROGRESS, Progress
from ._run import RunInterceptor
from ._runner import Runner
from ._settings import Settings, get_settings
from .concurrency import Limiter, open_limiter
from .dispatch import Dispatcher, make_dispatcher
from .store import CheckpointStore, open_store

__all__ = ["Runtime", "default_hooks", "open_runtime"]

StoreLike = str | CheckpointStore | None
PoolLike = str | Dispatcher | None


@dataclass
class Runtime:
    """A runner and the resources it was built from; ``aclose`` closes what it opened."""

    runner: Runner
    store: CheckpointStore
    dispatcher: Dispatcher
    limiter: Limiter
    hooks: Hooks
    settings: Settings
    _owned: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close the store, dispatcher and limiter this runtime opened (not those passed in)."""
        for resource in reversed(self._owned):
            with contextlib.suppress(Exception):
                await resource.close()
        self._owned.clear()


def default_hooks(settings: Settings, *, force: bool = False) -> Hooks:
    """Tracing hooks when tracing is configured (OTEL_* variables, CHAINRT_TRACE, --trace)."""
    try:
        from .tracing import hooks_from_env
    except ImportError:
        return NO_HOOKS
    hooks: Hooks = hooks_from_env(settings, force=force)
    return hooks


@contextlib.asynccontextmanager
async def open_runtime(
    *,
    store: StoreLike = None,
    pool: PoolLike = None,
    limiter: Limiter | None = None,
    hooks: Hooks | None = None,
    progress: Progress = NO_PROGRESS,
    trace: bool = False,
) -> AsyncIterator[Runtime]:
    """Open a runtime for one block; closes what it opened when the block ends."""
    settings = get_settings()
    owned: list[Any] = []
    hooks = hooks if hooks is not None else default_hooks(settings, force=trace or settings.trace)
    if store is None or isinstance(store, str):
        store_url = store or settings.store
        store_obj = open_store(store_url)
        owned.append(store_obj)
    else:
        store_obj = store
        store_url = store.raw_url
    if isinstance(pool, Dispatcher):
        dispatcher = pool
    else:
        dispatcher = make_dispatcher(pool or settings.pool, hooks=hooks)
        owned.append(dispatcher)
    if limiter is None:
        limiter = open_limiter(store_url, lease_ttl_s=settings.lease_ttl_s)
        owned.append(limiter)
    interceptors: list[RunInterceptor] = []
    if observes(hooks):
        from .tracing._intercept import TracedLimiter, TracedStore, TracingInterceptor

        store_obj = TracedStore(store_obj, hooks)
        limiter = TracedLimiter(limiter, hooks)
        interceptors.append(TracingInterceptor(hooks))
    allowed = tuple(m.strip() for m in settings.allowed_modules.split(",") if m.strip())
    runner = Runner(
        store_obj,
        dispatcher,
        limiter,
        interceptors=interceptors,
        progress=progress,
        lease_ttl_s=settings.lease_ttl_s,
        allowed_modules=allowed,
    )
    runtime = Runtime(runner, store_obj, dispatcher, limiter, hooks, settings, owned)
    try:
        yield runtime
    finally:
        await asyncio.shield(runtime.aclose())
        hooks.flush()
