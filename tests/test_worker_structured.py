"""A real local worker: ``response_format`` (json_schema) and ``tools`` through the official
OpenAI client, and bad schemas refused with a 400 that says what is wrong."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from jsonschema import Draft202012Validator
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from worker_fixtures import WorkerProcess

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[0-9]{4}$"},
        "status": {"enum": ["pending", "shipped", "delivered"]},
        "items": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["order_id", "status", "items"],
    "additionalProperties": False,
}
LOOKUP: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look an order up by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^[0-9]{4}$"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Where is my order 1042? It has a lamp and a chair."}
]


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with WorkerProcess("--engine", "local") as proc:
        yield proc


def test_json_schema_response_format_matches_the_schema(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model="local",
        messages=ASK,
        max_tokens=120,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True},
        },
    )
    value = json.loads(answer.choices[0].message.content or "")
    assert list(Draft202012Validator(ORDER_SCHEMA).iter_errors(value)) == []
    assert answer.choices[0].finish_reason == "stop"


def test_streamed_json_schema_answer_is_valid_too(worker: WorkerProcess) -> None:
    stream = worker.openai().chat.completions.create(
        model="local",
        messages=ASK,
        max_tokens=120,
        temperature=0,
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": ORDER_SCHEMA},
        },
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert list(Draft202012Validator(ORDER_SCHEMA).iter_errors(json.loads(text))) == []


def test_forced_tool_call_round_trip(worker: WorkerProcess) -> None:
    client = worker.openai()
    first = client.chat.completions.create(
        model="local",
        messages=ASK,
        max_tokens=80,
        temperature=0,
        tools=[LOOKUP, WEATHER],
        tool_choice={"type": "function", "function": {"name": "lookup_order"}},
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name == "lookup_order"
    args = json.loads(call.function.arguments)
    assert set(args) == {"order_id"}
    assert len(args["order_id"]) == 4
    assert call.id.startswith("call_")
    # The tool's result goes back with the assistant's call; the model then answers in text.
    second = client.chat.completions.create(
        model="local",
        max_tokens=60,
        temperature=0,
        tools=[LOOKUP, WEATHER],
        tool_choice="none",
        messages=[
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": call.function.arguments},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": '{"status": "shipped", "carrier": "UPS", "eta": "2026-12-02"}',
            },
        ],
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content


def test_required_tool_choice_picks_one_of_the_tools(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=80,
        temperature=0,
        tools=[LOOKUP, WEATHER],
        tool_choice="required",
    )
    calls = answer.choices[0].message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name in ("lookup_order", "get_weather")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_streamed_tool_call_arrives_as_one_delta(worker: WorkerProcess) -> None:
    stream = worker.openai().chat.completions.create(
        model="local",
        messages=ASK,
        max_tokens=80,
        temperature=0,
        stream=True,
        tools=[LOOKUP],
        tool_choice="required",
    )
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert len(deltas) == 1
    assert deltas[0].function is not None
    assert deltas[0].function.name == "lookup_order"
    assert json.loads(deltas[0].function.arguments or "")["order_id"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "banana"}}}},
            "not a valid JSON Schema: at type",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": {"minLength": -1}}}}}},
            "not a valid JSON Schema: at properties/a/minLength",
        ),
        ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]}, "tool 'f' parameters"),
        ({"tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not a tool"),
        ({"tools": [LOOKUP], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [LOOKUP, LOOKUP]}, "same name"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": {"$ref": "https://example.com/s.json"}}}}}},
            "grammar",
        ),
    ],
    ids=["bad_type", "negative_min_length", "no_schema", "bad_tool_params", "unknown_choice", "bad_choice", "duplicate_tools", "remote_ref"],
)  # fmt: skip
def test_bad_schemas_are_refused_with_a_400(
    worker: WorkerProcess, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=says) as info:
        worker.openai().chat.completions.create(
            model="local", messages=ASK, max_tokens=8, extra_body=body
        )
    assert info.value.status_code == 400
    # The worker is unharmed: the next request is served.
    ok = worker.post(
        "/v1/chat/completions", json={"model": "local", "messages": ASK, "max_tokens": 1}
    )
    assert ok.status_code == 200
