"""The circuit-breaker state machine, table by table (pure: time is passed in)."""

from __future__ import annotations

import pytest

from chainrt.dispatch._breaker import (
    CLOSED,
    DEFAULT_POLICIES,
    BreakerPolicy,
    BreakerState,
    abandon,
    abandon_all,
    admit,
    admit_all,
    cooldown,
    record,
    record_all,
    refuses,
)

POLICY = BreakerPolicy(window=4, min_requests=3, failure_rate=0.5, cooldown_s=10.0)


def run(events: list[tuple[str, float]], policy: BreakerPolicy = POLICY) -> list[str]:
    """Replay events ("ok"/"fail" results of admitted requests, "try" admissions) and return
    the phase after each; a refused "try" reads "refused"."""
    state = CLOSED
    trial = False
    phases = []
    for event, now in events:
        if event == "try":
            after = admit(state, policy, now)
            if after is None:
                phases.append("refused")
                continue
            trial = after.phase == "half_open"
            state = after
        else:
            state = record(state, policy, failed=event == "fail", now=now, trial=trial)
            trial = False
        phases.append(state.phase)
    return phases


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Below min_requests nothing opens, however bad.
        ([("fail", 0), ("fail", 1)], ["closed", "closed"]),
        # The third result reaches min_requests: 2 of 3 failed ≥ 50 % → open.
        ([("fail", 0), ("ok", 1), ("fail", 2)], ["closed", "closed", "open"]),
        # 1 of 3 failed: stays closed.
        ([("fail", 0), ("ok", 1), ("ok", 2)], ["closed", "closed", "closed"]),
        # The window slides: old failures fall out (window=4).
        (
            [("fail", 0), ("ok", 1), ("ok", 2), ("ok", 3), ("fail", 4), ("ok", 5)],
            ["closed"] * 6,
        ),
        # Exactly at the threshold opens (2 of 4).
        ([("ok", 0), ("fail", 1), ("ok", 2), ("fail", 3)], ["closed", "closed", "closed", "open"]),
    ],
)
def test_closed_opens_on_failure_rate_over_the_window(
    events: list[tuple[str, float]], expected: list[str]
) -> None:
    assert run(events) == expected


OPEN_AT_2 = [("fail", 0.0), ("fail", 1.0), ("fail", 2.0)]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Open refuses everything during the cool-down.
        ([("try", 5.0), ("try", 11.9)], ["refused", "refused"]),
        # After the cool-down exactly one trial goes; the next is refused while it is out.
        ([("try", 12.0), ("try", 12.5)], ["half_open", "refused"]),
        # The trial succeeds: closed, and everyone goes.
        ([("try", 12.0), ("ok", 12.1), ("try", 12.2)], ["half_open", "closed", "closed"]),
        # The trial fails: open again, for a fresh cool-down from the failure.
        (
            [("try", 12.0), ("fail", 12.1), ("try", 20.0), ("try", 22.1)],
            ["half_open", "open", "refused", "half_open"],
        ),
        # A trial out for longer than the cool-down is presumed lost: another one goes.
        ([("try", 12.0), ("try", 21.9), ("try", 22.0)], ["half_open", "refused", "half_open"]),
    ],
)
def test_open_half_open_closed(events: list[tuple[str, float]], expected: list[str]) -> None:
    assert run(OPEN_AT_2 + events)[3:] == expected


def test_straggler_results_do_not_decide_a_half_open_breaker() -> None:
    opened = BreakerState("open", (), opened_at=0.0)
    half = admit(opened, POLICY, 10.0)
    assert half is not None
    assert half.phase == "half_open"
    # A request let through before the breaker opened ends now: it is not the trial.
    assert record(half, POLICY, failed=False, now=10.1, trial=False) == half
    assert record(half, POLICY, failed=True, now=10.1, trial=False) == half
    assert record(opened, POLICY, failed=False, now=1.0, trial=False) == opened


def test_a_cancelled_trial_frees_the_slot_at_once() -> None:
    half = admit(BreakerState("open", (), opened_at=0.0), POLICY, 10.0)
    assert half is not None
    assert admit(half, POLICY, 10.5) is None
    freed = abandon(half, trial=True)
    assert admit(freed, POLICY, 10.5) is not None
    # A cancelled non-trial changes nothing.
    assert abandon(half, trial=False) == half


