"""Dispatch adapting within a latency spike, through two real chainrt workers (issue 42).

The workers run the local llama.cpp engine (SmolLM2) with fault injection on; a spike is
injected latency before the engine (``/admin/faults``, ``latency_ms``). The fallback is the
in-process local model (the same SmolLM2, real generations).

* An endpoint entering a spike is avoided after its first slow request: the request that meets
  the spike marks its endpoint slow (it runs past 2.5x the model's usual time), is retried on
  the other endpoint, and the four requests sent at once right after it all go to the other
  endpoint, while the spiked one is still usable (no breaker opened).
* Four runs falling back at once all get their answer: the only primary endpoint turns slow,
  each attempt there starts the fallback beside it once it has run past its slow mark, and the
  four fallbacks queued on the one local engine all answer inside a deadline that would not
  hold them behind a cut at 5x the primary's median (the old stuck cut).
* A first attempt whose cut would leave no room for a retry on the other endpoint is not cut:
  it runs on beside the fallback (both endpoints in a spike here), and the fallback answers.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from worker_fixtures import WorkerProcess

from chainrt._records import AttemptRecord
from chainrt.dispatch import Dispatcher, HttpBackend, LlmCall, LocalBackend, ModelBackend
from chainrt.dispatch._breaker import DEFAULT_POLICIES
from chainrt.dispatch._resources import PoolResources
from chainrt.errors import DispatchFailed

pytestmark = pytest.mark.slow

SERVED = "smol"
SPIKE_MS = 20_000
"""The injected latency: far longer than every step of these tests (an answer from the spiked
endpoint would come too late to pass them; the attempts there are cut or cancelled, so it costs
no time when the tests pass)."""
PROMPT = "What is the capital of France?"


def dispatcher(*urls: str, local: bool = False) -> Dispatcher:
    resources = PoolResources(DEFAULT_POLICIES, health_interval_s=None)
    backends: dict[str, ModelBackend] = {
        "primary": HttpBackend("primary", SERVED, [(u, 1.0) for u in urls], resources=resources)
    }
    if local:
        backends["local"] = LocalBackend()
    return Dispatcher(backends)


def call(**kw: object) -> LlmCall:
    return LlmCall(model="primary", messages=[("user", PROMPT)], max_tokens=8, **kw)  # type: ignore[arg-type]


async def test_an_endpoint_entering_a_spike_is_avoided_after_its_first_slow_request(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    a, b = workers
    d = dispatcher(a.base, b.base)
    backend = d.backend("primary")
    assert isinstance(backend, HttpBackend)
    try:
        # The model's usual time, from both endpoints: each has answered at least twice (an
        # endpoint that never answered would have its timeout breaker opened by its first
        # judged timeout, a case of its own: tests/test_breaker.py::test_trip_unproven).
        answered = {a.base: 0, b.base: 0}
        for _ in range(30):
            got = await d.complete(call(), time.time() + 30)
            assert got.endpoint is not None
            answered[got.endpoint] += 1
            if min(answered.values()) >= 2 and sum(answered.values()) >= 6:
                break
        assert min(answered.values()) >= 2, answered
        a.post("/admin/faults", json={"latency_ms": SPIKE_MS})
        # Requests one at a time until one meets the spike (each goes to A with chance 1/2).
        victim: AttemptRecord | None = None
        victim_end = 0.0
        for _ in range(30):
            answer = await d.complete(call(attempts=2), time.time() + 30)
            on_a = [r for r in answer.attempts if r.endpoint == a.base]
            if on_a:
                victim, victim_end = on_a[0], time.time()
                assert answer.endpoint == b.base, answer.attempts  # retried on B
                break
        assert victim is not None, "no request went to A in 30 tries"
        # Cut as a stuck attempt (far sooner than the spike), with A still usable: no breaker.
        assert victim.status == "timeout", victim
        assert victim.elapsed_ms < SPIKE_MS / 2, victim
        assert backend.usable_count(frozenset()) == 2, backend.why_unavailable()
        # A is slow now: its cut request ran past the slow mark and nothing has answered there
        # since it started; the quick answers A gave before the spike do not outvote it ...
        slow = d.slow_endpoints("primary", call(), 8)
        pace = d.paces.pace(f"primary@{a.base}", time.monotonic(), 60.0, d.usual_rate("primary"))
        assert slow == {a.base}, (slow, pace, d.usual_rate("primary"), time.time() - victim_end)
        # ... and four requests at once, right after, all go to B. Without the pace, the choice
        # weighs in-flight load only, and four at once go to A with odds 1 - 1/120.
        answers = await asyncio.gather(*(d.complete(call(), time.time() + 30) for _ in range(4)))
        endpoints = [r.endpoint for got in answers for r in got.attempts]
        assert endpoints == [b.base] * 4, [got.attempts for got in answers]
        assert all(got.text.strip() for got in answers)
    finally:
        await d.close()


async def test_four_runs_falling_back_at_once_all_get_their_answer(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    a, _ = workers
    d = dispatcher(a.base, local=True)
    try:
        await d.prepare(["local"])
        # The primary's usual time and the local model's, measured here on this machine.
        started = time.perf_counter()
        for _ in range(4):
            got = await d.complete(call(), time.time() + 30)
            assert got.model == "primary"
        primary_s = (time.perf_counter() - started) / 4
        started = time.perf_counter()
        for _ in range(2):
            local = LlmCall(model="local", messages=[("user", PROMPT)], max_tokens=8)
            got = await d.complete(local, time.time() + 30)
        local_s = (time.perf_counter() - started) / 2
        a.post("/admin/faults", json={"latency_ms": SPIKE_MS})
        # The deadline holds the slow mark (2.5x the primary's usual) and four local answers in
        # a row, with a margin of one more and half a primary answer; a cut at 5x the
        # primary's median before the fallback (the old stuck cut) leaves the fourth run
        # 2x the primary's median less.
        budget_s = 3 * primary_s + 5 * local_s
        deadline = time.time() + budget_s
        answers = await asyncio.gather(
            *(d.complete(call(fallbacks=["local"]), deadline) for _ in range(4))
        )
        for got in answers:
            assert got.model == "local", got.attempts
            assert got.finish_reason != "deadline", (got.attempts, primary_s, local_s)
            assert got.text.strip()
            statuses = [(r.model, r.status) for r in got.attempts]
            # The primary's attempt ran on beside the fallback and was cancelled when it won.
            assert ("primary", "cancelled") in statuses, statuses
            assert statuses[-1] == ("local", "ok"), statuses  # the answer stays last
        assert time.time() <= deadline + 0.5
    finally:
        await d.close()


async def test_a_first_attempt_with_no_room_for_a_retry_runs_on_beside_the_fallback(
    workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    # A step that holds one primary answer and two of the fallback's: the first attempt's cut
    # leaves no room for a retry on the other endpoint (dispatch/_policy.py attempt_plan). The
    # attempt is not cut for a retry that would be skipped: it runs on beside the fallback, and
    # the fallback's answer wins (bench/fallback.py: 31 of 32 failed steps were a first attempt
    # cut with no retry after it and the fallback alone behind a queue).
    a, b = workers
    d = dispatcher(a.base, b.base, local=True)
    try:
        await d.prepare(["local"])
        answered = {a.base: 0, b.base: 0}
        for _ in range(30):
            got = await d.complete(call(), time.time() + 30)
            assert got.endpoint is not None
            answered[got.endpoint] += 1
            if min(answered.values()) >= 2 and sum(answered.values()) >= 6:
                break
        assert min(answered.values()) >= 2, answered
        local = LlmCall(model="local", messages=[("user", PROMPT)], max_tokens=8)
        for _ in range(3):
            await d.complete(local, time.time() + 30)
        probe = call(attempts=2, fallbacks=["local"])
        p50 = d.expected("primary", probe, 8, 0.5)
        local_p90 = d.expected("local", local, 8, 0.9)
        assert p50 is not None
        assert local_p90 is not None
        for worker in workers:  # both endpoints in a spike: no primary answer can come
            worker.post("/admin/faults", json={"latency_ms": SPIKE_MS})
        budget_s = p50 + 2 * local_p90
        deadline = time.time() + budget_s
        try:
            got = await d.complete(probe, deadline)
        except DispatchFailed as exc:  # the fallback missed too (a loaded machine)
            answer, attempts = None, exc.attempts
        else:
            answer, attempts = got, got.attempts
        statuses = [(r.model, r.status) for r in attempts]
        primary = [r for r in attempts if r.model == "primary"]
        # One attempt at the primary, no retry, and the fallback tried beside it.
        assert len(primary) == 1, (statuses, p50, local_p90)
        assert any(r.model == "local" for r in attempts), statuses
        # Not cut before the fallback began (the old cut logged a plain `timeout` then): the
        # attempt ran on beside the fallback, and was either cancelled when the fallback won or
        # reached the step's deadline first (on a loaded machine the fallback's answer can come
        # a moment after the deadline, which the caller still gets).
        assert primary[0].status in ("cancelled", "timeout"), (statuses, p50, local_p90)
        assert "the fallback started beside it" in str(primary[0].detail), primary[0]
        if answer is not None:
            assert answer.model == "local", statuses
            assert statuses[-1] == ("local", "ok"), statuses
        assert time.time() <= deadline + 0.5
    finally:
        await d.close()
