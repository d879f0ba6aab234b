"""Constrained decoding: every engine's answer matches the request's JSON Schema.

Twenty schemas of growing complexity (``tests/structured_schemas.py``). llama.cpp runs the real
SmolLM2 (quick tier); torch runs a tiny random-weights Llama on the CPU (slow tier), so only the
constraint can make its output valid; vLLM has its own case in ``test_engine_vllm.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from bench_loader import gpu_oom_bench
from jsonschema import Draft202012Validator
from structured_schemas import SCHEMAS, bounded, prompt_for

from chainrt.engines import ChatMessage, GenerationRequest, LocalEngine
from chainrt.errors import WorkerError

IDS = [name for name, _ in SCHEMAS]


def request(name: str, schema: dict[str, Any] | None, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", prompt_for(name))],
        json_output=True,
        json_schema=schema,
        **kw,
    )


def assert_matches(text: str, schema: dict[str, Any]) -> None:
    value = json.loads(text)
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(value)]
    assert not errors, f"{text!r}: {errors}"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEngine]:
    eng = LocalEngine()
    yield eng
    asyncio.run(eng.close())


@pytest.mark.parametrize(("name", "schema"), SCHEMAS, ids=IDS)
async def test_local_engine_answers_match_the_schema(
    local: LocalEngine, name: str, schema: dict[str, Any]
) -> None:
    result = await local.generate(request(name, schema, max_tokens=160))
    assert result.finish_reason == "stop", result
    assert_matches(result.text, schema)


async def test_local_engine_json_object_without_schema(local: LocalEngine) -> None:
    result = await local.generate(request("status", None, max_tokens=120))
    assert isinstance(json.loads(result.text), dict)


def test_local_engine_refuses_a_schema_its_grammar_cannot_express(local: LocalEngine) -> None:
    bad = {"type": "object", "properties": {"x": {"$ref": "https://example.com/remote.json"}}}
    with pytest.raises(WorkerError, match="grammar") as info:
        local.check_request(request("x", bad))
    assert info.value.retryable is False


# -- torch: a random model, so the constraint alone makes the output valid ---------------------


@pytest.fixture(scope="module")
def torch_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("torch")
    pytest.importorskip("llguidance")
    from chainrt.engines._torch import TorchEngine

    bench = gpu_oom_bench()
    folder = bench.build_random_model(tmp_path_factory.mktemp("tiny") / "m", layers=2, hidden=128)
    eng = TorchEngine(folder, device="cpu", max_model_len=1024)
    yield eng
    asyncio.run(eng.close())


@pytest.mark.slow
@pytest.mark.timeout(600)  # torch + transformers imports take a minute on a loaded machine
async def test_torch_engine_random_model_answers_match_every_schema(torch_engine: Any) -> None:
    for name, open_schema in SCHEMAS:
        schema = bounded(open_schema)
        result = await torch_engine.generate(request(name, schema, max_tokens=600))
        assert result.finish_reason == "stop", (name, result)
        assert_matches(result.text, schema)


@pytest.mark.slow
async def test_torch_engine_refuses_an_invalid_grammar_before_queueing(torch_engine: Any) -> None:
    bad = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}
    with pytest.raises(WorkerError) as info:
        torch_engine.check_request(request("x", bad))
    assert info.value.retryable is False
