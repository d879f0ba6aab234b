"""The ``low_confidence`` breaker (docs/dispatch.md, issue 17): answers scored below the threshold count
against their endpoint; once the share in the window opens the breaker, later steps skip that
endpoint at once and go to their fallback.

Two real HTTP servers stand in for two models (one always unsure, one sure); the chain runs
through the real dispatcher, pool file and store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_stub import ChatStub, serve

import chainrt
from chainrt import SpecError
from chainrt.dispatch._breaker import DEFAULT_POLICIES
from chainrt.dispatch._pool import parse_pool_config
from chainrt.store import StepRecord, open_store


@pytest.fixture
def unsure() -> Iterator[ChatStub]:
    yield from serve("maybe", 0.2)


@pytest.fixture
def sure() -> Iterator[ChatStub]:
    yield from serve("yes", 0.95)


def _pool(tmp_path: Path, unsure: ChatStub, sure: ChatStub, primary_extra: str = "") -> str:
    path = tmp_path / "pool.yaml"
    path.write_text(
        "models:\n"
        f"  primary: {{endpoints: [{{url: '{unsure.url}'}}]{primary_extra}}}\n"
        f"  backup: {{endpoints: [{{url: '{sure.url}'}}]}}\n"
        "health: {enabled: false}\n"
        "breakers:\n"
        "  low_confidence: {window: 4, min_requests: 2, failure_rate: 0.5, cooldown: 60s}\n"
    )
    return str(path)


def _chain(tmp_path: Path, steps: int, extra: str = "") -> chainrt.Chain:
    body = "".join(
        f"  - id: s{i}\n"
        f"    llm: {{model: primary, prompt: 'question {i}', max_tokens: 4}}\n"
        "    fallbacks: [backup]\n"
        f"{extra}"
        for i in range(steps)
    )
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"name: unsure\nbudget: 30s\nsteps:\n{body}output: '{{{{ steps.s0.output }}}}'\n"
    )
    return chainrt.load(path)


async def _records(store: str, run_id: str) -> dict[str, StepRecord]:
    opened = open_store(store)
    try:
        return await opened.get_steps(run_id)
    finally:
        await opened.close()


async def test_pool_threshold_opens_the_breaker_and_later_steps_skip_the_endpoint(
    tmp_path: Path, unsure: ChatStub, sure: ChatStub
) -> None:
    pool = _pool(tmp_path, unsure, sure, ", low_confidence_below: 0.6")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = await _chain(tmp_path, 4).arun({}, run_id="lc-pool", store=store, pool=pool)
    records = await _records(store, "lc-pool")
    assert result.status == "completed", result.error
    # Two unsure answers (min_requests 2, all low) open the breaker; they are still the answers.
    assert [s.model for s in result.steps] == ["primary", "primary", "backup", "backup"]
    assert [records[f"s{i}"].output for i in range(4)] == ["maybe", "maybe", "yes", "yes"]
    assert unsure.requests == 2  # the open breaker sent nothing more to the unsure endpoint
    assert sure.requests == 2
    skipped = records["s2"].attempt_log[0]
    assert skipped.model == "primary"
    assert skipped.detail is not None
    assert "circuit open (low_confidence)" in skipped.detail


async def test_without_a_threshold_low_scores_do_not_count(
    tmp_path: Path, unsure: ChatStub, sure: ChatStub
) -> None:
    result = await _chain(tmp_path, 4).arun(
        {}, run_id="lc-none", store=f"sqlite:///{tmp_path / 'runs.db'}",
        pool=_pool(tmp_path, unsure, sure),
    )  # fmt: skip
    assert result.status == "completed", result.error
    assert [s.model for s in result.steps] == ["primary"] * 4
    assert unsure.requests == 4
    assert sure.requests == 0


async def test_verify_below_is_the_threshold_and_wins_over_the_pool(
    tmp_path: Path, unsure: ChatStub, sure: ChatStub
) -> None:
    # The pool says 0.1 (0.2 would be confident enough); the step's verify.below 0.6 decides.
    pool = _pool(tmp_path, unsure, sure, ", low_confidence_below: 0.1")
    verify = "    verify: {below: 0.6, with: [backup], on_mismatch: flag}\n"
    result = await _chain(tmp_path, 3, verify).arun(
        {}, run_id="lc-verify", store=f"sqlite:///{tmp_path / 'runs.db'}", pool=pool
    )
    assert result.status == "completed", result.error
    assert [s.model for s in result.steps] == ["primary", "primary", "backup"]
    assert [s.verification_status for s in result.steps] == ["mismatch", "mismatch", "unverified"]
    assert unsure.requests == 2
    assert sure.requests == 3  # two verifications, then the fallback's own answer


def test_pool_file_accepts_the_class_and_checks_the_threshold() -> None:
    config = parse_pool_config(
        "models:\n  m: {endpoints: [{url: 'http://h:1'}], low_confidence_below: 0.5}\n"
        "breakers:\n  low_confidence: {min_requests: 3}\n"
    )
    assert config.models["m"].low_confidence_below == 0.5
    policy = config.breaker_policies()["low_confidence"]
    assert policy.min_requests == 3
    assert policy.window == DEFAULT_POLICIES["low_confidence"].window
    with pytest.raises(
        SpecError, match=r":1: models.m.low_confidence_below: .*less than or equal to 1"
    ):
        parse_pool_config(
            "models: {m: {endpoints: [{url: 'http://h:1'}], low_confidence_below: 2}}"
        )
