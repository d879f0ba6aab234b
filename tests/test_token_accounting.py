"""Token accounting (issue 41): usage per attempt, step and run in ``--json``, ``inspect``, events
and metrics; the run's ``max_tokens_total``; the static answer's place in a stream.

A real key-checking OpenAI-protocol server (``keyed_openai``) answers with known usage; the CLI
runs as a real process where the output is what is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyed_openai import CACHED_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS, KeyedServer, serve

import chainrt
from chainrt._events import RunEvent
from chainrt.serve._metrics import ServeMetrics

KEY = "sk-usage-0123456789"
ENV = "CHAINRT_TEST_USAGE_KEY"
PER_CALL = PROMPT_TOKENS + COMPLETION_TOKENS


@pytest.fixture
def hosted(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyedServer]:
    monkeypatch.setenv(ENV, KEY)
    yield from serve(KEY)


def _files(
    tmp_path: Path, server: KeyedServer, chain_extra: str = "", step_extra: str = ""
) -> tuple[str, Path]:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n  primary:\n"
        f"    endpoints: [{{url: '{server.url}', api_key_env: {ENV}}}]\n"
        "    price: {prompt: 3, completion: 15}\n"
        "health: {enabled: false}\n"
    )
    chain = tmp_path / "chain.yaml"
    steps = "".join(
        f"  - id: s{i}\n    llm: {{model: primary, prompt: 'q{i}', max_tokens: 8}}\n{step_extra}"
        for i in range(2)
    )
    chain.write_text(f"name: tokens\nbudget: 20s\n{chain_extra}steps:\n{steps}")
    return str(pool), chain


def test_run_json_and_inspect_show_tokens_per_step_and_run(
    tmp_path: Path, hosted: KeyedServer
) -> None:
    pool, chain = _files(tmp_path, hosted)
    env = {**os.environ, "CHAINRT_STORE": f"sqlite:///{tmp_path / 'runs.db'}", "CHAINRT_POOL": pool}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("OTEL_TRACES_EXPORTER", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chainrt", *args], capture_output=True, text=True, env=env,
            timeout=120,
        )  # fmt: skip

    done = cli("run", str(chain), "--input", "{}", "--json", "--run-id", "tok-cli")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    cost = (PROMPT_TOKENS * 3 + COMPLETION_TOKENS * 15) / 1e6
    for step in result["steps"]:
        assert step["usage"]["total_tokens"] == PER_CALL
        assert step["usage"]["cached_tokens"] == CACHED_TOKENS
        assert step["usage"]["cost"] == pytest.approx(cost)
    assert result["usage"]["prompt_tokens"] == 2 * PROMPT_TOKENS
    assert result["usage"]["completion_tokens"] == 2 * COMPLETION_TOKENS
    assert result["usage"]["cost"] == pytest.approx(2 * cost)
    shown = cli("inspect", "tok-cli")
    assert shown.returncode == 0, shown.stderr
    run_line = (
        f"tokens   {2 * PER_CALL} (prompt {2 * PROMPT_TOKENS}, completion {2 * COMPLETION_TOKENS}"
    )
    assert run_line in shown.stdout
    assert shown.stdout.count(f"tokens {PER_CALL} (prompt {PROMPT_TOKENS}") == 2
    assert KEY not in done.stdout + done.stderr + shown.stdout + shown.stderr


async def test_max_tokens_total_stops_the_call_that_cannot_fit(
    tmp_path: Path, hosted: KeyedServer
) -> None:
    # The first call may use ~3 + 8 tokens and uses 23; the second then cannot fit the 30.
    pool, chain = _files(tmp_path, hosted, chain_extra="max_tokens_total: 30\n")
    result = await chainrt.load(chain).arun(
        {}, run_id="tok-max", store=f"sqlite:///{tmp_path / 'runs.db'}", pool=pool
    )
    assert [s.status for s in result.steps] == ["completed", "timed_out"]
    assert result.status == "partial"
    assert result.stopped_at == "s1"
    assert len(hosted.seen) == 1  # the call that could not fit was never made
    assert result.usage is not None
    assert result.usage.total_tokens == PER_CALL
    assert result.steps[1].error is not None
    assert "max_tokens_total" in result.steps[1].error


async def test_a_step_short_of_tokens_still_gets_its_static_answer(
    tmp_path: Path, hosted: KeyedServer
) -> None:
    pool, chain = _files(
        tmp_path,
        hosted,
        chain_extra="max_tokens_total: 5\n",
        step_extra="    static_answer: later\n",
    )
    result = await chainrt.load(chain).arun(
        {}, run_id="tok-static", store=f"sqlite:///{tmp_path / 'runs.db'}", pool=pool
    )
    assert result.status == "completed", result.error
    assert [s.fallback for s in result.steps] == ["static", "static"]
    assert hosted.seen == []
    assert result.usage is None  # nothing was used: no usage, rather than zeros


async def test_metrics_count_tokens_by_chain_model_and_kind(
    tmp_path: Path, hosted: KeyedServer
) -> None:
    pool, chain = _files(tmp_path, hosted)
    metrics = ServeMetrics()
    events: list[RunEvent] = []
    async with chainrt.Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}", pool=pool) as runtime:
        runtime.event_sinks.append(metrics.observe)
        runtime.event_sinks.append(events.append)
        await runtime.run(chain, {})
    text = metrics.render().decode()
    for kind, count in (
        ("prompt", 2 * PROMPT_TOKENS),
        ("completion", 2 * COMPLETION_TOKENS),
        ("cached", 2 * CACHED_TOKENS),
    ):
        line = f'chainrt_tokens_total{{chain="tokens",kind="{kind}",model="primary"}} {count}.0'
        assert line in text, text
    assert 'chainrt_cost_total{chain="tokens",model="primary"}' in text
    attempts = [e for e in events if e.type == "attempt"]
    assert [e.data["usage"]["total_tokens"] for e in attempts] == [PER_CALL, PER_CALL]


async def test_a_static_answer_after_streamed_tokens_comes_after_an_attempt_event(
    tmp_path: Path, hosted: KeyedServer
) -> None:
    # The primary streams its words, then the connection drops: those tokens must be discarded.
    # The contract: the failed attempt's `attempt` event (status not ok) comes before the static
    # answer's own `attempt` event and its token, so a client knows to start the step over.
    hosted.drop_streams = True
    pool, chain = _files(tmp_path, hosted, step_extra="    static_answer: 'sorry, later'\n")
    events = []
    async with chainrt.Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}", pool=pool) as runtime:
        async for event in runtime.stream(chain, {}):
            if event.step_id == "s0" and event.type in ("token", "attempt"):
                events.append(event.to_dict())
    kinds = [(e["type"], e.get("status"), e.get("model")) for e in events]
    dropped = "".join(e["text"] for e in events[: kinds.index(("attempt", "connect", "primary"))])
    assert dropped == "hosted says hi"  # the primary's words came first...
    after = kinds[kinds.index(("attempt", "connect", "primary")) + 1 :]
    assert after == [("attempt", "ok", "static"), ("token", None, None)]  # ...then the static
    assert events[-1]["text"] == "sorry, later"
