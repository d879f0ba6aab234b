"""Hot reload of the local engine: the new engine is warmed with the serving engine's last prompt
before the swap (``Engine.warm_like``), on the real llama.cpp model."""

from __future__ import annotations

import pytest

from chainrt.engines import ChatMessage, GenerationRequest, LocalEngine


def ask() -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage("user", "Say OK")], max_tokens=2)


@pytest.mark.slow
async def test_a_reloaded_local_engine_is_warmed_with_the_serving_engines_last_prompt() -> None:
    """warm_like: the new engine's prompt cache holds what the old one's holds, so the first
    request after the swap reuses the prefix as it would have on the old engine."""
    asked = GenerationRequest(
        messages=[
            ChatMessage("system", "You answer with one word, lower case, no punctuation."),
            ChatMessage("user", "Name a color."),
        ],
        max_tokens=3,
        temperature=0.0,
    )
    old, new, fresh = LocalEngine(), LocalEngine(), LocalEngine()
    try:
        await old.generate(asked)
        await new.start()
        await new.generate(ask())  # the reload's readiness probe: another prompt in the cache
        await new.warm_like(old)
        model = new._model
        assert model is not None
        prompt = model.prompt_tokens(asked)
        assert list(model._llm._input_ids) == prompt[:-1]  # all but the last, as _prefill keeps
        assert (await new.generate(asked)).text == (await old.generate(asked)).text
        await new.warm_like(new)  # an engine that served nothing else: the same prompt again
        await fresh.warm_like(new)  # an engine not started yet loads, then warms
        assert fresh._model is not None
        assert list(fresh._model._llm._input_ids) == prompt[:-1]
    finally:
        for engine in (old, new, fresh):
            await engine.close()
