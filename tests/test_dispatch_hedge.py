"""Hedged attempts (``llm.hedge``, docs/dispatch.md) against two real chainrt workers.

Endpoint A answers as usual for a few requests (the dispatcher learns its recent answer times),
then turns slow (injected latency before its engine). The backend's endpoint choice is pinned to
A (``rng`` 0), so the first attempt always goes there and a hedge, when one starts, goes to B.
What the workers count (``/metrics``) shows where requests went and that the loser's request was
dropped by the worker as a client disconnect (HTTP 499) with no token generated for it.

The workers run the ``torch`` engine (real SmolLM2-135M weights on the CPU). What is tested here
is the worker's HTTP side (deadline, disconnect, metrics), which every engine shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from worker_fixtures import WorkerProcess, metric_value

from chainrt.dispatch import (
    Dispatcher,
    DispatchFailed,
    HttpBackend,
    LlmAnswer,
    LlmCall,
    ModelBackend,
)
from chainrt.dispatch._adapt import PaceBook
from chainrt.dispatch._breaker import DEFAULT_POLICIES
from chainrt.dispatch._resources import PoolResources
from chainrt.tracing import _attributes as attr
from chainrt.tracing import in_memory_hooks
from chainrt.tracing._backend import TracedBackend
from chainrt.tracing._hooks import OtelHooks

pytestmark = pytest.mark.slow

SERVED = "smol"
SLOW_MS = 30_000
"""A's injected latency: a hedged answer must come long before it (8 s was once not enough for
B's answer beside scripts/cpu_hog; A's attempt is cancelled when B answers, so this costs no
time when the test passes)."""
OK = {"endpoint": "chat", "status": "200"}
GONE = {"endpoint": "chat", "status": "499"}
TOKENS = "chainrt_worker_completion_tokens_total"
REQUESTS = "chainrt_worker_requests_total"


@pytest.fixture(scope="module")
def worker_engine() -> str:
    """``workers`` (tests/conftest.py) run the torch engine here."""
    return "torch"


def dispatcher(*urls: str, hooks: OtelHooks | None = None) -> Dispatcher:
    resources = PoolResources(DEFAULT_POLICIES, health_interval_s=None)
    backend: ModelBackend = HttpBackend(
        "primary", SERVED, [(url, 1.0) for url in urls], resources=resources, rng=lambda: 0.0
    )
    if hooks is not None:
        backend = TracedBackend(backend, hooks)
    return Dispatcher({"primary": backend})


@pytest.fixture
def hooks() -> OtelHooks:
    """Tracing into memory: each attempt is an ``llm.dispatch`` span."""
    return in_memory_hooks()


@pytest.fixture
async def taught(
    workers: tuple[WorkerProcess, WorkerProcess], hooks: OtelHooks
) -> AsyncIterator[Dispatcher]:
    """A dispatcher over A and B that has seen A answer 4 times (its recent figures)."""
    a, b = workers
    d = dispatcher(a.base, b.base, hooks=hooks)
    try:
        for _ in range(4):
            # Fresh paces: on a loaded machine one slow answer of A's would make A "slow now"
            # and steer the next call to B (dispatch/_adapt.py); A's answer times, which the
            # tests read, are kept in d.latency.
            d.paces = PaceBook()
            answer = await d.complete(call(), time.time() + 30)
            assert answer.endpoint == a.base
        d.paces = PaceBook()  # each test's first attempt goes to A, as rng 0 picks
        yield d
    finally:
        await d.close()


def call(**kw: object) -> LlmCall:
    return LlmCall(model="primary", messages=[("user", "Say OK")], max_tokens=2, **kw)  # type: ignore[arg-type]


def counts(worker: WorkerProcess) -> dict[str, float]:
    text = worker.get("/metrics").text
    return {
        "ok": metric_value(text, REQUESTS, **OK),
        "gone": metric_value(text, REQUESTS, **GONE),
        "tokens": metric_value(text, TOKENS),
    }


TIMER_SLACK_MS = 1500
"""How late the hedge's timer may fire past its threshold: the event loop's lateness (tens of ms
on this loaded 2-core machine; 77 ms at most in bench/overshoot.py's 40,000 samples) plus the
loser's 50 ms wind-down, with a wide margin. It stays far below A's injected 8 s: the check
still tells a hedge at the threshold from one that waited for A."""


def hedged_after_ms(answer: LlmAnswer) -> float:
    """When the hedge started, in ms after the first attempt, for an answer that is not streamed:
    the loser lasted until the winner answered (and was cancelled), the winner from its start
    until then."""
    first, hedge = answer.attempts[0], answer.attempts[1]
    return first.elapsed_ms - hedge.elapsed_ms


async def until(predicate: object, timeout_s: float) -> bool:
    """Poll ``predicate`` (a sync callable run in a thread) until it is true or time is up."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_slow_endpoint_is_hedged_and_the_loser_is_dropped_at_its_worker(
    workers: tuple[WorkerProcess, WorkerProcess], taught: Dispatcher, hooks: OtelHooks
) -> None:
    a, b = workers
    before_a, before_b = counts(a), counts(b)
    a.post("/admin/faults", json={"latency_ms": SLOW_MS})
    threshold = taught.latency.seconds_quantile(f"primary@{a.base}", time.monotonic(), 0.95)
    assert threshold is not None
    answer = await taught.complete(call(hedge_quantile=0.95), time.time() + 60)
    log = [(r.attempt, r.endpoint, r.status, r.hedge) for r in answer.attempts]
    assert log == [(1, a.base, "cancelled", 2), (2, b.base, "ok", 1)]
    assert answer.endpoint == b.base
    assert "attempt 2 answered first" in (answer.attempts[0].detail or "")
    # Not started before A's recent 95th percentile ...
    assert answer.attempts[0].elapsed_ms >= threshold * 1000
    # ... and at it, not at A's injected latency: A's attempt lasted until B answered, so the
    # difference of the two is when the hedge started (plus the loser's wind-down, <= 50 ms).
    assert hedged_after_ms(answer) < threshold * 1000 + TIMER_SLACK_MS
    # A saw its client leave (499) and generated nothing for it; B answered once.
    assert await until(lambda: counts(a)["gone"] == before_a["gone"] + 1, timeout_s=5)
    after_a, after_b = counts(a), counts(b)
    assert after_a["ok"] == before_a["ok"]
    assert after_a["tokens"] == before_a["tokens"]
    assert after_b["ok"] == before_b["ok"] + 1
    assert after_b["tokens"] > before_b["tokens"]
    # On the trace: the hedge's span says so; the loser's ends cancelled.
    assert isinstance(hooks.exporter, InMemorySpanExporter)
    spans = [s for s in hooks.exporter.get_finished_spans() if s.name == attr.SPAN_DISPATCH]
    pair = [dict(s.attributes or {}) for s in spans[-2:]]
    by_attempt = {a[attr.ATTEMPT]: a for a in pair}
    assert by_attempt[1][attr.STATUS] == "cancelled"
    assert attr.HEDGE not in by_attempt[1]
    assert by_attempt[2][attr.STATUS] == "ok"
    assert by_attempt[2][attr.HEDGE] is True


