"""``ChatChainrt``: a LangChain chat model over chainrt's dispatcher (docs/dispatch.md; README.md).

Existing LangChain code points at the worker pool and gains what an LLM step has: fallbacks in
order, circuit breakers per endpoint, retries only when they fit the call's deadline, a static
last-resort answer. Every call is one :class:`~chainrt.dispatch.LlmCall` with a deadline of
``timeout`` seconds, or the deadline of the chain step it runs in when that comes sooner.

    llm = ChatChainrt(model="primary", fallbacks=["local"], pool="pool.yaml", timeout=8)
    llm.invoke("Where is order 1042?").usage_metadata     # {'input_tokens': ..., ...}

Streaming (``stream``/``astream``, ``astream_events``) yields the answer's text as the worker
or the local model generates it, then a closing chunk that carries usage and metadata. A model
that fails before its first token falls back as ``invoke`` does; one that fails after tokens
were yielded (a dropped connection, the deadline, invalid JSON) raises
:class:`~chainrt.dispatch.DispatchFailed`: chunks already handed out cannot be taken back.

Structured output and tool calling run on constrained decoding (docs/dispatch.md): the answer is decoded
into a JSON Schema by the engine itself, so even the small local model returns valid JSON of the
schema. ``bind_tools`` offers the tools in a system message and decodes the answer into a
tool-call schema (``{"name": ..., "arguments": {...}}``), which comes back as ``tool_calls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field

from .._errors import ChainRTError, InputError
from .._runtime import default_hooks
from .._settings import get_settings
from ..dispatch import Dispatcher, DispatchFailed, LlmAnswer, LlmCall, Priority, make_dispatcher
from ..toolcalls import InvalidSchema, ToolSpec, tool_call_schema, tools_instruction
from ._answer import answer_chunks, chat_result
from ._loop import aiterate_on_loop, iterate_sync, on_loop, on_shutdown, run_sync
from ._messages import to_chat_pairs, with_json_instruction, with_system_text
from ._steps import STEP_DEADLINE
from ._tools import tool_choice as tool_choice_of
from ._tools import tool_specs

__all__ = ["ChatChainrt"]

_CALL_OPTIONS = frozenset(
    {"model", "max_tokens", "temperature", "timeout", "json_mode", "schema", "tools", "tool_choice"}
)
"""Per-call keyword arguments (``invoke(..., max_tokens=8)`` or ``bind(...)``) that are honoured."""

_dispatchers: dict[str, Dispatcher] = {}
"""Dispatchers opened for pool files, one per file, living on the background loop."""


async def _close_dispatchers() -> None:
    opened = list(_dispatchers.values())
    _dispatchers.clear()
    for dispatcher in opened:
        await dispatcher.close()


on_shutdown(_close_dispatchers)


def _shared_dispatcher(pool: str | None) -> Dispatcher:
    """The dispatcher for the pool file at ``pool`` (None: only ``local``), opened once."""
    key = str(Path(pool).resolve()) if pool else ""
    dispatcher = _dispatchers.get(key)
    if dispatcher is None:
        dispatcher = make_dispatcher(pool or None, hooks=default_hooks(get_settings()))
        _dispatchers[key] = dispatcher
    return dispatcher


class ChatChainrt(BaseChatModel):
    """A chat model answered by chainrt's worker pool, with fallbacks, breakers and deadlines.

    ``model`` and every entry of ``fallbacks`` name models of the pool file (``pool``, by default
    ``CHAINRT_POOL`` as set when the model is made), or ``local``: the in-process small model,
    always available. One call is tried on ``model``, then on each fallback, retried only while
    a retry fits its ``timeout``; when every model fails, ``static_answer`` (if set) is
    returned, else :class:`~chainrt.dispatch.DispatchFailed` is raised.

    Per call, ``model``, ``max_tokens``, ``temperature``, ``timeout`` and ``json_mode`` may be
    overridden (``llm.invoke(text, max_tokens=8)``). ``bind_tools`` and
    ``with_structured_output`` work through constrained decoding (one tool call per answer).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str = Field(default="local", min_length=1, description="Model of the pool, or 'local'.")
    fallbacks: list[str] = Field(
        default_factory=list, description="Models tried in order when the primary cannot answer."
    )
    pool: str | Path | Dispatcher | None = Field(
        default_factory=lambda: get_settings().pool,
        exclude=True,
        description="Pool YAML path, or a Dispatcher (default: CHAINRT_POOL); None: only 'local'.",
    )
    max_tokens: int = Field(default=256, ge=1, le=1_000_000, description="Most tokens to generate.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    timeout: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of one call in seconds, covering every retry and fallback.",
    )
    static_answer: str | None = Field(
        default=None, description="Last-resort answer when every model failed."
    )
    stop: list[str] | None = Field(default=None, description="Stop sequences.")
    max_retries: int = Field(
        default=1, ge=0, le=10, description="Retries per model, made only when they fit."
    )
    priority: Priority = Field(default="normal", description="Admission priority at the workers.")
    streaming: bool = Field(
        default=False, description="Use the streaming path by default (LangChain convention)."
    )

    # ------------------------------------------------------------------ LangChain metadata

    @property
    def _llm_type(self) -> str:
        return "chainrt"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        pool = "<dispatcher>" if isinstance(self.pool, Dispatcher) else self.pool
        return {
            "model": self.model,
            "fallbacks": list(self.fallbacks),
            "pool": None if pool is None else str(pool),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "timeout": self.timeout,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider="chainrt",
            ls_model_name=model if isinstance(model, str) else self.model,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # ------------------------------------------------------------------ one call

    def _call(
        self, messages: list[BaseMessage], stop: list[str] | None, run_id: str, options: Any
    ) -> tuple[LlmCall, float, list[ToolSpec]]:
        """The dispatcher call for ``messages``, its deadline (unix seconds) and bound tools."""
        unknown = sorted(set(options) - _CALL_OPTIONS - {"stream"})
        if unknown:
            raise InputError(
                f"ChatChainrt got unsupported argument(s) {', '.join(unknown)}; per call it "
                f"accepts {', '.join(sorted(_CALL_OPTIONS))}"
            )
        pairs = to_chat_pairs(messages)
        schema = options.get("schema")
        json_schema: dict[str, Any] | None = schema
        tools = tool_specs(options.get("tools"))
        choice = str(options.get("tool_choice") or "auto")
        if tools and choice != "none":
            json_schema = tool_call_schema(tools, choice)
            pairs = with_system_text(pairs, tools_instruction(tools, choice) or "")
        elif schema is not None:
            pairs = with_json_instruction(pairs, schema)
        call = LlmCall(
            model=str(options.get("model") or self.model),
            messages=pairs,
            max_tokens=int(options.get("max_tokens") or self.max_tokens),
            temperature=float(options.get("temperature", self.temperature)),
            json_output=bool(options.get("json_mode")) or json_schema is not None,
            json_schema=json_schema,
            stop=stop if stop is not None else self.stop,
            fallbacks=list(self.fallbacks),
            static_answer=self.static_answer,
            attempts=self.max_retries + 1,
            priority=self.priority,
            run_id=run_id,
            step_id="chat",
        )
        deadline = time.time() + float(options.get("timeout") or self.timeout)
        step_deadline = STEP_DEADLINE.get()
        if step_deadline is not None:  # inside a chain's runnable step: its allotment rules
            deadline = min(deadline, step_deadline)
        return call, deadline, tools if choice != "none" else []

    async def _answer(self, call: LlmCall, deadline: float) -> LlmAnswer:
        """Dispatch on the background loop, where the pool's connections live."""
        dispatcher = (
            self.pool
            if isinstance(self.pool, Dispatcher)
            else _shared_dispatcher(None if self.pool is None else str(self.pool))
        )
        return await dispatcher.complete(call, deadline)

    # ------------------------------------------------------------------ BaseChatModel hooks

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call, deadline, tools = self._call(messages, stop, _run_id(run_manager), kwargs)
        return chat_result(call, run_sync(self._answer(call, deadline)), tools)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call, deadline, tools = self._call(messages, stop, _run_id(run_manager), kwargs)
        return chat_result(call, await on_loop(self._answer(call, deadline)), tools)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call, deadline, tools = self._call(messages, stop, _run_id(run_manager), kwargs)
        if tools:  # a tool call is decoded from the whole answer
            yield from answer_chunks(call, run_sync(self._answer(call, deadline)), tools)
            return
        yield from iterate_sync(self._pieces(call, deadline))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call, deadline, tools = self._call(messages, stop, _run_id(run_manager), kwargs)
        if tools:  # a tool call is decoded from the whole answer
            for chunk in answer_chunks(call, await on_loop(self._answer(call, deadline)), tools):
                yield chunk
            return
        async for chunk in aiterate_on_loop(self._pieces(call, deadline)):
            yield chunk

    async def _pieces(self, call: LlmCall, deadline: float) -> AsyncIterator[ChatGenerationChunk]:
        """The streamed answer as chunks (runs on the background loop, beside the pool)."""
        pieces: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        call.on_token = functools.partial(_put, pieces, "text")
        call.on_attempt = functools.partial(_put, pieces, "attempt")
        task = asyncio.ensure_future(self._answer(call, deadline))
        task.add_done_callback(lambda _: pieces.put_nowait(("end", None)))
        streamed = 0
        try:
            while True:
                kind, value = await pieces.get()
                if kind == "end":
                    break
                if kind == "text":
                    streamed += 1
                    yield ChatGenerationChunk(message=AIMessageChunk(content=value))
                elif streamed and value.status not in ("ok", "deadline"):
                    raise DispatchFailed(
                        f"model {value.model!r} failed after {streamed} chunk(s) were streamed "
                        f"({value.status}: {value.detail}); streamed chunks cannot be taken "
                        "back, so no fallback is tried mid-stream",
                        [value],
                    )
            answer = task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ChainRTError):
                    await task
        *_, closing = answer_chunks(call, answer, [])  # the text was streamed already
        yield closing

    # ------------------------------------------------------------------ declarative methods

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with ``tools`` offered on every call; answers may carry ``tool_calls``.

        ``tools``: pydantic classes, functions, LangChain tools or OpenAI tool dicts.
        ``tool_choice``: ``auto`` (default: a call or a text answer), ``any``/``required``/True
        (some tool must be called), ``none``, or a tool's name (that tool must be called).
        The answer is decoded into the tool-call schema, so a call always names a bound tool and
        its arguments match that tool's schema. One call per answer.
        """
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        specs = tool_specs(formatted)
        choice = tool_choice_of(tool_choice)
        try:
            tool_call_schema(specs, choice)  # an unknown tool name fails here, not at invoke
        except InvalidSchema as exc:
            raise InputError(f"ChatChainrt.bind_tools: {exc}") from None
        return super().bind(tools=formatted, tool_choice=choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: Literal["json_schema", "json_mode", "function_calling"] = "json_schema",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Answers parsed into ``schema`` (pydantic class, TypedDict or JSON schema dict).

        ``json_schema`` (default): the answer is decoded into the schema (constrained decoding)
        and the schema is also shown to the model in a system message. ``function_calling``: the
        schema is bound as the one tool and its call's arguments are the answer. ``json_mode``:
        any JSON object; the prompt must describe the shape. A pydantic class yields instances
        of it (validated), anything else a dict. ``strict`` is accepted for compatibility: the
        constraint already enforces the schema.
        """
        if kwargs:
            raise InputError(f"with_structured_output got unsupported argument(s) {kwargs}")
        if method not in ("json_schema", "json_mode", "function_calling"):
            raise InputError(
                f"method must be json_schema, json_mode or function_calling, got {method!r}"
            )
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        ls_format = {
            "ls_structured_output_format": {
                "kwargs": {"method": method, "strict": strict},
                "schema": schema,
            }
        }
        llm: Runnable[Any, Any]
        parser: Runnable[Any, Any]
        if method == "function_calling":
            tool = convert_to_openai_tool(schema)
            name = str(tool["function"]["name"])
            llm = self.bind_tools([tool], tool_choice=name, **ls_format)
            if is_pydantic:
                parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
            else:
                parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        else:
            if method == "json_mode":
                llm = self.bind(json_mode=True, **ls_format)
            else:
                llm = self.bind(schema=convert_to_json_schema(schema), **ls_format)
            if is_pydantic:
                parser = PydanticOutputParser(pydantic_object=schema)
            else:
                parser = JsonOutputParser()
        if not include_raw:
            return llm | parser
        with_parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        without = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | with_parsed.with_fallbacks(
            [without], exception_key="parsing_error"
        )


def _run_id(run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None) -> str:
    return run_manager.run_id.hex if run_manager is not None else ""


def _put(queue: asyncio.Queue[tuple[str, Any]], kind: str, value: Any) -> None:
    queue.put_nowait((kind, value))
