"""Tokens stream end to end (docs/dispatch.md; docs/serve.md, Run events): worker SSE and the in-process model, through
dispatch, to run events, ``ChainRunnable.astream(_events)`` and ``ChatChainrt.stream``.

Real components: a ``chainrt-worker`` process (llama.cpp, SmolLM2) answering with SSE, the
in-process local model, the official streaming format in between. Generation is greedy, so the
streamed pieces joined must equal the answer itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_fixtures import WorkerProcess

import chainrt
from chainrt._records import AttemptRecord
from chainrt.dispatch import LlmCall, make_dispatcher
from chainrt.engines import get_local_engine
from chainrt.langchain import ChainEvent, ChainRunnable, ChatChainrt

pytestmark = pytest.mark.slow

PROMPT = "Count from 1 to 30, separated by commas."


def start_worker() -> WorkerProcess:
    return WorkerProcess(
        "--engine", "local",
        "--served-model-name", "smol",
        "--health-interval", "300",
        "--log-level", "warning",
    ).start()  # fmt: skip


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    w = start_worker()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module", autouse=True)
def warm_local_model() -> None:
    asyncio.run(get_local_engine().start())


def pool_file(tmp_path: Path, base: str) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(
        f"models:\n  primary:\n    served_model: smol\n    endpoints: [{{url: '{base}'}}]\n"
        "health: {interval: 200ms, timeout: 300ms}\n"
    )
    return path


def chain_file(tmp_path: Path, model: str, fallbacks: str = "[]", max_tokens: int = 24) -> Path:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "name: streamed\nbudget: 60s\ninputs: {}\nsteps:\n  - id: answer\n"
        f"    llm: {{model: {model}, prompt: '{PROMPT}', max_tokens: {max_tokens}}}\n"
        f"    fallbacks: {fallbacks}\n"
    )
    return path


@pytest.mark.parametrize("where", ["local", "worker"])
async def test_dispatch_streams_tokens_from_the_local_model_and_from_a_worker(
    where: str, worker: WorkerProcess, tmp_path: Path
) -> None:
    dispatcher = make_dispatcher(pool_file(tmp_path, worker.base))
    pieces: list[str] = []
    attempts: list[AttemptRecord] = []
    call = LlmCall(
        model="local" if where == "local" else "primary",
        messages=[("user", PROMPT)],
        max_tokens=24,
        on_token=pieces.append,
        on_attempt=attempts.append,
    )
    try:
        answer = await dispatcher.complete(call, time.time() + 60)
        plain = await dispatcher.complete(
            LlmCall(model=call.model, messages=call.messages, max_tokens=24), time.time() + 60
        )
    finally:
        await dispatcher.close()
    assert len(pieces) > 5  # token by token, not one lump
    assert "".join(pieces) == answer.text == plain.text
    assert answer.completion_tokens > 5
    assert [(a.model, a.status) for a in attempts] == [(call.model, "ok")]
    assert attempts[0].endpoint == ("in-process" if where == "local" else worker.base)
    # The confidence score and the prefill/decode split arrive streamed or not, and agree.
    assert answer.confidence is not None
    assert answer.confidence == plain.confidence
    assert attempts[0].hops_ms is not None
    assert attempts[0].hops_ms["prefill"] > 0.0


async def test_run_events_carry_tokens_and_a_fallback_mid_stream_starts_over(
    tmp_path: Path,
) -> None:
    victim = start_worker()
    try:
        chain = chainrt.load(chain_file(tmp_path, "primary", "[local]", max_tokens=60))
        runnable = ChainRunnable(
            chain,
            store=f"sqlite:///{tmp_path / 'runs.db'}",
            pool=str(pool_file(tmp_path, victim.base)),
            returns="result",
        )
        events: list[dict[str, Any]] = []
        final: Any = None
        async for item in runnable.astream({}):
            if isinstance(item, ChainEvent):
                events.append(item)
                if item["type"] == "token" and victim.alive:
                    assert victim.process is not None
                    victim.process.kill()  # mid-stream: the connection drops after a token
            else:
                final = item
    finally:
        victim.stop()
    kinds = [e["type"] for e in events if e["type"] in ("token", "attempt", "step_finished")]
    first_attempt = kinds.index("attempt")
    assert first_attempt >= 1  # the primary streamed before it died ...
    assert set(kinds[:first_attempt]) == {"token"}
    failed = events[[e["type"] for e in events].index("attempt")]
    assert (failed["model"], failed["status"]) == ("primary", "connect")
    # After the attempt event, the local model's tokens start over; then its own attempt.
    after = [e for e in events[events.index(failed) + 1 :] if e["type"] in ("token", "attempt")]
    local_tokens = [e["text"] for e in after if e["type"] == "token"]
    assert len(local_tokens) > 5
    assert after[-1]["type"] == "attempt"
    assert (after[-1]["model"], after[-1]["status"]) == ("local", "ok")
    assert final.status == "completed"
    assert final.steps[0].fallback == "local"
    assert "".join(local_tokens) == final.output


async def test_astream_events_of_a_chain_runnable_carry_the_llm_tokens(tmp_path: Path) -> None:
    chain = chainrt.load(chain_file(tmp_path, "local"))
    runnable = chain.as_runnable(store=f"sqlite:///{tmp_path / 'runs.db'}")
    tokens: list[str] = []
    output: Any = None
    async for event in runnable.astream_events({}, version="v2"):
        if event["event"] == "on_chain_stream":
            chunk = event["data"]["chunk"]
            if isinstance(chunk, dict) and chunk.get("type") == "token":
                tokens.append(chunk["text"])
        elif event["event"] == "on_chain_end":
            output = event["data"]["output"]
    assert len(tokens) > 5
    assert "".join(tokens) == output


def test_chat_model_stream_yields_token_chunks(worker: WorkerProcess, tmp_path: Path) -> None:
    pool = str(pool_file(tmp_path, worker.base))
    llm = ChatChainrt(model="primary", pool=pool, max_tokens=24, timeout=60)
    chunks = list(llm.stream(PROMPT))
    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 5
    assert "".join(str(t) for t in texts) == llm.invoke(PROMPT).content
    last = chunks[-1]
    assert last.usage_metadata is not None
    assert last.usage_metadata["output_tokens"] > 5
    assert last.response_metadata["endpoint"] == worker.base


async def test_chat_model_astream_from_the_local_model(tmp_path: Path) -> None:
    llm = ChatChainrt(model="local", pool=None, max_tokens=24, timeout=60)
    texts = [str(c.content) async for c in llm.astream(PROMPT) if c.content]
    assert len(texts) > 5
    assert "".join(texts) == (await llm.ainvoke(PROMPT)).content