async def test_no_hedge_without_the_hedge_field(
    workers: tuple[WorkerProcess, WorkerProcess], taught: Dispatcher
) -> None:
    a, b = workers
    before_b = counts(b)
    a.post("/admin/faults", json={"latency_ms": 1000})
    answer = await taught.complete(call(), time.time() + 30)
    assert [(r.endpoint, r.status, r.hedge) for r in answer.attempts] == [(a.base, "ok", None)]
    assert answer.attempts[0].elapsed_ms >= 1000
    assert counts(b) == before_b


async def test_no_hedge_with_a_single_endpoint(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    a, _ = workers
    d = dispatcher(a.base)
    try:
        for _ in range(4):
            await d.complete(call(), time.time() + 30)
        a.post("/admin/faults", json={"latency_ms": 1000})
        answer = await d.complete(call(hedge_quantile=0.5), time.time() + 30)
    finally:
        await d.close()
    assert [(r.endpoint, r.status, r.hedge) for r in answer.attempts] == [(a.base, "ok", None)]


async def test_no_hedge_when_the_time_left_cannot_hold_another_answer(
    workers: tuple[WorkerProcess, WorkerProcess], taught: Dispatcher
) -> None:
    a, b = workers
    before_b = counts(b)
    a.post("/admin/faults", json={"latency_ms": SLOW_MS})
    now = time.monotonic()
    threshold = taught.latency.seconds_quantile(f"primary@{a.base}", now, 0.95)
    usual = taught.latency.p50("primary", now)
    assert threshold is not None
    assert usual is not None
    # At the threshold, only half the model's usual answer time would be left.
    with pytest.raises(DispatchFailed) as failed:
        await taught.complete(call(hedge_quantile=0.95), time.time() + threshold + usual / 2)
    assert [(r.endpoint, r.status, r.hedge) for r in failed.value.attempts] == [
        (a.base, "timeout", None)
    ]
    assert counts(b) == before_b


async def test_a_failed_hedge_does_not_fail_the_step_while_the_first_runs(
    workers: tuple[WorkerProcess, WorkerProcess], taught: Dispatcher
) -> None:
    a, b = workers
    a.post("/admin/faults", json={"latency_ms": 1000})
    b.post("/admin/faults", json={"error_rate": 1.0})
    answer = await taught.complete(call(hedge_after_ms=100), time.time() + 30)
    log = [(r.attempt, r.endpoint, r.status, r.hedge) for r in answer.attempts]
    assert log == [(1, a.base, "ok", 2), (2, b.base, "5xx", 1)]
    assert answer.endpoint == a.base
    assert "injected error" in (answer.attempts[1].detail or "")


async def test_a_streamed_step_hedges_before_its_first_token_and_streams_one_answer(
    workers: tuple[WorkerProcess, WorkerProcess], taught: Dispatcher
) -> None:
    a, b = workers
    before_a = counts(a)
    a.post("/admin/faults", json={"latency_ms": SLOW_MS})
    pieces: list[str] = []
    streamed = call(hedge_quantile=0.9, on_token=pieces.append)
    usual = taught.latency.seconds_quantile(f"primary@{a.base}", time.monotonic(), 0.9)
    assert usual is not None
    # While A's attempt runs longer than A usually needs, A counts as slow now and the hedge
    # starts once it has run what B is expected to need, if that is sooner than A's p90
    # (dispatch/_adapt.hedge_after): on a loaded machine one slow taught answer can make it so.
    elsewhere = taught.expected("primary", streamed, streamed.max_tokens, 0.5)
    threshold = usual if elsewhere is None else min(usual, elsewhere)
    answer = await taught.complete(streamed, time.time() + 60)
    assert answer.endpoint == b.base
    # A ran at least to that threshold before the hedge, and B's first token came before any
    # of A's (which could not come before its injected SLOW_MS).
    assert answer.attempts[0].elapsed_ms >= threshold * 1000
    assert pieces
    assert "".join(pieces) == answer.text
    assert [(r.endpoint, r.status) for r in answer.attempts] == [
        (a.base, "cancelled"),
        (b.base, "ok"),
    ]
    assert await until(lambda: counts(a)["gone"] == before_a["gone"] + 1, timeout_s=5)
    assert counts(a)["tokens"] == before_a["tokens"]
