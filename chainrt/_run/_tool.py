"""The ``tool`` step kind: a Python callable, sync (in a thread) or async (on the loop), with retries.

Async tools are cancelled at their deadline (and abandoned if they take more than a few ms to
stop: :func:`chainrt._bounded.within`). A sync tool runs in a daemon thread and is abandoned at
its deadline (Python cannot kill a thread); the attempt is recorded as timed out either way.

Retries go through the same pure decision as LLM attempts (:func:`~chainrt.dispatch._policy.
decide_retry`), driven by tenacity. A tool has no endpoints: every attempt is a fresh call, so an
attempt cut by ``attempt_timeout`` is retried at once (as an LLM attempt is retried on another
endpoint), and an attempt that raised is retried after the step's backoff (doubling, capped at
``max_backoff``) — each only while the retry fits before the step's deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from .._bounded import TaskHost, within
from .._context import StepContext
from .._errors import ChainRTError
from .._records import AttemptRecord, StepRecord
from ..dispatch._policy import MIN_ATTEMPT_S, Failure, MoveOn, Retry, decide_retry
from ..spec import StepSpec, render_value, resolve_callable
from ..store._built import attempt_record
from ._raised import describe_raise
from ._step import StepOutcome

if TYPE_CHECKING:
    from ._journal import RunJournal

__all__ = [
    "TOOL_HOST",
    "TOOL_JOURNAL",
    "ToolExecutor",
    "attempts_before",
    "call_tool",
    "run_tool",
    "sync_tools_running",
]

TOOL_HOST: ContextVar[TaskHost | None] = ContextVar("chainrt_tool_host", default=None)
"""The task that hosts the tool calls of the run executing in this task (set by the runner for
each execution: one task for a run's tool calls instead of one per call, :class:`TaskHost`)."""

TOOL_JOURNAL: ContextVar[RunJournal | None] = ContextVar("chainrt_tool_journal", default=None)
"""The journal of the run executing in this task (set by the runner for each execution). A tool
that takes ``ctx`` has each attempt written there (a ``running`` step record) before it is
called, so that ``ctx.attempt`` counts on after a crash: a re-run sees the attempt after the one
that was in flight, never 1 again."""


def attempts_before(record: StepRecord | None) -> int:
    """Attempts of a step that earlier executions of its run already made (0: none recorded):
    the highest attempt number its record holds, a ``running`` one (in flight at a crash) too."""
    if record is None:
        return 0
    return max([record.attempts, *(a.attempt for a in record.attempt_log)])


async def _mark_attempt(
    journal: RunJournal, step_id: str, number: int, log: list[AttemptRecord]
) -> None:
    """Write that attempt ``number`` of ``step_id`` starts now (before its tool is called)."""
    marker = StepRecord(
        step_id=step_id,
        status="running",
        attempts=number,
        started_at=time.time(),
        attempt_log=list(log),
    )
    await journal.record_step(marker)


_SHAPE_CACHE: dict[Callable[..., Any], tuple[bool, bool]] = {}


def _shape(fn: Callable[..., Any]) -> tuple[bool, bool]:
    """(takes ``ctx``, is a coroutine function) of a tool, worked out once per function."""
    shape = _SHAPE_CACHE.get(fn)
    if shape is None:
        try:
            wants = "ctx" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            wants = False
        shape = (wants, inspect.iscoroutinefunction(fn))
        _SHAPE_CACHE[fn] = shape
    return shape


_THREADS: collections.Counter[str] = collections.Counter()
_THREADS_LOCK = threading.Lock()


def sync_tools_running(run_id: str) -> int:
    """Sync tool calls of ``run_id`` whose thread still runs in this process, abandoned ones
    (a cancel, a deadline) included: a resume waits for them, so that the same tool never runs
    twice at once for one run (``chainrt serve`` does, ``chainrt/serve/_handling.py``)."""
    with _THREADS_LOCK:
        return _THREADS[run_id]


def _in_thread(
    fn: Callable[..., Any], kwargs: dict[str, Any], run_id: str = ""
) -> asyncio.Future[Any]:
    """Run a sync callable in a daemon thread; the future can be abandoned at a deadline."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value, exc = fn(**kwargs), None
        except BaseException as error:  # handed to the awaiting task, not swallowed
            value, exc = None, error
        finally:
            with _THREADS_LOCK:
                _THREADS[run_id] -= 1
                if _THREADS[run_id] <= 0:
                    del _THREADS[run_id]
        # If the loop is closed, nobody waits for this abandoned call any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, exc)

    with _THREADS_LOCK:
        _THREADS[run_id] += 1
    threading.Thread(target=target, name=f"chainrt-tool-{fn.__name__}", daemon=True).start()
    return future


_PLAIN = (str, int, bool, type(None))
"""Types that are always JSON (a str is escaped as needed, an int of any size is a number)."""


def _check_json(value: Any, what: str) -> None:
    if type(value) in _PLAIN:
        # json.dumps with allow_nan=False builds an encoder per call: ~5 us, a third of a
        # no-op tool step's own Python (bench/overhead.py). Floats go through it (NaN, inf).
        return
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ChainRTError(
            f"{what} returned a value that is not JSON-serialisable ({type(value).__name__}): {exc}"
        ) from None


class _Failed(Exception):
    """One attempt failed and may be retried: ``error_class`` is ``timeout`` or ``error``."""

    def __init__(self, error_class: str) -> None:
        super().__init__(error_class)
        self.error_class = error_class


class _OutOfTime(Exception):
    """The step's deadline has passed: no retry can help."""


def _limit(left_s: float, attempt_timeout_s: float | None) -> float:
    """How long an attempt may take: what is left of the step, capped by ``attempt_timeout``."""
    return left_s if attempt_timeout_s is None else min(left_s, attempt_timeout_s)


def call_tool(
    fn: Callable[..., Any], kwargs: dict[str, Any], run_id: str, step_id: str, number: int,
    limit: float,
) -> Awaitable[Any]:  # fmt: skip
    """Start attempt ``number`` of a tool that may take ``limit`` seconds: async tools on the
    loop, sync tools in a thread; its ``ctx`` (:class:`StepContext`) only if it takes one."""
    wants_ctx, is_async = _shape(fn)
    if wants_ctx:
        kwargs = {**kwargs, "ctx": StepContext(run_id, step_id, number, time.time() + limit)}
    if is_async:
        coro: Awaitable[Any] = fn(**kwargs)
        return coro
    return _in_thread(fn, kwargs, run_id)


class _Tries:
    """The attempts of one tool step: tenacity drives them, :func:`decide_retry` decides."""

    def __init__(
        self,
        fn: Callable[..., Any],
        kwargs: dict[str, Any],
        *,
        run_id: str,
        step_id: str,
        deadline: float,
        attempts: int,
        backoff_ms: float,
        max_backoff_ms: float,
        attempt_timeout_ms: float | None,
    ) -> None:
        self.fn, self.kwargs = fn, kwargs
        self.run_id, self.step_id, self.deadline = run_id, step_id, deadline
        self.max_tries = attempts
        self.max_backoff_s = max_backoff_ms / 1000
        self.attempt_timeout_s = None if attempt_timeout_ms is None else attempt_timeout_ms / 1000
        self.backoff_s = backoff_ms / 1000
        self.log: list[AttemptRecord] = []
        self.last_error = ""
        self.decision: Retry | MoveOn | None = None
        self.offset = 0
        """Attempts earlier executions made (a tool that takes ``ctx`` numbers on from them)."""
        self.journal: RunJournal | None = None
        """Where each attempt is written before its call (tools that take ``ctx``)."""

    async def attempt(self) -> StepOutcome:
        number = self.offset + len(self.log) + 1
        if self.deadline - time.time() <= 0:
            raise _OutOfTime
        if self.journal is not None:
            await _mark_attempt(self.journal, self.step_id, number, self.log)
        left = self.deadline - time.time()
        if left <= 0:
            raise _OutOfTime
        limit = _limit(left, self.attempt_timeout_s)
        started = time.perf_counter()
        try:
            value = await within(
                call_tool(self.fn, self.kwargs, self.run_id, self.step_id, number, limit),
                limit,
                host=TOOL_HOST.get(),
            )
            _check_json(value, f"tool of step {self.step_id!r}")
        except Exception as exc:  # a tool may raise anything; it is recorded, not propagated
            raise self.failed(number, exc, started) from None
        self._log(number, "ok", (time.perf_counter() - started) * 1000, None)
        return StepOutcome("completed", output=value, attempts=number, attempt_log=self.log)

    def failed(self, number: int, exc: Exception, started: float) -> _Failed | _OutOfTime:
        """Log attempt ``number`` (begun at ``started``, perf_counter), which raised ``exc``;
        return what to raise: ``_Failed`` (another attempt may help) or ``_OutOfTime``."""
        elapsed = (time.perf_counter() - started) * 1000
        if isinstance(exc, TimeoutError):
            self._log(number, "timeout", elapsed, None)
            self.last_error = f"timed out after {elapsed:.0f}ms"
            if self.deadline - time.time() <= 0:
                return _OutOfTime()
            return _Failed("timeout")  # the attempt timeout hit, not the deadline
        if isinstance(exc, ChainRTError):
            self.last_error = detail = exc.message
        else:  # the tool's own exception: where in the tool it was raised, and the trace
            self.last_error, detail = describe_raise(exc, self.fn)
        self._log(number, "error", elapsed, detail)
        return _Failed("error")

    def gave_up(self) -> StepOutcome:
        """The outcome once no further attempt will be made."""
        left = self.deadline - time.time()
        last = self.log[-1].status if self.log else "timeout"
        # A timeout with no room left for another attempt is the deadline's doing.
        timed_out = left <= 0 or (last == "timeout" and left < MIN_ATTEMPT_S)
        return StepOutcome(
            "timed_out" if timed_out else "failed",
            attempts=len(self.log),
            error=self.last_error or "no time left",
            attempt_log=self.log,
        )

    def _log(self, number: int, status: str, elapsed_ms: float, detail: str | None) -> None:
        self.log.append(attempt_record(number, status, round(elapsed_ms, 3), detail))

    # ------------------------------------------------------------------ tenacity hooks

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(exc, _Failed)
        decision = decide_retry(
            Failure(error_class=exc.error_class, elsewhere=exc.error_class == "timeout"),
            now=time.time(),
            deadline=self.deadline,
            reserve_s=0.0,
            tries_used=len(self.log),
            max_tries=self.max_tries,
            backoff_s=self.backoff_s,
            max_backoff_s=self.max_backoff_s,
            max_tokens=0,
            shrink=False,
        )
        self.decision = decision
        if isinstance(decision, MoveOn):
            return 0.0
        if decision.wait_s > 0:
            self.backoff_s *= 2
        return decision.wait_s

    def stop(self, state: RetryCallState) -> bool:
        return isinstance(self.decision, MoveOn)


async def run_tool(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    run_id: str,
    step_id: str,
    deadline: float,
    attempts: int,
    backoff_ms: float,
    max_backoff_ms: float,
    attempt_timeout_ms: float | None,
) -> StepOutcome:
    """Call a tool with retries, all inside ``deadline`` (unix seconds)."""
    # The first attempt runs on its own: tenacity's machinery costs tens of µs per call, more
    # than a whole no-op tool step, and most first attempts succeed; so does the retry state
    # (issue 18), made only when the first attempt fails. A first failure is replayed as
    # tenacity's first attempt, so that every wait and every stop is tenacity's.
    first: Exception | None = None
    # A tool that takes ctx numbers its attempts on from earlier executions (a crash, a resume),
    # each written before the call; the others pay for none of it.
    offset, journal = 0, None
    if _shape(fn)[0]:
        journal = TOOL_JOURNAL.get()
        if journal is not None:
            offset = attempts_before(journal.done.get(step_id))
    number = offset + 1
    if journal is not None and deadline > time.time():
        await _mark_attempt(journal, step_id, number, [])
    left = deadline - time.time()
    if left > 0:
        limit = _limit(left, None if attempt_timeout_ms is None else attempt_timeout_ms / 1000)
        started = time.perf_counter()
        try:
            work = call_tool(fn, kwargs, run_id, step_id, number, limit)
            value = await within(work, limit, host=TOOL_HOST.get())
            _check_json(value, f"tool of step {step_id!r}")
        except Exception as exc:  # a tool may raise anything; it is recorded, not propagated
            first = exc
        else:
            elapsed = round((time.perf_counter() - started) * 1000, 3)
            log = [attempt_record(number, "ok", elapsed)]
            return StepOutcome("completed", output=value, attempts=1, attempt_log=log)
    tries = _Tries(
        fn,
        kwargs,
        run_id=run_id,
        step_id=step_id,
        deadline=deadline,
        attempts=attempts,
        backoff_ms=backoff_ms,
        max_backoff_ms=max_backoff_ms,
        attempt_timeout_ms=attempt_timeout_ms,
    )
    tries.offset, tries.journal = offset, journal
    if first is None:  # no time left for a first attempt
        return tries.gave_up()
    replay = tries.failed(number, first, started)
    if isinstance(replay, _OutOfTime):
        return tries.gave_up()
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_Failed),
        wait=tries.wait,
        stop=tries.stop,
        sleep=asyncio.sleep,
        reraise=True,
    )
    pending: _Failed | None = replay
    try:
        async for attempt in retrying:
            with attempt:
                if pending is not None:
                    failure, pending = pending, None
                    raise failure
                return await tries.attempt()
    except (_Failed, _OutOfTime):
        return tries.gave_up()
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


