"""The generation endpoints (``/v1/chat/completions``, ``/v1/completions``): one request's path.

headers → bounded body → validation → model → prompt tokens → deadline → readiness → priority
queue (engine slot) → memory admission → injected faults → engine (whole or streamed) → answer.
Every exit releases the slot; an engine failure fails only this request (503) and starts recovery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from chainrt import wire
from chainrt.engines import (
    ContextLengthExceeded,
    Engine,
    GenerationRequest,
    GenerationResult,
)
from chainrt.errors import EngineDead, EngineOOM, WorkerError

from ._admission import (
    AdmissionQueue,
    Admit,
    NeverFits,
    QueueFull,
    Slot,
    capacity_tokens,
    decide,
)
from ._config import WorkerConfig
from ._context import RequestContext, RequestObserver, current_request, parse_traceparent
from ._faults import FaultInjector, InjectedError
from ._health import HealthMonitor
from ._http import (
    ClientGone,
    HttpError,
    SSEResponse,
    json_response,
    parse_deadline,
    parse_priority,
    read_body,
    retry_after,
    run_until_disconnect,
)
from ._metrics import WorkerMetrics
from ._openai import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidBody,
    chat_answer,
    completion_response,
    error_body,
    new_id,
    parse_body,
)
from ._recovery import RecoveryManager
from ._reload import EngineLease, ServingEngines, generate_on
from ._responses import server_hops, with_hops
from ._streaming import stream_answer

__all__ = ["Endpoint", "GenerationHandler"]

log = logging.getLogger("chainrt.worker")

T = TypeVar("T")
Endpoint = Literal["chat", "completions"]
_LONG_PROMPT_CHARS = 8192
"""Prompts longer than this are tokenized in a thread, off the event loop."""


class GenerationHandler:
    """Serves generation requests for one engine."""

    def __init__(
        self,
        engines: ServingEngines,
        config: WorkerConfig,
        *,
        queue: AdmissionQueue,
        health: HealthMonitor,
        recovery: RecoveryManager,
        metrics: WorkerMetrics,
        faults: FaultInjector | None,
        observer: RequestObserver,
    ) -> None:
        self.engines = engines
        self.config = config
        self.queue = queue
        self.health = health
        self.recovery = recovery
        self.metrics = metrics
        self.faults = faults
        self.observer = observer
        self.drain_tokens_per_s = 50.0
        """Recent generation speed (moving average), for the 429 retry estimate."""

    @property
    def engine(self) -> Engine:
        """The engine new requests go to (a hot reload may swap it)."""
        return self.engines.current.engine

    @property
    def names(self) -> list[str]:
        """Every model name this worker answers to."""
        return self.engines.names

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._serve(request, "chat")

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._serve(request, "completions")

    async def _serve(self, request: Request, endpoint: Endpoint) -> Response:
        started = time.perf_counter()
        headers = request.headers
        ctx = RequestContext(
            request_id=new_id("chatcmpl" if endpoint == "chat" else "cmpl"),
            endpoint=endpoint,
            traceparent=parse_traceparent(headers.get("traceparent")),
            tracestate=headers.get("tracestate"),
        )
        token = current_request.set(ctx)
        self.observer.request_started(ctx)
        try:
            response = await self._handle(request, endpoint, ctx, started)
        except HttpError as err:
            ctx.attributes["error"] = err.kind
            response = err.response()
        except ClientGone:
            ctx.attributes["error"] = "client_disconnected"
            response = Response(status_code=499)  # nobody is left to read it
        except Exception as exc:  # the worker answers 500 and lives on
            log.exception("unexpected error serving %s", ctx.request_id)
            ctx.attributes["error"] = type(exc).__name__
            response = json_response(
                error_body("internal_error", f"the worker failed on this request: {exc}"), 500
            )
        finally:
            current_request.reset(token)
        if not isinstance(response, SSEResponse):  # a stream reports when it ends, not now
            ctx.status = response.status_code
            self.finish(ctx, started)
        return response

    def finish(self, ctx: RequestContext, started: float) -> None:
        """Count the request and tell the observer; called once per request."""
        self.metrics.requests.labels(endpoint=ctx.endpoint, status=str(ctx.status)).inc()
        if ctx.status == 200:
            self.metrics.latency.labels(endpoint=ctx.endpoint).observe(
                time.perf_counter() - started
            )
        self.observer.request_finished(ctx)

    async def _handle(
        self, request: Request, endpoint: Endpoint, ctx: RequestContext, started: float
    ) -> Response:
        ctx.deadline = deadline = parse_deadline(request.headers.get("x-chainrt-deadline"))
        ctx.priority = priority = parse_priority(request.headers.get("x-priority"))
        body = await read_body(request, self.config.max_body_bytes)
        try:
            parsed = parse_body(body, chat=endpoint == "chat")
        except InvalidBody as exc:
            raise HttpError(400, "invalid_request_error", str(exc), param=exc.param) from None
        if parsed.model not in self.names:
            raise HttpError(
                404,
                "invalid_request_error",
                f"model {parsed.model[:100]!r} is not served here; this worker serves "
                f"{', '.join(map(repr, self.names))}",
                param="model",
                code="model_not_found",
            )
        ctx.attributes["model"] = parsed.model
        gen = self._generation_request(parsed, ctx, deadline, priority)
        prompt_tokens = await self._count_tokens(gen)
        if parsed.limit() is None:  # chat without max_tokens: as much as fits, within reason
            cap = capacity_tokens(self.engine.memory(), self.config.watermark)
            room = self.config.default_max_tokens if cap is None else cap - prompt_tokens
            gen.max_tokens = max(1, min(self.config.default_max_tokens, room))
        ctx.attributes["prompt_tokens"] = prompt_tokens
        if deadline is not None and deadline <= time.time():
            raise self._reject(504, "deadline", "the request's deadline passed before it started")
        await self._wait_ready(deadline)
        slot: Slot | None = await self._acquire(request, priority, deadline)
        assert slot is not None
        queued = time.perf_counter()
        lease: EngineLease | None = self.engines.lease()  # this request's engine, reload or not
        assert lease is not None
        try:
            self._admit(slot, prompt_tokens, gen.max_tokens, ctx)
            if self.faults is not None:
                # A client that leaves during an injected delay or hang is gone at once (499),
                # as from the queue: a hedge's loser is seen to disconnect while held here.
                await run_until_disconnect(request, self._inject_faults(deadline))
            ctx.attributes["model"] = lease.served.answer_name(parsed.model)
            hops = server_hops(started, queued, time.perf_counter())
            if parsed.stream:
                response = await stream_answer(
                    self, request, endpoint, parsed, gen, ctx, slot, lease, started
                )
                slot = lease = None  # the stream owns both now and releases them when it ends
                return response
            result = await run_until_disconnect(
                request, self.call_engine(generate_on(self.engines, lease, gen))
            )
            # The engine that answered: a reload may have handed the request to the new one.
            model = ctx.attributes["model"] = lease.served.answer_name(parsed.model)
            self.record(result, ctx, time.perf_counter() - started)
            if isinstance(parsed, CompletionRequest):
                completion = completion_response(ctx.request_id, model, result)
                return json_response(with_hops(completion, hops))
            answer = with_hops(chat_answer(ctx.request_id, parsed, result), hops)
            answer["model"] = model  # the model that answered (a hot reload may have renamed it)
            return json_response(answer)
        finally:
            if slot is not None:
                slot.release()
            if lease is not None:
                lease.release()

    def _generation_request(
        self,
        parsed: ChatCompletionRequest | CompletionRequest,
        ctx: RequestContext,
        deadline: float | None,
        priority: str,
    ) -> GenerationRequest:
        limit = parsed.limit()
        if limit is not None and limit > self.config.max_tokens_limit:
            raise HttpError(
                400,
                "invalid_request_error",
                f"max_tokens={limit} is over this worker's limit of {self.config.max_tokens_limit}",
                param="max_tokens",
            )
        return GenerationRequest(
            messages=parsed.chat_messages() if isinstance(parsed, ChatCompletionRequest) else None,
            prompt=parsed.text() if isinstance(parsed, CompletionRequest) else None,
            max_tokens=limit or self.config.default_max_tokens,
            temperature=parsed.temperature,
            stop=parsed.stops(),
            json_output=isinstance(parsed, ChatCompletionRequest) and parsed.json_output,
            json_schema=parsed.json_schema if isinstance(parsed, ChatCompletionRequest) else None,
            deadline=deadline,
            priority=wire.PRIORITIES[priority],
            request_id=ctx.request_id,
            seed=parsed.seed,
        )

    async def _count_tokens(self, gen: GenerationRequest) -> int:
        size = len(gen.prompt or "") + sum(len(m.content) for m in gen.messages or [])
        try:
            self.engine.check_request(gen)  # a schema the engine cannot decode into: 400
            if size > _LONG_PROMPT_CHARS:
                return await asyncio.to_thread(self.engine.count_tokens, gen)
            return self.engine.count_tokens(gen)
        except ContextLengthExceeded as exc:
            raise self._reject(
                413, "never_fits", exc.message, kind="context_length_exceeded", param="messages"
            ) from None
        except WorkerError as exc:
            raise HttpError(400, "invalid_request_error", exc.message) from None

    async def _wait_ready(self, deadline: float | None) -> None:
        if self.health.ready:
            return
        wait = self.config.recovery_wait_s
        if deadline is not None:
            wait = min(wait, deadline - time.time())
        if not await self.health.wait_ready(wait):
            raise self._reject(
                503,
                "not_ready",
                f"the worker is not ready ({self.health.reason}); retry shortly",
                headers=retry_after(self.recovery.retry_after_s()),
            )

    async def _acquire(self, request: Request, priority: str, deadline: float | None) -> Slot:
        timeout = None if deadline is None else max(0.0, deadline - time.time())
        try:
            wait = self.queue.acquire(wire.PRIORITIES[priority], timeout)
            if self.queue.in_use < self.queue.slots:
                return await wait  # a slot is free: no need to watch the client
            self.metrics.queue_depth.set(self.queue.depth + 1)
            return await run_until_disconnect(request, wait)
        except QueueFull as exc:
            raise self._reject(429, "queue_full", str(exc), headers=retry_after(1)) from None
        except TimeoutError:
            raise self._reject(504, "deadline", "the deadline passed while queued") from None
        finally:
            self.metrics.queue_depth.set(self.queue.depth)
            self.metrics.slots_in_use.set(self.queue.in_use)

    def _admit(self, slot: Slot, prompt_tokens: int, max_tokens: int, ctx: RequestContext) -> None:
        stats = self.engine.memory()
        decision = decide(
            stats,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            watermark=self.config.watermark,
            reserved_bytes=self.queue.reserved_bytes,
            drain_tokens_per_s=self.drain_tokens_per_s,
        )
        if isinstance(decision, Admit):
            self.queue.reserve(slot, decision.reserve_bytes)
            ctx.attributes["admission"] = "admit"
            if stats is not None and stats.total_bytes > 0:
                used = stats.total_bytes - stats.free_bytes + self.queue.reserved_bytes
                self.metrics.memory_used_ratio.set(used / stats.total_bytes)
            return
        if isinstance(decision, NeverFits):
            advice = {} if decision.advice_max_tokens is None else {
                "advice": {"max_tokens": decision.advice_max_tokens}
            }  # fmt: skip
            raise self._reject(
                413,
                "never_fits",
                decision.message,
                kind="context_length_exceeded",
                param="max_tokens",
                extra=advice,
            )
        body = wire.insufficient_memory_body(
            decision.message,
            max_tokens=decision.advice_max_tokens,
            retry_after_s=decision.retry_after_s,
        )
        raise self._reject(
            429,
            wire.INSUFFICIENT_MEMORY,
            decision.message,
            headers=retry_after(decision.retry_after_s),
            body=body,
        )

    async def _inject_faults(self, deadline: float | None) -> None:
        assert self.faults is not None
        try:
            await self.faults.before_engine(deadline)
        except InjectedError as exc:
            raise HttpError(500, "injected_error", str(exc)) from None
        except TimeoutError:
            raise self._reject(504, "deadline", "the deadline passed (injected hang)") from None

    async def call_engine(self, work: Awaitable[T]) -> T:
        """Await an engine call, mapping its failures onto HTTP errors (and starting recovery)."""
        try:
            return await work
        except (EngineOOM, EngineDead) as exc:
            raise self.engine_failure(exc) from None
        except ContextLengthExceeded as exc:
            raise HttpError(413, "context_length_exceeded", exc.message) from None
        except WorkerError as exc:
            raise HttpError(500, "engine_error", exc.message) from None

    def engine_failure(self, exc: EngineOOM | EngineDead) -> HttpError:
        """Start recovery; the 503 this request gets."""
        self.recovery.engine_failed(exc)
        kind = "engine_oom" if isinstance(exc, EngineOOM) else "engine_unavailable"
        return HttpError(
            503,
            kind,
            f"{exc.message} (the worker is recovering in process; retry shortly)",
            headers=retry_after(self.recovery.retry_after_s()),
        )

    def record(self, result: GenerationResult, ctx: RequestContext, seconds: float) -> None:
        """Token metrics and context attributes of a finished generation."""
        self.metrics.prompt_tokens.inc(result.prompt_tokens)
        self.metrics.completion_tokens.inc(result.completion_tokens)
        ctx.attributes["completion_tokens"] = result.completion_tokens
        ctx.attributes["finish_reason"] = result.finish_reason
        if result.completion_tokens > 0:
            self.health.note_success()
        if result.completion_tokens > 1 and seconds > 0:
            rate = result.completion_tokens / seconds
            self.metrics.tokens_per_second.set(rate)
            self.drain_tokens_per_s = 0.8 * self.drain_tokens_per_s + 0.2 * rate

    def _reject(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> HttpError:
        """An admission refusal: counted by reason, answered in OpenAI's error shape."""
        self.metrics.admission_rejects.labels(reason=reason).inc()
        error = HttpError(status, kind or reason, message, headers=headers, body=body, param=param)
        if extra:
            error.body["error"].update(extra)
        return error
