"""``chainrt.Runtime`` (README.md): one store, one dispatcher, one limiter, held for a lifetime.

A runtime is what a web backend holds like an ``httpx.AsyncClient``: the store's connection pool,
the dispatcher (breaker, health and latency state shared by all its runs), the limiter and the
local model are opened once, and every ``run``/``resume``/``stream``/``cancel`` uses them.
:func:`open_runtime` is the same for one block; :func:`default_runtime` is the process-wide one
per (store, pool, settings) that ``chain.run``/``arun`` use (see :mod:`chainrt._defaults`).

Tracing is put together here, around the parts rather than inside them: with tracing on, the
store, the limiter and the model backends are wrapped in their traced versions and the runner
gets the tracing interceptor (:mod:`chainrt.tracing._intercept`); with tracing off nothing is
wrapped and nothing of tracing is imported.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ._bounded import start_eagerly
from ._durations import parse_budget_ms
from ._errors import ChainRTError, FencedOut
from ._events import EventProgress, FanOut, RunEvent
from ._hooks import NO_HOOKS, Hooks, observes
from ._progress import NO_PROGRESS, Progress
from ._result import RunResult
from ._run import RunInterceptor
from ._runner import Runner, new_run_id
from ._settings import Settings, get_settings
from .concurrency import Limiter, open_limiter
from .dispatch import Dispatcher, make_dispatcher
from .runs._cancel import cancel_in_store
from .spec import ChainSpec, load_spec
from .store import CheckpointStore, open_store

if TYPE_CHECKING:
    from ._chain import Chain
    from ._records import RunRecord

__all__ = ["PoolLike", "Runtime", "StoreLike", "default_hooks", "open_runtime"]

StoreLike = str | CheckpointStore | None
PoolLike = str | Dispatcher | None
Duration = str | float | int | timedelta | None
EventSink = Callable[[RunEvent], None]

_WATCH_EVERY_S = 0.5
"""How often a runtime without pub/sub looks for cancels of its runs made by other processes."""


def default_hooks(settings: Settings, *, force: bool = False) -> Hooks:
    """Tracing hooks when tracing is configured (OTEL_* variables, CHAINRT_TRACE, --trace)."""
    try:
        from .tracing import hooks_from_env
    except ImportError:
        return NO_HOOKS
    hooks: Hooks = hooks_from_env(settings, force=force)
    return hooks


def _budget_ms(budget: Duration) -> float | None:
    return None if budget is None else parse_budget_ms(budget, what="budget")


class Runtime:
    """A long-lived runtime: ``async with chainrt.Runtime(store=..., pool=...) as rt: ...``.

    ``store`` and ``pool`` take a URL / path or an object (objects passed in are not closed);
    both default to the settings (``CHAINRT_STORE``, ``CHAINRT_POOL``). ``progress`` hears of
    every run. ``host`` names this runtime's owner leases (default: the host name).
    ``interceptors`` wrap every run and step (after tracing's, when tracing is on).
    """

    runner: Runner
    store: CheckpointStore
    dispatcher: Dispatcher
    limiter: Limiter
    hooks: Hooks
    settings: Settings

    def __init__(
        self,
        store: StoreLike = None,
        pool: PoolLike = None,
        *,
        limiter: Limiter | None = None,
        hooks: Hooks | None = None,
        progress: Progress = NO_PROGRESS,
        trace: bool = False,
        host: str | None = None,
        interceptors: Sequence[RunInterceptor] = (),
    ) -> None:
        self._args = (store, pool, limiter, hooks, progress, trace, host)
        self._extra_interceptors = tuple(interceptors)
        self._owned: list[Any] = []
        self._opened = False
        self._active: dict[str, asyncio.Task[RunResult]] = {}
        self._cancel_requested: set[str] = set()
        self._listeners: dict[str, list[EventSink]] = {}
        self.event_sinks: list[EventSink] = []
        """Called with every event of every run of this runtime (``chainrt serve`` adds its bus)."""
        self._watcher: asyncio.Task[None] | None = None
        self._cancel_bus: Any = None

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.aclose())

    async def open(self) -> None:
        """Open the store, dispatcher and limiter (``async with`` does it)."""
        if self._opened:
            return
        store, pool, limiter, hooks, progress, trace, host = self._args
        settings = get_settings()
        hooks = (
            hooks if hooks is not None else default_hooks(settings, force=trace or settings.trace)
        )
        if store is None or isinstance(store, str):
            store_obj = open_store(store or settings.store)
            self._owned.append(store_obj)
        else:
            store_obj = store
        store_url = store_obj.raw_url
        if isinstance(pool, Dispatcher):
            dispatcher = pool
        else:
            dispatcher = make_dispatcher(pool or settings.pool, hooks=hooks)
            self._owned.append(dispatcher)
        if limiter is None:
            limiter = open_limiter(store_url, lease_ttl_s=settings.lease_ttl_s)
            self._owned.append(limiter)
        interceptors: list[RunInterceptor] = []
        if observes(hooks):
            from .tracing._intercept import TracedLimiter, TracedStore, TracingInterceptor

            store_obj = TracedStore(store_obj, hooks)
            limiter = TracedLimiter(limiter, hooks)
            interceptors.append(TracingInterceptor(hooks))
        interceptors.extend(self._extra_interceptors)
        allowed = tuple(m.strip() for m in settings.allowed_modules.split(",") if m.strip())
        self.runner = Runner(
            store_obj,
            dispatcher,
            limiter,
            interceptors=interceptors,
            progress=progress,
            lease_ttl_s=settings.lease_ttl_s,
            allowed_modules=allowed,
            host=host,
        )
        self.store, self.dispatcher, self.limiter = store_obj, dispatcher, limiter
        self.hooks, self.settings = hooks, settings
        self._opened = True

    async def aclose(self) -> None:
        """Stop the runs still in flight (their leases are given back) and close what this
        runtime opened (not the objects passed in)."""
        for task in list(self._active.values()):
            task.cancel()
        for task in list(self._active.values()):
            with contextlib.suppress(BaseException):
                await task
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher
            self._watcher = None
        if self._cancel_bus is not None:
            with contextlib.suppress(Exception):
                await self._cancel_bus.close()
            self._cancel_bus = None
        for resource in reversed(self._owned):
            with contextlib.suppress(Exception):
                await resource.close()
        self._owned.clear()
        if self._opened:
            self.hooks.flush()
        self._opened = False

    # ------------------------------------------------------------------ runs

    async def run(
        self,
        chain: Chain | ChainSpec | str | Path,
        inputs: dict[str, Any],
        *,
        run_id: str | None = None,
        budget: Duration = None,
        progress: Progress | None = None,
    ) -> RunResult:
        """Run ``chain`` (a Chain, a spec or a YAML path) once; ``budget`` overrides its own."""
        spec, source_dir = _spec_of(chain)
        run_id = run_id or new_run_id()
        coro = self.runner.run(
            spec,
            inputs,
            source_dir=source_dir,
            run_id=run_id,
            budget_ms=_budget_ms(budget),
            progress=self._progress_for(run_id, progress),
        )
        return await self._track(run_id, coro)

    async def resume(
        self,
        run_id: str,
        *,
        budget: Duration = None,
        wait: bool = True,
        progress: Progress | None = None,
        record: RunRecord | None = None,
    ) -> RunResult:
        """Resume a run from its last checkpoint (or start a ``queued`` one). ``record``: its
        record as the caller has just read it, not read again (see :meth:`Runner.resume`)."""
        coro = self.runner.resume(
            run_id,
            budget_ms=_budget_ms(budget),
            wait=wait,
            progress=self._progress_for(run_id, progress),
            record=record,
        )
        return await self._track(run_id, coro)

    async def stream(
        self,
        chain: Chain | ChainSpec | str | Path,
        inputs: dict[str, Any],
        *,
        run_id: str | None = None,
        budget: Duration = None,
    ) -> AsyncIterator[RunEvent]:
        """Run ``chain`` and yield its events (docs/serve.md, Run events) as they happen, ``run_finished`` last.

        Leaving the loop early cancels the run (its lease is given back; it can be resumed).
        """
        run_id = run_id or new_run_id()
        events: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        self.listen(run_id, events.put_nowait)
        task = asyncio.ensure_future(self.run(chain, inputs, run_id=run_id, budget=budget))
        task.add_done_callback(lambda _: events.put_nowait(None))
        try:
            while (event := await events.get()) is not None:
                yield event
            await task  # raises what the run raised
        finally:
            self.unlisten(run_id, events.put_nowait)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def cancel(self, run_id: str) -> RunResult:
        """Cancel a run: a queued run never starts; a running one stops within a second (its
        step in flight is cancelled, its slots freed) and ends ``cancelled``. A run that already
        ended is left as it is. Returns the run as it now stands."""
        self._cancel_requested.add(run_id)
        try:
            record, _ = await cancel_in_store(
                self.store, run_id, host=self.runner.host, ttl_s=self.runner.lease_ttl_s
            )
        except BaseException:
            self._cancel_requested.discard(run_id)
            raise
        local = self._active.get(run_id)
        if local is not None:
            local.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(local)
        elif self._cancel_bus is not None or _is_redis(self.store):
            await self._bus().publish_cancel(run_id)
        self._cancel_requested.discard(run_id)
        return RunResult.from_records(record, await self.store.get_steps(run_id))

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, resume: bool = True
    ) -> RunResult:
        """Send signal ``name`` with ``payload`` to a run (docs/chain-format.md, Waits).

        The payload is checked against the wait's schema and kept, even when the run has not
        reached its wait yet. When the run was parked waiting for it and ``resume`` is true,
        the run continues here, and the result is where it then stands (ended, or parked at
        its next wait); otherwise the run as it stands. SignalRefused (nothing kept) for a
        name the chain does not wait for, a payload that does not fit, or a run that ended.
        """
        from ._errors import RunLocked
        from .runs._signals import send_signal, waits_on

        sent = await send_signal(self.store, run_id, name, payload)
        while resume and await waits_on(self.store, sent) is not None:
            local = self._active.get(run_id)
            if local is not None:
                # Its execution here has just parked and is ending; it looks for the signal
                # once more as it ends (and continues the run if it finds it): then look again.
                if local.done():
                    await asyncio.sleep(0.005)  # ended: its caller is about to let go of it
                else:
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(local)
                continue
            with contextlib.suppress(RunLocked, FencedOut):  # another process continues it
                return await self.resume(run_id, wait=False)
            break
        record = await self.store.get_run(run_id)
        return RunResult.from_records(record, await self.store.get_steps(run_id))

    def active(self) -> list[str]:
        """Ids of the runs executing in this runtime now."""
        return list(self._active)

    # ------------------------------------------------------------------ events

    def listen(self, run_id: str, sink: EventSink) -> None:
        """Call ``sink`` with each live event of ``run_id`` executed by this runtime."""
        self._listeners.setdefault(run_id, []).append(sink)

    def unlisten(self, run_id: str, sink: EventSink) -> None:
        """Stop calling ``sink`` (see :meth:`listen`)."""
        sinks = self._listeners.get(run_id, [])
        with contextlib.suppress(ValueError):
            sinks.remove(sink)
        if not sinks:
            self._listeners.pop(run_id, None)

    def _emit(self, event: RunEvent) -> None:
        for sink in (*self.event_sinks, *self._listeners.get(event.run_id, ())):
            try:
                sink(event)
            except Exception:  # noqa: S112 -- a watcher's failure never fails the run
                continue

    def _progress_for(self, run_id: str, progress: Progress | None) -> Progress | None:
        if not self.event_sinks and run_id not in self._listeners:
            return progress  # nobody listens: no events are built (the hot path stays bare)
        events = EventProgress(self._emit, run_id)
        return FanOut(progress or self.runner.progress, events)

    # ------------------------------------------------------------------ cancel plumbing

    async def _track(self, run_id: str, coro: Coroutine[Any, Any, RunResult]) -> RunResult:
        if run_id in self._active:
            coro.close()
            raise ChainRTError(f"run {run_id} is already executing in this runtime")
        task: asyncio.Task[Any] | None = None

        def register(started: asyncio.Task[Any]) -> None:
            nonlocal task
            task = self._active[run_id] = started

        self._ensure_watcher()
        try:
            # The run's first stretch (checks, its record, up to its first wait) runs now, in
            # the run's own task, rather than one turn of the loop later (bench/runtime_reuse.py).
            started, finished = start_eagerly(coro, on_task=register)
            if finished is not None:
                return cast(RunResult, finished.value)
            return cast(RunResult, await started)
        except (asyncio.CancelledError, FencedOut):
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the caller itself was cancelled
            result = await self._cancelled_result(run_id)
            if result is None:
                raise
            # A run stopped by cancellation reports no end: its event stream gets one here.
            self._emit(
                RunEvent("run_finished", run_id, _now(), data=result.model_dump(mode="json"))
            )
            return result
        finally:
            if self._active.get(run_id) is task:
                del self._active[run_id]

    async def _cancelled_result(self, run_id: str) -> RunResult | None:
        """The run's result if it was cancelled. A cancel fences the owner out before it writes
        ``cancelled``: when this runtime asked for the cancel, wait the moment that takes."""
        for _ in range(20):
            record = await self.store.get_run(run_id)
            if record.status == "cancelled":
                return RunResult.from_records(record, await self.store.get_steps(run_id))
            if run_id not in self._cancel_requested:
                return None
            await asyncio.sleep(0.05)
        return None

    def _bus(self) -> Any:
        if self._cancel_bus is None:
            from ._bus import CancelBus

            self._cancel_bus = CancelBus(self.store.raw_url)
        return self._cancel_bus

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """Stop local runs that another process cancelled: by pub/sub on Redis, else by looking
        at their records twice a second."""
        if _is_redis(self.store):
            async for run_id in self._bus().cancels():
                self._stop_local(run_id)
            return
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            for run_id in list(self._active):
                with contextlib.suppress(ChainRTError):
                    if (await self.store.get_run(run_id)).status == "cancelled":
                        self._stop_local(run_id)

    def _stop_local(self, run_id: str) -> None:
        task = self._active.get(run_id)
        if task is not None and not task.done():
            self._cancel_requested.add(run_id)
            task.add_done_callback(lambda _: self._cancel_requested.discard(run_id))
            task.cancel()


def _now() -> float:
    import time

    return time.time()


def _is_redis(store: CheckpointStore) -> bool:
    return store.raw_url.split("://", 1)[0].lower() in ("redis", "rediss")


def _spec_of(chain: Any) -> tuple[ChainSpec, Path | None]:
    if isinstance(chain, ChainSpec):
        return chain, None
    if isinstance(chain, str | Path):
        loaded = load_spec(chain)
        return loaded.spec, loaded.source_dir
    spec = getattr(chain, "spec", None)
    if not isinstance(spec, ChainSpec):
        raise TypeError(f"expected a Chain, a ChainSpec or a path, got {type(chain).__name__}")
    source_dir: Path | None = chain.source_dir
    return spec, source_dir


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
    runtime = Runtime(store, pool, limiter=limiter, hooks=hooks, progress=progress, trace=trace)
    async with runtime:
        yield runtime
