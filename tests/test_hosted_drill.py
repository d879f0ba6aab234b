"""The hosted-endpoint drill (issue 41): a chain whose primary is a key-checking OpenAI-protocol
server and whose fallback is the in-process local model (llama.cpp, real), run with the right
key, a wrong key, a missing key and a key the provider rotated. Each refusal is a 401 that
opens the endpoint's ``auth`` breaker, the local model answers, and the attempt's ``why`` names
the variable and never the key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from keyed_openai import KeyedServer, serve

import chainrt
from chainrt.store import StepRecord, open_store

pytestmark = pytest.mark.slow

ENV = "CHAINRT_DRILL_KEY"
GOOD = "sk-drill-good-00000000aaaa"
WRONG = "sk-drill-wrong-11111111bbbb"
ROTATED = "sk-drill-rotated-2222222cccc"


@pytest.fixture
def hosted() -> Iterator[KeyedServer]:
    yield from serve(GOOD)


async def _steps(store: str, run_id: str) -> dict[str, StepRecord]:
    opened = open_store(store)
    try:
        return await opened.get_steps(run_id)
    finally:
        await opened.close()


async def test_wrong_missing_and_rotated_keys_fall_back_to_the_local_model(
    tmp_path: Path, hosted: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n"
        f"  primary: {{endpoints: [{{url: '{hosted.url}', api_key_env: {ENV}}}]}}\n"
        "breakers: {auth: {cooldown: 100ms, max_cooldown: 100ms}}\n"
    )
    chain_file = tmp_path / "chain.yaml"
    chain_file.write_text(
        "name: drill\nbudget: 60s\nsteps:\n"
        "  - id: answer\n"
        "    llm: {model: primary, prompt: 'Say hello.', max_tokens: 6}\n"
        "    fallbacks: [local]\n"
    )
    chain = chainrt.load(chain_file)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    seen_text = ""

    async def run(run_id: str) -> tuple[chainrt.RunResult, StepRecord]:
        nonlocal seen_text
        result = await chain.arun({}, run_id=run_id, store=store, pool=str(pool))
        assert result.status == "completed", result.error
        record = (await _steps(store, run_id))["answer"]
        seen_text += result.model_dump_json() + record.model_dump_json()
        return result, record

    monkeypatch.setenv(ENV, GOOD)
    result, _ = await run("drill-good")
    assert result.steps[0].model == "primary"
    assert result.output == "hosted says hi"

    monkeypatch.setenv(ENV, WRONG)
    result, record = await run("drill-wrong")
    assert result.steps[0].fallback == "local"
    first = record.attempt_log[0]
    assert first.status == "auth"
    assert first.detail is not None
    assert ENV in first.detail
    assert record.attempt_log[-1].model == "local"
    assert record.attempt_log[-1].status == "ok"

    monkeypatch.delenv(ENV)
    before = len(hosted.seen)
    result, record = await run("drill-missing")
    assert result.steps[0].fallback == "local"
    assert len(hosted.seen) == before  # nothing is sent without a key
    first = record.attempt_log[0]
    assert first.status == "skipped"
    assert first.detail is not None
    assert f"API key variable {ENV} is not set" in first.detail

    monkeypatch.setenv(ENV, GOOD)
    hosted.key = ROTATED  # the provider rotated the key; the runner still has the old one
    result, record = await run("drill-rotated")
    assert result.steps[0].fallback == "local"
    assert record.attempt_log[0].status in ("auth", "skipped")  # refused, or the breaker open
    monkeypatch.setenv(ENV, ROTATED)  # the new key is put in place
    # The breaker's cool-down (100ms here) may still be running: the next runs try again.
    for attempt in range(20):
        result, _ = await run(f"drill-after-{attempt}")
        if result.steps[0].model == "primary" and result.steps[0].fallback is None:
            break
    assert result.steps[0].fallback is None, "the new key never closed the breaker"
    for key in (WRONG, ROTATED, GOOD):
        assert key not in seen_text
