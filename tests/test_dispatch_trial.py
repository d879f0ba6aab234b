"""A half-open trial on an endpoint whose circuit opened is cut at the model's p90 (issue 14).

Real HTTP: the pool's ``primary`` has an endpoint that accepts connections and never answers
(a listening socket nobody reads) and a chat server that answers after 200 ms. The first step
sent to the silent endpoint is cut as any attempt is (3x the model's median) and opens its
``timeout`` breaker; once the cool-down has passed, the next step's attempt there is the trial,
and it is cut at the model's expected p90 for the request (its marker in the attempt log),
counted as a timeout (the breaker reopens, one failed trial), and the step is answered by the
other endpoint. Before, a trial ran to the attempt's usual cut: in ``bench/fallback.py --scenario
hung --load-cores 2`` a step's two primary attempts, one of them the trial, took 1,472 + 1,175 ms
of its 3 s and the local fallback was cut at 371 ms.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_stub import ChatStub, serve

from chainrt.dispatch import make_dispatcher
from chainrt.dispatch._adapt import RECENT_S
from chainrt.dispatch._endpoints import EndpointState, Ticket
from chainrt.dispatch._http import HttpBackend, _trial_deadline
from chainrt.dispatch._policy import trial_span
from chainrt.dispatch._types import LlmCall

TRIAL_MARK = "the trial of an endpoint whose circuit was open"


@pytest.fixture
def slow_stub() -> Iterator[ChatStub]:
    yield from serve("Paris", 0.9, delay_s=0.2)


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def _within_ms(detail: str | None) -> int:
    found = re.search(r"no answer within (\d+)ms", detail or "")
    assert found, detail
    return int(found.group(1))


async def test_a_trial_on_a_hung_endpoint_is_cut_at_the_models_p90(
    tmp_path: Path, slow_stub: ChatStub, silent: str
) -> None:
    pool = tmp_path / "pool.yaml"
    # The silent endpoint's capacity makes it the choice whenever its circuit admits a request.
    pool.write_text(
        "models:\n  primary:\n    endpoints:\n"
        f"      - {{url: '{silent}', capacity: 1000000}}\n"
        f"      - {{url: '{slow_stub.url}', capacity: 1}}\n"
        "health: {enabled: false}\n"
        "breakers:\n  timeout: {cooldown: 300ms, max_cooldown: 300ms}\n"
    )
    dispatcher = make_dispatcher(pool)
    backend = dispatcher.backend("primary")
    assert isinstance(backend, HttpBackend)
    table = backend.resources.table
    call = LlmCall(model="primary", messages=[("user", "hi")], max_tokens=1, attempts=2)
    try:
        # Figures first: three answers of the answering endpoint.
        for _ in range(3):
            warm = LlmCall(model="primary", messages=[("user", "hi")], max_tokens=1)
            warm.not_endpoint = silent
            got = await dispatcher.complete(warm, time.time() + 10)
            assert got.endpoint == slow_stub.url
        # A plain attempt on the silent endpoint: cut as usual, its circuit opens.
        opened = await dispatcher.complete(call, time.time() + 10)
        first, answered = opened.attempts
        assert (first.endpoint, first.status) == (silent, "timeout")
        assert TRIAL_MARK not in (first.detail or "")
        assert (answered.endpoint, answered.status) == (slow_stub.url, "ok")
        assert table.state(silent).breakers["timeout"].phase == "open"
        # Past the cool-down, and past the second for which the cut marks the endpoint slow
        # (avoided while another answers): the next request there is the trial.
        await asyncio.sleep(max(0.4, RECENT_S + 0.1))
        cap = trial_span(dispatcher.expected("primary", call, 1, 0.9), something_after=True)
        assert cap is not None
        tried = await dispatcher.complete(call, time.time() + 10)
    finally:
        await dispatcher.close()
    trial, answered = tried.attempts
    assert (trial.endpoint, trial.status) == (silent, "timeout")
    assert TRIAL_MARK in (trial.detail or ""), trial.detail
    assert _within_ms(trial.detail) <= round(cap * 1000) + 1
    assert (answered.endpoint, answered.status) == (slow_stub.url, "ok")
    # The cut trial is the verdict: the circuit reopened, its cool-down doubles from here.
    breaker = table.state(silent).breakers["timeout"]
    assert (breaker.phase, breaker.failed_trials) == ("open", 1)


@pytest.mark.parametrize(
    ("trials", "trial_s", "end_in_s", "capped"),
    [
        (frozenset({"timeout"}), 0.3, 5.0, True),  # a timeout trial: cut at its span
        (frozenset({"timeout", "5xx"}), 0.3, 5.0, True),
        (frozenset({"timeout"}), 0.3, 0.1, False),  # its own end comes first
        (frozenset({"timeout"}), None, 5.0, False),  # no span: the step's last chance
        (frozenset(), 0.3, 5.0, False),  # not a trial
        # A 5xx or low-confidence trial asks whether the endpoint answers without an error.
        (frozenset({"5xx"}), 0.3, 5.0, False),
        (frozenset({"low_confidence"}), 0.3, 5.0, False),
    ],
)
def test_trial_deadline(
    trials: frozenset[str], trial_s: float | None, end_in_s: float, capped: bool
) -> None:
    call = LlmCall(model="m", messages=[("user", "hi")], trial_s=trial_s)
    deadline = time.time() + end_in_s
    end, was_capped = _trial_deadline(call, Ticket(EndpointState("u"), trials), deadline)
    assert was_capped is capped
    if capped:
        assert trial_s is not None
        assert end < deadline
        assert end <= time.time() + trial_s
    else:
        assert end == deadline
