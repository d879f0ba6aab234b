"""Running one step under its deadline: tools (sync or async) and LLM calls, with retries.

Async work is cancelled at the deadline. A sync tool runs in a daemon thread and is abandoned at
its deadline (Python cannot kill a thread); the step is recorded as timed out either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ._context import StepContext
from ._errors import ChainRTError
from .dispatch import Dispatcher, DispatchFailed, LlmCall
from .store._records import AttemptRecord

__all__ = ["StepOutcome", "call_tool", "run_llm", "run_tool"]


@dataclass(slots=True)
class StepOutcome:
    """How a step attempt sequence ended."""

    status: str
    """completed | partial | timed_out | failed"""
    output: Any = None
    attempts: int = 0
    model: str | None = None
    fallback: str | None = None
    error: str | None = None
    attempt_log: list[AttemptRecord] = field(default_factory=list)


_CTX_CACHE: dict[Callable[..., Any], bool] = {}


def _wants_ctx(fn: Callable[..., Any]) -> bool:
    wants = _CTX_CACHE.get(fn)
    if wants is None:
        try:
            wants = "ctx" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            wants = False
        _CTX_CACHE[fn] = wants
    return wants


def _in_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
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
        # If the loop is closed, nobody waits for this abandoned call any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=target, name=f"chainrt-tool-{fn.__name__}", daemon=True).start()
    return future


def call_tool(fn: Callable[..., Any], kwargs: dict[str, Any], ctx: StepContext) -> Awaitable[Any]:
    """Start one call of a tool: async tools on the loop, sync tools in a thread."""
    if _wants_ctx(fn):
        kwargs = {**kwargs, "ctx": ctx}
    if inspect.iscoroutinefunction(fn):
        coro: Awaitable[Any] = fn(**kwargs)
        return coro
    return _in_thread(fn, kwargs)


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ChainRTError(
            f"{what} returned a value that is not JSON-serialisable ({type(value).__name__}): {exc}"
        ) from None


async def run_tool(
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
) -> StepOutcome:
    """Call a tool with retries, all inside ``deadline`` (unix seconds)."""
    log: list[AttemptRecord] = []
    backoff_s = backoff_ms / 1000
    last_error = ""
    for attempt in range(1, attempts + 1):
        left = deadline - time.time()
        if left <= 0:
            break
        limit = left if attempt_timeout_ms is None else min(left, attempt_timeout_ms / 1000)
        started = time.perf_counter()
        ctx = StepContext(run_id, step_id, attempt, time.time() + limit)
        try:
            value = await asyncio.wait_for(call_tool(fn, kwargs, ctx), timeout=limit)
            _check_json(value, f"tool of step {step_id!r}")
        except TimeoutError:
            elapsed = (time.perf_counter() - started) * 1000
            log.append(
                AttemptRecord(attempt=attempt, status="timeout", elapsed_ms=round(elapsed, 3))
            )
            last_error = f"timed out after {elapsed:.0f}ms"
            if deadline - time.time() <= 0:
                return StepOutcome("timed_out", attempts=attempt, error=last_error, attempt_log=log)
            continue  # the attempt timeout hit, not the step's deadline: try again
        except Exception as exc:  # a tool may raise anything; it is recorded, not propagated
            elapsed = (time.perf_counter() - started) * 1000
            last_error = (
                exc.message if isinstance(exc, ChainRTError) else f"{type(exc).__name__}: {exc}"
            )
            log.append(
                AttemptRecord(
                    attempt=attempt, status="error", elapsed_ms=round(elapsed, 3), detail=last_error
                )
            )
            wait_s = min(backoff_s, max_backoff_ms / 1000)
            if attempt < attempts and time.time() + wait_s < deadline:
                await asyncio.sleep(wait_s)
                backoff_s *= 2
                continue
            return StepOutcome("failed", attempts=attempt, error=last_error, attempt_log=log)
        elapsed = (time.perf_counter() - started) * 1000
        log.append(AttemptRecord(attempt=attempt, status="ok", elapsed_ms=round(elapsed, 3)))
        return StepOutcome("completed", output=value, attempts=attempt, attempt_log=log)
    status = "timed_out" if deadline - time.time() <= 0 else "failed"
    return StepOutcome(
        status, attempts=len(log), error=last_error or "no time left", attempt_log=log
    )


async def run_llm(dispatcher: Dispatcher, call: LlmCall, deadline: float) -> StepOutcome:
    """Dispatch an LLM step; JSON steps get their output parsed."""
    try:
        answer = await dispatcher.complete(call, deadline)
    except DispatchFailed as exc:
        timed_out = deadline - time.time() <= 0.005
        return StepOutcome(
            "timed_out" if timed_out else "failed",
            attempts=len(exc.attempts),
            model=call.model,
            error=exc.message,
            attempt_log=exc.attempts,
        )
    output: Any = answer.text
    if call.json_output and not answer.partial:
        try:
            output = json.loads(answer.text)  # models' answers were checked by the dispatcher
        except ValueError:
            output = answer.text  # a static answer that is plain text stays text
    return StepOutcome(
        "partial" if answer.partial else "completed",
        output=output,
        attempts=len(answer.attempts),
        model=answer.model,
        fallback=answer.model if answer.model != call.model else None,
        attempt_log=answer.attempts,
    )
