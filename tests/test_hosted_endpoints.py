"""Hosted (OpenAI-compatible) endpoints in the pool: an API key read from an environment
variable, fixed headers, a route and query of their own, request options, certificate options,
and what a refused key does (issue 41).

A real HTTP(S) server that checks the key (``keyed_openai``) stands in for the hosted API; a
second, keyless one stands in for the fallback. Chains run through the real pool file, dispatcher
and store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from keyed_openai import CACHED_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS, KeyedServer, serve

import chainrt
from chainrt import SpecError
from chainrt.dispatch._pool import parse_pool_config

KEY = "sk-test-0123456789abcdef"
ENV = "CHAINRT_TEST_HOSTED_KEY"


@pytest.fixture
def hosted() -> Iterator[KeyedServer]:
    yield from serve(KEY)


@pytest.fixture
def backup() -> Iterator[KeyedServer]:
    yield from serve("", answer="backup says hi", key_header="x-unused")


def _pool(tmp_path: Path, primary: str, backup: KeyedServer | None = None, extra: str = "") -> str:
    text = f"models:\n  primary: {primary}\n"
    if backup is not None:
        text += f"  backup: {{endpoints: [{{url: '{backup.url}'}}]}}\n"
    text += "health: {enabled: false}\n" + extra
    # A file of its own each time: runs with the same store and pool share one runtime.
    path = tmp_path / f"pool-{len(list(tmp_path.glob('pool-*.yaml')))}.yaml"
    path.write_text(text)
    return str(path)


def _chain(tmp_path: Path, steps: int = 1, fallbacks: str = "[backup]") -> chainrt.Chain:
    body = "".join(
        f"  - id: s{i}\n"
        f"    llm: {{model: primary, prompt: 'question {i}', max_tokens: 8}}\n"
        f"    fallbacks: {fallbacks}\n"
        for i in range(steps)
    )
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"name: hosted\nbudget: 20s\nsteps:\n{body}output: '{{{{ steps.s0.output }}}}'\n"
    )
    return chainrt.load(path)


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


async def test_the_key_from_the_environment_headers_and_request_options_reach_the_server(
    tmp_path: Path, hosted: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, KEY)
    primary = (
        "{served_model: gpt-x, endpoints: [{url: '" + hosted.url + "', api_key_env: " + ENV + ", "
        "headers: {OpenAI-Organization: org-1}, chat_path: /openai/v1/chat/completions, "
        "query: {api-version: '2024-10-21'}}], "
        "request: {max_tokens_field: max_completion_tokens, body: {temperature: null, "
        "reasoning_effort: low}}, price: {prompt: 2.5, completion: 10, cached: 1.25}}"
    )
    result = await _chain(tmp_path).arun(
        {}, run_id="h-ok", store=_store(tmp_path), pool=_pool(tmp_path, primary)
    )
    assert result.status == "completed", result.error
    assert result.output == "hosted says hi"
    [seen] = hosted.seen
    assert seen.path == "/openai/v1/chat/completions?api-version=2024-10-21"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["openai-organization"] == "org-1"
    assert seen.body["model"] == "gpt-x"
    assert seen.body["max_completion_tokens"] == 8
    assert "max_tokens" not in seen.body
    assert "temperature" not in seen.body
    assert seen.body["reasoning_effort"] == "low"
    # Usage per step and per run, with the cost at the pool's price (per 1M tokens).
    cost = (PROMPT_TOKENS - CACHED_TOKENS) * 2.5 + CACHED_TOKENS * 1.25 + COMPLETION_TOKENS * 10
    cost /= 1_000_000
    for usage in (result.steps[0].usage, result.usage):
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (
            PROMPT_TOKENS, COMPLETION_TOKENS, CACHED_TOKENS,
        )  # fmt: skip
        assert usage.total_tokens == PROMPT_TOKENS + COMPLETION_TOKENS
        assert usage.cost == pytest.approx(cost)
    assert KEY not in result.model_dump_json()


async def test_a_bare_key_header_as_azure_wants_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, KEY)
    for server in serve(KEY, key_header="api-key"):
        primary = (
            "{endpoints: [{url: '" + server.url + "', api_key_env: " + ENV + ", "
            "api_key_header: api-key}]}"
        )
        result = await _chain(tmp_path, fallbacks="[]").arun(
            {}, run_id="h-azure", store=_store(tmp_path), pool=_pool(tmp_path, primary)
        )
        assert result.status == "completed", result.error
        assert server.seen[0].headers["api-key"] == KEY
        assert "authorization" not in server.seen[0].headers


async def test_a_wrong_key_opens_the_breaker_and_the_fallback_answers(
    tmp_path: Path, hosted: KeyedServer, backup: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "sk-wrong-fedcba9876543210"
    monkeypatch.setenv(ENV, wrong)
    primary = "{endpoints: [{url: '" + hosted.url + "', api_key_env: " + ENV + "}]}"
    store = _store(tmp_path)
    result = await _chain(tmp_path, steps=3).arun(
        {}, run_id="h-wrong", store=store, pool=_pool(tmp_path, primary, backup)
    )
    assert result.status == "completed", result.error
    assert [s.fallback for s in result.steps] == ["backup"] * 3
    assert len(hosted.seen) == 1  # the 401 opened the breaker: nothing more went there
    dumped = result.model_dump_json()
    inspected = await _inspect(store, "h-wrong")
    for text in (dumped, inspected):
        assert wrong not in text
        assert wrong[-4:] not in text
    opened = await _steps(store, "h-wrong")
    first = opened["s0"].attempt_log[0]
    assert first.status == "auth"
    assert first.detail is not None
    assert "HTTP 401" in first.detail
    assert ENV in first.detail
    later = opened["s1"].attempt_log[0]
    assert later.status == "skipped"
    assert later.detail is not None
    assert "circuit open (auth)" in later.detail


async def test_a_missing_key_variable_skips_the_endpoint_and_names_it(
    tmp_path: Path, hosted: KeyedServer, backup: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    primary = "{endpoints: [{url: '" + hosted.url + "', api_key_env: " + ENV + "}]}"
    store = _store(tmp_path)
    result = await _chain(tmp_path).arun(
        {}, run_id="h-missing", store=store, pool=_pool(tmp_path, primary, backup)
    )
    assert result.status == "completed", result.error
    assert result.steps[0].fallback == "backup"
    assert hosted.seen == []  # nothing was sent without a key
    first = (await _steps(store, "h-missing"))["s0"].attempt_log[0]
    assert first.status == "skipped"
    assert first.detail is not None
    assert f"API key variable {ENV} is not set" in first.detail


async def test_a_rotated_key_fails_over_then_the_new_key_closes_the_breaker(
    tmp_path: Path, hosted: KeyedServer, backup: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, KEY)
    primary = "{endpoints: [{url: '" + hosted.url + "', api_key_env: " + ENV + "}]}"
    # A short cool-down so that the trial after the new key comes within the test.
    pool = _pool(
        tmp_path, primary, backup, "breakers: {auth: {cooldown: 50ms, max_cooldown: 50ms}}\n"
    )
    store = _store(tmp_path)
    chain = _chain(tmp_path)
    before = await chain.arun({}, run_id="h-rot-1", store=store, pool=pool)
    assert before.steps[0].model == "primary"
    hosted.key = "sk-rotated-1111222233334444"  # the provider rotated the key
    during = await chain.arun({}, run_id="h-rot-2", store=store, pool=pool)
    assert during.steps[0].fallback == "backup"
    attempt = (await _steps(store, "h-rot-2"))["s0"].attempt_log[0]
    assert attempt.status == "auth"
    assert attempt.detail is not None
    assert ENV in attempt.detail
    monkeypatch.setenv(ENV, hosted.key)  # the operator puts the new key in place
    after = await chain.arun({}, run_id="h-rot-3", store=store, pool=pool)
    assert after.status == "completed", after.error
    assert after.steps[0].model == "primary"
    assert after.steps[0].fallback is None


async def test_streamed_answers_report_usage_in_their_last_chunk(
    tmp_path: Path, hosted: KeyedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, KEY)
    primary = "{endpoints: [{url: '" + hosted.url + "', api_key_env: " + ENV + "}]}"
    events = []
    async with chainrt.Runtime(store=_store(tmp_path), pool=_pool(tmp_path, primary)) as runtime:
        async for event in runtime.stream(_chain(tmp_path, fallbacks="[]"), {}):
            events.append(event.to_dict())
    assert hosted.seen[0].body["stream_options"] == {"include_usage": True}
    tokens = "".join(e["text"] for e in events if e["type"] == "token")
    assert tokens == "hosted says hi"
    [attempt] = [e for e in events if e["type"] == "attempt"]
    assert attempt["usage"]["cached_tokens"] == CACHED_TOKENS
    finished = next(e for e in events if e["type"] == "step_finished")
    assert finished["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert events[-1]["usage"]["completion_tokens"] == COMPLETION_TOKENS


async def test_https_with_a_private_ca_and_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keyed_openai import self_signed

    cert, key = self_signed(tmp_path)
    monkeypatch.setenv(ENV, KEY)
    for server in serve(KEY, tls=(cert, key)):
        trusted = (
            "{endpoints: [{url: '" + server.url + "', api_key_env: " + ENV + ", "
            "tls: {ca_file: '" + str(cert) + "'}}]}"
        )
        result = await _chain(tmp_path, fallbacks="[]").arun(
            {}, run_id="h-tls", store=_store(tmp_path), pool=_pool(tmp_path, trusted)
        )
        assert result.status == "completed", result.error
        assert result.output == "hosted says hi"
        untrusted = "{endpoints: [{url: '" + server.url + "', api_key_env: " + ENV + "}]}"
        store = _store(tmp_path)
        failed = await _chain(tmp_path, fallbacks="[]").arun(
            {}, run_id="h-notls", store=store, pool=_pool(tmp_path, untrusted)
        )
        assert failed.status == "failed"
        attempt = (await _steps(store, "h-notls"))["s0"].attempt_log[0]
        assert attempt.status == "connect"
        assert attempt.detail is not None
        assert "CERTIFICATE_VERIFY_FAILED" in attempt.detail
        assert server.answered() == 1


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("{url: 'http://h:1', api_key_env: 'sk-abc123'}", "NAME of an environment variable"),
        ("{url: 'http://h:1', headers: {Authorization: 'Bearer x'}}", "carries a secret"),
        ("{url: 'http://h:1', headers: {X-Priority: high}}", "set by chainrt itself"),
        ("{url: 'http://h:1', tls: {verify: false}}", "tls is for https://"),
        ("{url: 'http://h:1', chat_path: 'v1/chat'}", "must be a path starting with /"),
        ("{url: 'http://h:1', api_key_header: 'bad header'}", "not a valid header name"),
    ],
)
def test_pool_file_checks_endpoint_access(endpoint: str, expected: str) -> None:
    with pytest.raises(SpecError, match=expected) as caught:
        parse_pool_config(f"models:\n  m:\n    endpoints: [{endpoint}]\n", file="pool.yaml")
    assert "pool.yaml:3" in str(caught.value)


def test_pool_file_checks_request_options_price_and_one_url_one_access() -> None:
    with pytest.raises(SpecError, match="'messages' is written by chainrt itself"):
        parse_pool_config(
            "models: {m: {endpoints: [{url: 'http://h:1'}], request: {body: {messages: []}}}}"
        )
    with pytest.raises(SpecError, match=r"price\.completion: .*greater than or equal to 0"):
        parse_pool_config(
            "models: {m: {endpoints: [{url: 'http://h:1'}], price: {prompt: 1, completion: -1}}}"
        )
    with pytest.raises(SpecError, match="one URL must be reached the same way"):
        parse_pool_config(
            "models:\n  a: {endpoints: [{url: 'http://h:1', api_key_env: A}]}\n"
            "  b: {endpoints: [{url: 'http://h:1', api_key_env: B}]}\n"
        )
    config = parse_pool_config(
        "models: {m: {endpoints: [{url: 'https://api.openai.com', api_key_env: OPENAI_API_KEY}]}}"
    )
    endpoint = config.models["m"].endpoints[0]
    assert not endpoint.polled()  # a hosted API has no /health/ready
    assert config.breaker_policies()["auth"].min_requests == 1


def test_the_official_openai_client_talks_to_the_key_checking_server(
    hosted: KeyedServer,
) -> None:
    # The stand-in speaks the protocol the way the official client expects, refusals included.
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=hosted.url + "/v1", api_key=KEY, max_retries=0)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "hosted says hi"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    wrong = openai.OpenAI(base_url=hosted.url + "/v1", api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    client.close()
    wrong.close()


async def _steps(store: str, run_id: str) -> dict[str, chainrt.store.StepRecord]:
    from chainrt.store import open_store

    opened = open_store(store)
    try:
        return await opened.get_steps(run_id)
    finally:
        await opened.close()


async def _inspect(store: str, run_id: str) -> str:
    import io

    from chainrt.cli._printer import print_inspect
    from chainrt.store import open_store

    opened = open_store(store)
    try:
        run = await opened.get_run(run_id)
        steps = await opened.get_steps(run_id)
    finally:
        await opened.close()
    assert run is not None
    out = io.StringIO()
    print_inspect(run, steps, None, out, full=True)
    return out.getvalue()
