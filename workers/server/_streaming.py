"""Streamed answers (``"stream": true``): server-sent events in OpenAI's chunk format.

The first piece is awaited before any header is sent, so a request that fails at once (out of
memory in the prompt, say) still gets a real status code. After that, an engine failure arrives
as an ``{"error": ...}`` event followed by ``[DONE]`` (the OpenAI client raises it as an
APIError). A client that goes away mid-stream stops the generation at its next token; the slot
is released however the stream ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from chainrt.engines import GenerationRequest, GenerationResult, StreamDelta
from chainrt.errors import EngineDead, EngineOOM, WorkerError
from chainrt.toolcalls import parse_tool_answer

from ._admission import Slot
from ._context import RequestContext
from ._http import SSE_DONE, HttpError, SSEResponse, aclose, run_until_disconnect, sse
from ._openai import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_chunk,
    completion_chunk,
    error_body,
)
from ._reload import EngineLease, ServingEngines, stream_on

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["StreamHost", "stream_answer"]

T = TypeVar("T")


class StreamHost(Protocol):
    """What a stream needs of the request handler that started it (``GenerationHandler``).

    A protocol, so that this module does not import the handler that imports it.
    """

    engines: ServingEngines

    async def call_engine(self, work: Awaitable[T]) -> T:
        """``work``, with the handler's engine-failure bookkeeping around it."""
        ...

    def engine_failure(self, exc: EngineOOM | EngineDead) -> HttpError:
        """The error answer for ``exc`` (recovery started)."""
        ...

    def record(self, result: GenerationResult, ctx: RequestContext, seconds: float) -> None:
        """Count a finished generation."""
        ...

    def finish(self, ctx: RequestContext, started: float) -> None:
        """Close the request's books (metrics, observer)."""
        ...


async def stream_answer(
    handler: StreamHost,
    request: Request,
    endpoint: Literal["chat", "completions"],
    parsed: ChatCompletionRequest | CompletionRequest,
    gen: GenerationRequest,
    ctx: RequestContext,
    slot: Slot,
    lease: EngineLease,
    started: float,
) -> SSEResponse:
    """Start the generation and return the SSE response that carries it.

    The response owns ``slot`` and ``lease`` (the engine this request runs on) and releases both
    when the stream ends, however it ends.

    ``started`` is when the request arrived (``time.perf_counter()``).
    """
    # A request handed over by a reload starts on the new engine: the lease says which answered.
    pieces, first = await run_until_disconnect(
        request, handler.call_engine(stream_on(handler.engines, lease, gen))
    )
    chat = endpoint == "chat"
    rid = ctx.request_id
    model = ctx.attributes["model"] = lease.served.answer_name(parsed.model)

    def piece(text: str) -> bytes:
        if chat:
            return sse(chat_chunk(rid, model, content=text))
        return sse(completion_chunk(rid, model, text=text))

    def final(result: GenerationResult) -> list[bytes]:
        out = [
            sse(chat_chunk(rid, model, finish=result.finish_reason))
            if chat
            else sse(completion_chunk(rid, model, finish=result.finish_reason))
        ]
        if parsed.include_usage:
            usage = chat_chunk if chat else completion_chunk
            out.append(sse(usage(rid, model, usage=result)))
        return out

    # Offered tools: the JSON of a call is held back and sent as one tool_calls delta at the end.
    tools = isinstance(parsed, ChatCompletionRequest) and parsed.tool_schema() is not None

    def tool_answer(result: GenerationResult) -> list[bytes]:
        assert isinstance(parsed, ChatCompletionRequest)
        content, calls = parse_tool_answer(result.text, parsed.tool_specs())
        if not calls:
            return [piece(content or ""), *final(result)]
        body = chat_chunk(rid, model, tool_calls=calls, finish="tool_calls")
        out = [sse(body)]
        if parsed.include_usage:
            out.append(sse(chat_chunk(rid, model, usage=result)))
        return out

    async def events() -> AsyncIterator[bytes]:
        if chat:
            yield sse(chat_chunk(rid, model, role=True, content=""))
        delta: StreamDelta = first
        while True:
            if delta.text and not tools:
                yield piece(delta.text)
            if delta.result is not None:
                handler.record(delta.result, ctx, time.perf_counter() - started)
                for event in tool_answer(delta.result) if tools else final(delta.result):
                    yield event
                break
            try:
                delta = await anext(pieces)
            except (EngineOOM, EngineDead) as exc:
                error = handler.engine_failure(exc)
                ctx.attributes["error"] = error.kind
                yield sse(error.body)
                break
            except WorkerError as exc:
                ctx.attributes["error"] = "engine_error"
                yield sse(error_body("engine_error", exc.message))
                break
            except StopAsyncIteration:
                ctx.attributes["error"] = "engine_error"
                yield sse(
                    error_body("engine_error", "the engine ended the stream without a result")
                )
                break
        yield SSE_DONE

    async def cleanup(disconnected: bool) -> None:
        await aclose(pieces)  # stops the engine at its next token if it is still generating
        slot.release()
        lease.release()
        ctx.status = 499 if disconnected else 200
        if disconnected:
            ctx.attributes["error"] = "client_disconnected"
        handler.finish(ctx, started)

    return SSEResponse(events(), cleanup)
