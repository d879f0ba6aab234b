"""``degrade:`` on llm steps, end to end: a real llama.cpp worker answers first (and its answer is
cached in the store — SQLite and Redis), then the pool points at a dead endpoint and the degrade
actions answer: the cached answer (with its age), the in-process model, the static template."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_fixtures import WorkerProcess, free_port

import chainrt
from chainrt.engines import get_local_engine
from chainrt.errors import SpecError
from chainrt.store import StepRecord, open_store

pytestmark = pytest.mark.slow

SERVED = "smol"


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with WorkerProcess(
        "--engine", "local", "--served-model-name", SERVED,
        "--health-interval", "300", "--log-level", "warning",
    ) as w:  # fmt: skip
        yield w


def pool(tmp_path: Path, url: str) -> str:
    path = tmp_path / f"pool-{url.rsplit(':', 1)[-1]}.yaml"
    path.write_text(
        f"models:\n  primary: {{served_model: {SERVED}, endpoints: [{{url: '{url}'}}]}}\n"
        "health: {interval: 200ms, timeout: 300ms}\n"
    )
    return str(path)


def chain(tmp_path: Path, degrade: str) -> chainrt.Chain:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "name: degraded\nbudget: 30s\ninputs: {q: str}\nsteps:\n"
        "  - id: ask\n"
        "    llm: {model: primary, prompt: '{{ input.q }}', max_tokens: 4}\n"
        f"    degrade: {degrade}\n"
        "output: '{{ steps.ask.output }}'\n"
    )
    return chainrt.load(path)


async def ask(tmp_path: Path, store: str, pool_url: str, degrade: str, q: str, run_id: str
              ) -> tuple[chainrt.RunResult, StepRecord]:  # fmt: skip
    result = await chain(tmp_path, degrade).arun(
        {"q": q}, run_id=run_id, store=store, pool=pool(tmp_path, pool_url)
    )
    opened = open_store(store)
    try:
        record = (await opened.get_steps(run_id))["ask"]
    finally:
        await opened.close()
    return result, record


DEGRADE = "[cache, {static: 'busy, run {{ run.id }}'}]"


async def test_cached_answer_then_static_when_the_model_is_down(
    tmp_path: Path, worker: WorkerProcess, store_url: str
) -> None:
    tag = store_url[:5]
    first, _ = await ask(tmp_path, store_url, worker.base, DEGRADE, "Say hello.", f"up-{tag}")
    assert first.status == "completed", first.error
    assert first.steps[0].degraded is None
    assert first.steps[0].model == "primary"

    down = f"http://127.0.0.1:{free_port()}"
    # "Say  HELLO" normalises to the same prompt as "Say hello."
    hit, record = await ask(tmp_path, store_url, down, DEGRADE, "  Say  HELLO ", f"hit-{tag}")
    assert hit.status == "completed", hit.error
    step = hit.steps[0]
    assert hit.output == first.output
    assert (step.model, step.fallback) == ("cache", "cache")
    assert step.degraded is not None
    assert step.degraded["by"] == "cache"
    assert 0.0 <= step.degraded["age_s"] < 600.0  # written by this test's first run
    assert record.degraded == step.degraded
    assert [a.model for a in record.attempt_log][-1] == "cache"
    assert record.attempt_log[-1].status == "ok"

    miss, record = await ask(tmp_path, store_url, down, DEGRADE, "Something else", f"miss-{tag}")
    assert miss.status == "completed", miss.error
    assert miss.output == f"busy, run miss-{tag}"
    assert miss.steps[0].degraded == {"by": "static"}
    assert [(a.model, a.status) for a in record.attempt_log][-2:] == [
        ("cache", "miss"),
        ("static", "ok"),
    ]


async def test_expired_cache_entry_is_not_used(
    tmp_path: Path, worker: WorkerProcess, store_url: str
) -> None:
    degrade = "[{cache: 1s}]"
    tag = store_url[:5]
    first, _ = await ask(tmp_path, store_url, worker.base, degrade, "Say yes.", f"ttl-up-{tag}")
    assert first.status == "completed", first.error
    await asyncio.sleep(1.2)  # the entry's TTL is 1 s
    down = f"http://127.0.0.1:{free_port()}"
    late, record = await ask(tmp_path, store_url, down, degrade, "Say yes.", f"ttl-late-{tag}")
    assert late.status == "failed"
    assert record.attempt_log[-1].status == "miss"


async def test_smaller_model_answers_when_the_primary_is_down(
    tmp_path: Path, store_url: str
) -> None:
    await get_local_engine().start()
    down = f"http://127.0.0.1:{free_port()}"
    result, record = await ask(
        tmp_path, store_url, down, "[{model: local}]", "Say OK", f"small-{store_url[:5]}"
    )
    assert result.status == "completed", result.error
    step = result.steps[0]
    assert (step.model, step.degraded) == ("local", {"by": "model", "model": "local"})
    assert isinstance(result.output, str)
    assert record.attempt_log[-1].endpoint == "in-process"


@pytest.mark.parametrize(
    ("degrade", "message"),
    [
        ("[{cache: 0s}]", "cache"),
        ("[{cache: 1h, model: x}]", "degrade"),
        ("[{smaller: local}]", "degrade"),
        ("[cached]", "degrade"),
    ],
)
def test_bad_degrade_is_a_spec_error_with_its_line(
    tmp_path: Path, degrade: str, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        chain(tmp_path, degrade)
    assert "chain.yaml:" in str(caught.value)
    assert message in str(caught.value)
