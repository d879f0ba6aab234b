"""A retired engine (a hot reload swapped it out) hands back the generations it has not started
and finishes the one it is generating (``Engine.retire``), on the real llama.cpp model."""

from __future__ import annotations

import asyncio

import pytest

from chainrt.engines import ChatMessage, EngineRetired, GenerationRequest, LocalEngine

STORY = [ChatMessage("user", "Write a very long story about a dragon and a knight.")]


def ask() -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", "Say OK")], max_tokens=2)


@pytest.mark.slow
async def test_retire_hands_back_queued_generations_and_finishes_the_running_one() -> None:
    engine = LocalEngine()
    try:
        story = GenerationRequest(messages=STORY, max_tokens=60, temperature=0.0)
        pieces = engine.stream(story)
        first = await anext(pieces)  # the model thread is generating it now
        queued = [asyncio.create_task(engine.generate(ask())) for _ in range(2)]
        while engine.queued < 2:  # both wait behind the story on the one model thread
            await asyncio.sleep(0.01)
        assert engine.retire() == 2
        for task in queued:
            with pytest.raises(EngineRetired, match="before the request started"):
                await task
        rest = [delta async for delta in pieces]
        result = rest[-1].result
        assert result is not None
        assert (result.finish_reason, result.completion_tokens) == ("length", 60)
        assert result.text == first.text + "".join(delta.text for delta in rest)
        with pytest.raises(EngineRetired):  # asked for later: handed back at once
            await engine.generate(ask())
        assert engine.retire() == 0
    finally:
        await engine.close()