class ToolExecutor:
    """Runs ``tool`` steps; resolves each tool reference once (path checks cost more than a call)."""

    def __init__(self, allowed_modules: tuple[str, ...] = ()) -> None:
        self.allowed_modules = allowed_modules
        self._tools: dict[tuple[str, Path], Callable[..., Any]] = {}

    def resolve(self, ref: str, chain_dir: Path) -> Callable[..., Any]:
        """The callable ``ref`` names, relative to ``chain_dir`` or an allow-listed module."""
        key = (ref, chain_dir)
        fn = self._tools.get(key)
        if fn is None:
            fn = resolve_callable(ref, chain_dir=chain_dir, allowed_modules=self.allowed_modules)
            self._tools[key] = fn
        return fn

    def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> Coroutine[Any, Any, StepOutcome]:
        """Call the step's tool with its rendered ``args`` as keyword arguments (the tool's
        reference is resolved and its arguments rendered here, at the call; what is awaited is
        :func:`run_tool` itself, with no coroutine around it)."""
        assert step.tool is not None
        fn = self.resolve(step.tool, source_dir or Path.cwd())
        retry = step.retry
        return run_tool(  # by position, in run_tool's order (keywords cost ~0.3 us a call)
            fn,
            render_value(step.args, scope) if step.args else {},
            run_id,
            step.id,
            deadline,
            retry.attempts,
            retry.backoff,
            retry.max_backoff,
            step.attempt_timeout,
        )
