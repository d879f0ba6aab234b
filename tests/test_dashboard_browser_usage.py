"""The run page's tokens and degraded mark, and ``chainrt_tokens_total`` (issue 41), in a real
headless Chromium against a real ``chainrt serve`` whose primary model is a real key-checking
OpenAI-protocol server (``keyed_openai``).

``tokens`` runs two LLM steps on the hosted model (known usage per answer); ``static3`` runs
three LLM steps whose model nothing serves, all answered by their static answers.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from browser_fixtures import (
    BROWSER_TEST,
    Page,
    checked_page,
    chromium,
    submit,
    wait_status,
)
from keyed_openai import COMPLETION_TOKENS, PROMPT_TOKENS, KeyedServer, serve

from chainrt.testing.serve_process import ServeProcess

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)

KEY = "sk-dashboard-0123456789"
PER_CALL = PROMPT_TOKENS + COMPLETION_TOKENS


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def hosted() -> Iterator[KeyedServer]:
    yield from serve(KEY)


@pytest.fixture(scope="module")
def server(hosted: KeyedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("dashboard-usage")
    chains = folder / "chains"
    chains.mkdir()
    steps = "".join(
        f"  - id: s{i}\n    llm: {{model: hosted, prompt: 'q{i}', max_tokens: 8}}\n"
        for i in range(2)
    )
    (chains / "tokens.yaml").write_text(f"name: tokens\nbudget: 20s\nsteps:\n{steps}")
    static = "".join(
        f"  - id: s{i}\n    llm: {{model: down, prompt: 'q{i}', max_tokens: 8}}\n"
        f"    static_answer: 'fixed {i}'\n"
        for i in range(3)
    )
    (chains / "static3.yaml").write_text(f"name: static3\nbudget: 20s\nsteps:\n{static}")
    pool = folder / "pool.yaml"
    pool.write_text(
        "models:\n"
        f"  hosted: {{endpoints: [{{url: '{hosted.url}', api_key_env: DASH_KEY}}], "
        "price: {prompt: 1, completion: 2}}\n"
        f"  down: {{endpoints: [{{url: 'http://127.0.0.1:{_closed_port()}'}}]}}\n"
    )
    env = {"CHAINRT_POOL": str(pool), "DASH_KEY": KEY}
    with ServeProcess(
        store=f"sqlite:///{folder / 'runs.db'}", chains=chains, drain="1s", env=env
    ) as runner:
        yield runner


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: ServeProcess) -> Iterator[Page]:
    with checked_page(browser, server.url) as opened:
        yield opened


def test_run_page_shows_tokens_and_metrics_count_them(page: Page, server: ServeProcess) -> None:
    submit(server, "tokens", "usage-1", {})
    wait_status(server, "usage-1", {"completed"})
    p = page.goto("/ui/runs/usage-1")
    p.wait_for_selector("body[data-stream='ended']")
    assert p.locator("#tokens-box").is_visible()
    assert p.locator("#tokens").inner_text().startswith(f"{2 * PER_CALL} tokens (prompt ")
    for step in ("s0", "s1"):
        figures = p.locator(f"li.step[data-step='{step}'] .figures").inner_text()
        assert (
            f"{PER_CALL} tokens (prompt {PROMPT_TOKENS}, completion {COMPLETION_TOKENS}" in figures
        )
        assert "cost" in figures
        chip = p.locator(f"li.step[data-step='{step}'] .attempt .usage").inner_text()
        assert f"{PER_CALL} tok" in chip
    assert not p.locator("#degraded").is_visible()
    metrics = server.get("/metrics").text
    line = (
        f'chainrt_tokens_total{{chain="tokens",kind="prompt",model="hosted"}} {2 * PROMPT_TOKENS}.0'
    )
    assert line in metrics
    assert KEY not in server.get("/v1/runs/usage-1/record").text


def test_a_run_of_static_answers_is_marked_degraded_in_one_unit(
    page: Page, server: ServeProcess
) -> None:
    submit(server, "static3", "static-1", {})
    wait_status(server, "static-1", {"completed"})
    p = page.goto("/ui/runs/static-1")
    p.wait_for_selector("body[data-stream='ended']")
    assert p.locator("#status").inner_text() == "completed"
    mark = p.locator("#degraded")
    assert mark.is_visible()
    assert mark.inner_text() == "degraded: 3 of 3 LLM steps static"
    # Every figure in one unit: "N ms" (grouped), never "12.4 s" beside "6215 ms".
    budget = p.locator("#budget").inner_text()
    assert re.fullmatch(r"[\d,]+ ms used of 20,000 ms", budget), budget
    text = p.locator("#waterfall").inner_text()
    assert not re.search(r"\d s\b", text), text
    assert not p.locator("#tokens-box").is_visible()  # static answers use no tokens
