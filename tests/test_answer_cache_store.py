"""The answer cache of ``degrade: [cache]`` is chosen through the store protocol
(``store.answer_cache()``), not by the store's class: with tracing on, the runner holds a
``TracedStore`` around the Redis store, and the answers must still be kept in Redis, where another
runtime (another process) finds them, not in a cache of one process's memory."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from chat_stub import ChatStub, serve
from worker_fixtures import free_port

import chainrt
from chainrt._hooks import Hooks, Span
from chainrt.store import open_store
from chainrt.store._answers import AnswerCache, RedisAnswers, SqliteAnswers, answer_cache
from chainrt.tracing._intercept import TracedStore

pytestmark = pytest.mark.redis

ANSWER = "Order 1042 ships tomorrow."


class Recording(Hooks):
    """Hooks that record span names: tracing is on (the runtime wraps its store in them)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def span(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        links: list[dict[str, Any]] | None = None,
    ) -> Span:
        self.names.append(name)
        return Span()


@pytest.fixture
def model() -> Iterator[ChatStub]:
    yield from serve(ANSWER, 0.9)


def chain_file(tmp_path: Path) -> Path:
    path = tmp_path / "cached.yaml"
    path.write_text(
        "name: cached\nbudget: 20s\ninputs: {q: str}\nsteps:\n"
        "  - id: ask\n"
        "    llm: {model: primary, prompt: '{{ input.q }}', max_tokens: 16}\n"
        "    degrade: [cache]\n"
        "output: '{{ steps.ask.output }}'\n"
    )
    return path


def pool_file(tmp_path: Path, url: str, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"models:\n  primary: {{served_model: m, endpoints: [{{url: '{url}'}}]}}\n"
        "health: {enabled: false}\n"
    )
    return str(path)


def answer_keys(redis_url: str, prefix: str) -> set[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return set(client.scan_iter(match=f"{prefix}:answer:*"))
    finally:
        client.close()


async def test_with_tracing_on_answers_are_kept_in_redis_for_another_runtime(
    tmp_path: Path, redis_url: str, model: ChatStub
) -> None:
    question = f"Where is order {uuid.uuid4().hex}?"  # no other test's entry can answer it
    chain = chain_file(tmp_path)
    store = open_store(redis_url)
    prefix = store.keys.prefix  # type: ignore[attr-defined]
    await store.close()
    before = answer_keys(redis_url, prefix)

    hooks = Recording()
    up = pool_file(tmp_path, model.url, "up")
    async with chainrt.Runtime(store=redis_url, pool=up, hooks=hooks) as rt:
        assert isinstance(rt.store, TracedStore)
        first = await rt.run(chain, {"q": question})
    assert first.status == "completed", first.error
    assert first.output == ANSWER
    assert first.steps[0].degraded is None
    assert "checkpoint.write" in hooks.names  # the store was traced

    new = answer_keys(redis_url, prefix) - before
    assert len(new) == 1, f"the model's answer was not written to Redis: new keys {new}"
    value = redis.Redis.from_url(redis_url).get(new.pop())
    assert value is not None
    assert json.loads(value)["answer"] == ANSWER

    # Another runtime (a new store object, as another process would hold), tracing on, the
    # model down: the answer comes from Redis.
    down = pool_file(tmp_path, f"http://127.0.0.1:{free_port()}", "down")
    async with chainrt.Runtime(store=redis_url, pool=down, hooks=Recording()) as rt:
        second = await rt.run(chain, {"q": question})
    assert second.status == "completed", second.error
    assert second.output == ANSWER
    assert second.steps[0].degraded is not None
    assert second.steps[0].degraded["by"] == "cache"
    assert model.requests == 1


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis", RedisAnswers),
        ("sqlite-file", SqliteAnswers),
        ("sqlite-memory", AnswerCache),
        ("sqlite-read-only", AnswerCache),
    ],
)
async def test_a_traced_store_gives_its_inner_stores_cache(
    tmp_path: Path, redis_url: str, url: str, kind: type[AnswerCache]
) -> None:
    db = tmp_path / "runs.db"
    if url == "sqlite-read-only":
        await open_store(f"sqlite:///{db}").close()  # the file must exist to be opened read-only
    target = {
        "redis": redis_url,
        "sqlite-file": f"sqlite:///{db}",
        "sqlite-memory": "sqlite:///:memory:",
        "sqlite-read-only": f"sqlite:///{db}?mode=ro",
    }[url]
    inner = open_store(target)
    try:
        traced = TracedStore(inner, Recording())
        cache = answer_cache(traced)
        assert type(cache) is kind
        assert cache is answer_cache(inner)
        assert cache is inner.answer_cache()  # one per store object
    finally:
        await inner.close()
