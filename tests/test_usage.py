"""Token usage, cost, the run's token budget and the key's safety: the pure parts, table-tested
(issue 41)."""

from __future__ import annotations

import pytest

from chainrt._records import AttemptRecord, StepRecord, TokenUsage
from chainrt.budget._tokens import TokenAccount, out_of_tokens, token_shortfall
from chainrt.dispatch._backend import BackendAnswer
from chainrt.dispatch._breaker import CLOSED, DEFAULT_POLICIES, admit, record
from chainrt.dispatch._credentials import EndpointAuth, auth_message
from chainrt.dispatch._http_wire import error_from_response
from chainrt.dispatch._usage import Price, answer_usage, cost_of, priced, read_usage


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "completion_tokens": 3}, (10, 3, None)),
        (
            {
                "prompt_tokens": 10,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
            (10, 3, 8),
        ),
        ({"prompt_tokens": "10", "completion_tokens": -1}, (0, 0, None)),  # garbage: absent
        ({"prompt_tokens": True, "completion_tokens": 2.5}, (0, 0, None)),
        ({"prompt_tokens": 10**13}, (0, 0, None)),
        ({"prompt_tokens_details": None}, (0, 0, None)),
        (None, (0, 0, None)),
        ([1, 2], (0, 0, None)),
    ],
)
def test_read_usage(usage: object, expected: tuple[int, int, int | None]) -> None:
    assert read_usage(usage) == expected


@pytest.mark.parametrize(
    ("price", "tokens", "expected"),
    [
        (Price(1.0, 2.0), (1_000_000, 1_000_000, None), 3.0),
        (Price(2.5, 10.0, 1.25), (21, 2, 16), (5 * 2.5 + 16 * 1.25 + 2 * 10.0) / 1e6),
        (Price(2.0, 0.0), (100, 0, 40), 200 / 1e6),  # no cached price: cached at the prompt's
        (Price(1.0, 1.0, 0.0), (10, 0, 50), 0.0),  # more cached than prompt: capped
        (Price(0.0, 0.0), (5, 5, None), 0.0),
    ],
)
def test_cost_of(price: Price, tokens: tuple[int, int, int | None], expected: float) -> None:
    assert cost_of(price, *tokens) == pytest.approx(expected)


def test_an_answer_without_tokens_has_no_usage_and_no_cost() -> None:
    silent = BackendAnswer("x", "stop", 0, 0)
    assert priced(silent, Price(1, 1)).cost is None
    assert answer_usage(silent) is None
    got = priced(BackendAnswer("x", "stop", 4, 6, cached_tokens=2), Price(1e6, 1e6))
    usage = answer_usage(got)
    assert usage is not None
    assert (usage.total_tokens, usage.cached_tokens, usage.cost) == (10, 2, 10.0)
    assert answer_usage(BackendAnswer("x", "stop", 4, 6)) == TokenUsage(
        prompt_tokens=4, completion_tokens=6, total_tokens=10
    )


def test_sums_keep_unknown_apart_from_zero() -> None:
    a = TokenUsage(prompt_tokens=3, completion_tokens=1, total_tokens=4, cost=0.5)
    b = TokenUsage(prompt_tokens=2, completion_tokens=2, cached_tokens=1, total_tokens=4)
    total = TokenUsage.of([a, None, b])
    assert total is not None
    assert (total.prompt_tokens, total.completion_tokens, total.total_tokens) == (5, 3, 8)
    assert total.cached_tokens == 1
    assert total.cost == 0.5
    assert TokenUsage.of([None, None]) is None
    assert TokenUsage.of([]) is None