def test_refuses_does_not_change_state() -> None:
    opened = BreakerState("open", (), opened_at=0.0)
    assert refuses(opened, POLICY, 5.0)
    assert not refuses(opened, POLICY, 10.0)
    assert not refuses(CLOSED, POLICY, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window"),
        ({"window": 3, "min_requests": 4}, "min_requests"),
        ({"failure_rate": 0.0}, "failure_rate"),
        ({"failure_rate": 1.5}, "failure_rate"),
        ({"cooldown_s": -1.0}, "cooldown_s"),
        ({"trip_unproven": -1}, "trip_unproven"),
        ({"cooldown_s": 5.0, "max_cooldown_s": 4.0}, "max_cooldown_s"),
    ],
)
def test_policy_bounds(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ per error class


def test_classes_count_separately_and_any_open_class_refuses() -> None:
    policies = {"connect": POLICY, "5xx": POLICY}
    states: dict[str, BreakerState] = {}
    for now in (0.0, 1.0, 2.0):
        admitted = admit_all(states, policies, now)
        assert admitted is not None
        states, trials = admitted
        assert trials == frozenset()
        states = record_all(states, policies, error_class="connect", now=now, trials=trials)
    assert states["connect"].phase == "open"
    # The other class saw three requests that were not its failures.
    assert states["5xx"].phase == "closed"
    assert states["5xx"].results == (False, False, False)
    assert admit_all(states, policies, 5.0) is None


def test_half_open_trial_is_shared_by_all_classes_and_closes_on_an_answer() -> None:
    policies = {"connect": POLICY, "5xx": POLICY}
    states = {
        "connect": BreakerState("open", (), opened_at=0.0),
        "5xx": BreakerState("closed", (True, False)),
    }
    admitted = admit_all(states, policies, 10.0)
    assert admitted is not None
    states, trials = admitted
    assert trials == frozenset({"connect"})
    assert admit_all(states, policies, 10.1) is None  # one trial only
    states = record_all(states, policies, error_class=None, now=10.2, trials=trials)
    assert states["connect"] == BreakerState("closed", (False,))  # the trial's answer counts
    assert states["5xx"].results == (True, False, False)


def test_trial_failing_with_another_class_still_proves_the_endpoint_reachable() -> None:
    policies = {"connect": POLICY, "overloaded": POLICY}
    states = {"connect": BreakerState("open", (), opened_at=0.0)}
    admitted = admit_all(states, policies, 10.0)
    assert admitted is not None
    states, trials = admitted
    states = record_all(states, policies, error_class="overloaded", now=10.1, trials=trials)
    assert states["connect"].phase == "closed"
    assert states["overloaded"].results == (True,)


def test_abandon_all_frees_only_the_trial_classes() -> None:
    policies = {"connect": POLICY}
    admitted = admit_all({"connect": BreakerState("open", (), opened_at=0.0)}, policies, 10.0)
    assert admitted is not None
    states, trials = admitted
    freed = abandon_all(states, trials)
    assert freed["connect"].trial_since is None
    assert admit_all(freed, policies, 10.1) is not None


def test_default_policies_trip_fast_on_connect_and_slowly_on_429() -> None:
    def failures_to_open(policy: BreakerPolicy) -> int:
        state = CLOSED
        for count in range(1, 100):
            state = record(state, policy, failed=True, now=float(count), trial=False)
            if state.phase == "open":
                return count
        return -1

    assert failures_to_open(DEFAULT_POLICIES["connect"]) == 2
    assert failures_to_open(DEFAULT_POLICIES["overloaded"]) == 10
    assert DEFAULT_POLICIES["overloaded"].cooldown_s < DEFAULT_POLICIES["timeout"].cooldown_s


# ------------------------------------------------------------------ hung endpoints (issue 14)

HUNG = BreakerPolicy(
    window=20, min_requests=4, failure_rate=0.5, cooldown_s=2.0, trip_unproven=1, max_cooldown_s=8.0
)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Never answered: the first failure opens it (min_requests is 4).
        ([("fail", 0)], ["open"]),
        # Answered once: one failure is not enough; the usual rule decides (2 of 4).
        ([("ok", 0), ("fail", 1)], ["closed", "closed"]),
        ([("ok", 0), ("fail", 1), ("ok", 2), ("fail", 3)], ["closed"] * 3 + ["open"]),
        # A trial that answers closes it with that answer in the window: a later lone failure
        # does not reopen it at once.
        (
            [("fail", 0), ("try", 2.0), ("ok", 2.1), ("fail", 3)],
            ["open", "half_open"] + ["closed"] * 2,
        ),
    ],
)
def test_trip_unproven(events: list[tuple[str, float]], expected: list[str]) -> None:
    assert run(events, HUNG) == expected


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Each failed trial doubles the wait for the next one: 2 s, 4 s, 8 s, then 8 s (the cap).
        (
            [
                ("fail", 0),
                ("try", 1.9),
                ("try", 2.0),
                ("fail", 2.0),
                ("try", 5.9),
                ("try", 6.0),
                ("fail", 6.0),
                ("try", 13.9),
                ("try", 14.0),
                ("fail", 14.0),
                ("try", 21.9),
                ("try", 22.0),
            ],
            [
                "open",
                "refused",
                "half_open",
                "open",
                "refused",
                "half_open",
                "open",
                "refused",
                "half_open",
                "open",
                "refused",
                "half_open",
            ],
        ),
        # A successful trial resets it: the next opening waits the plain cool-down again.
        (
            [
                ("fail", 0),
                ("try", 2.0),
                ("fail", 2.0),
                ("try", 6.0),
                ("ok", 6.1),
                ("ok", 7),
                ("fail", 8),
                ("fail", 9),
                ("try", 10.9),
                ("try", 11.0),
            ],
            [
                "open",
                "half_open",
                "open",
                "half_open",
                "closed",
                "closed",
                "closed",
                "open",
                "refused",
                "half_open",
            ],
        ),
    ],
)
def test_failed_trials_grow_the_cooldown(
    events: list[tuple[str, float]], expected: list[str]
) -> None:
    assert run(events, HUNG) == expected


@pytest.mark.parametrize(
    ("failed_trials", "policy", "expected"),
    [
        (0, HUNG, 2.0),
        (1, HUNG, 4.0),
        (2, HUNG, 8.0),
        (9, HUNG, 8.0),  # capped
        (3, POLICY, 10.0),  # no max_cooldown_s: never grows
    ],
)
def test_cooldown(failed_trials: int, policy: BreakerPolicy, expected: float) -> None:
    state = BreakerState("open", (), opened_at=0.0, failed_trials=failed_trials)
    assert cooldown(state, policy) == expected


def test_default_timeout_breaker_finds_a_never_answering_endpoint_at_once() -> None:
    policy = DEFAULT_POLICIES["timeout"]
    assert record(CLOSED, policy, failed=True, now=0.0, trial=False).phase == "open"
    answered = record(CLOSED, policy, failed=False, now=0.0, trial=False)
    assert record(answered, policy, failed=True, now=1.0, trial=False).phase == "closed"