def test_old_records_without_usage_still_load() -> None:
    # A record written before usage existed: no `usage` key anywhere.
    old = {
        "schema": 1,
        "step_id": "s",
        "status": "completed",
        "attempt_log": [{"attempt": 1, "model": "m", "status": "ok", "elapsed_ms": 3.0}],
    }
    step = StepRecord.model_validate(old)
    assert step.attempt_log[0].usage is None
    assert AttemptRecord.model_validate_json(step.attempt_log[0].model_dump_json()).usage is None


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "left", "spent", "fits"),
    [
        (10, 20, None, 0, True),  # no token budget
        (10, 20, 30, 0, True),  # exactly fits
        (10, 21, 30, 0, False),
        (10, 20, 50, 25, False),  # earlier attempts of the step used some
        (0, 1, 0, 0, False),
        (5, 5, 100, 90, True),
    ],
)
def test_token_shortfall(
    prompt: int, max_tokens: int, left: int | None, spent: int, fits: bool
) -> None:
    why = token_shortfall(prompt, max_tokens, left, spent)
    assert (why is None) is fits
    if why is not None:
        assert out_of_tokens(why)
        assert f"{prompt + max_tokens} tokens" in why


def test_the_account_counts_recorded_steps_of_a_resume() -> None:
    used = TokenUsage(prompt_tokens=30, completion_tokens=10, total_tokens=40)
    done = [
        StepRecord(
            step_id="a",
            status="completed",
            attempt_log=[AttemptRecord(attempt=1, status="ok", elapsed_ms=1, usage=used)],
        ),
        StepRecord(step_id="b", status="completed"),
    ]
    account = TokenAccount.for_run(100, done)
    assert account is not None
    assert account.left == 60
    account.spend(used)
    account.spend(used)
    assert account.left == 0  # never below zero
    assert TokenAccount.for_run(None, done) is None


KEY = "sk-proj-AbCdEfGh12345678"


def test_the_key_never_shows_in_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_KEY", KEY)
    auth = EndpointAuth("T_KEY")
    assert auth.request_headers() == {"Authorization": f"Bearer {KEY}"}
    body = (
        b'{"error": {"message": "Incorrect API key provided: sk-proj-********5678. You can '
        b'find your API key at https://x.", "type": "invalid_request_error"}}'
    )
    for quoted in (body, body.replace(b"sk-proj-********5678", KEY.encode())):
        error = error_from_response(401, {}, quoted, "https://api", auth=auth)
        assert error.error_class == "auth"
        assert not error.retryable
        assert "T_KEY" in error.message
        assert "HTTP 401" in error.message
        assert KEY not in error.message
        assert "5678" not in error.message
    forbidden = error_from_response(403, {}, b"{}", "https://api", auth=auth)
    assert forbidden.error_class == "auth"
    assert "refused access" in forbidden.message
    assert "no api_key_env" in auth_message(401, "", None)


def test_a_missing_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("T_KEY", raising=False)
    auth = EndpointAuth("T_KEY", "api-key", {"X-Team": "a"})
    assert auth.missing() == "API key variable T_KEY is not set (or empty)"
    assert auth.request_headers() == {"X-Team": "a"}
    monkeypatch.setenv("T_KEY", "  ")
    assert auth.missing() is not None  # empty counts as unset
    monkeypatch.setenv("T_KEY", "k-1")
    assert auth.missing() is None
    assert auth.request_headers() == {"X-Team": "a", "api-key": "k-1"}
    assert EndpointAuth().missing() is None


def test_one_refusal_opens_the_auth_breaker_and_a_trial_closes_it() -> None:
    policy = DEFAULT_POLICIES["auth"]
    state = record(CLOSED, policy, failed=True, now=0.0, trial=False)
    assert state.phase == "open"
    assert admit(state, policy, policy.cooldown_s - 0.1) is None
    trial = admit(state, policy, policy.cooldown_s)
    assert trial is not None
    assert trial.phase == "half_open"
    assert record(trial, policy, failed=False, now=31.0, trial=True).phase == "closed"
    # Many successes before do not hide a refusal: the key changed, it is wrong now.
    ok = CLOSED
    for i in range(10):
        ok = record(ok, policy, failed=False, now=float(i), trial=False)
    assert record(ok, policy, failed=True, now=11.0, trial=False).phase == "open"
