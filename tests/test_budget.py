"""The budget module: table tests and hypothesis properties (docs/chain-format.md, Budget)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrt.budget._steps import DEFAULT_MIN_STEP_MS, Allot, Plan, Skip, StepBudget, Stop, decide


@pytest.mark.parametrize(
    ("remaining", "steps", "expected"),
    [
        (
            8000,
            [StepBudget(0.2), StepBudget(0.1), StepBudget(0.4), StepBudget(0.2), StepBudget(0.1)],
            Allot(1600),
        ),
        (1000, [StepBudget(1), StepBudget(1)], Allot(500)),
        (1000, [StepBudget(1, max_ms=100), StepBudget(1)], Allot(100)),
        (1000, [StepBudget(1, min_ms=800), StepBudget(1)], Allot(800)),
        (1000, [StepBudget(1, min_ms=2000)], Stop("1000ms left, step needs 2000ms")),
        (
            3,
            [StepBudget(1, optional=True)],
            Skip(f"3ms left, step needs {DEFAULT_MIN_STEP_MS:.0f}ms"),
        ),
        (3, [StepBudget(1)], Stop(f"3ms left, step needs {DEFAULT_MIN_STEP_MS:.0f}ms")),
        (-50, [StepBudget(1)], Stop(f"0ms left, step needs {DEFAULT_MIN_STEP_MS:.0f}ms")),
        # An optional step gives way to the required step after it.
        (
            100,
            [StepBudget(1, optional=True), StepBudget(1, min_ms=97)],
            Skip("100ms left, 97ms reserved for the required steps after"),
        ),
        (100, [StepBudget(9, optional=True), StepBudget(1, min_ms=50)], Allot(50)),
    ],
)
def test_decide_table(remaining: float, steps: list[StepBudget], expected: object) -> None:
    got = decide(remaining, steps)
    if isinstance(expected, Allot):
        assert isinstance(got, Allot)
        assert got.ms == pytest.approx(expected.ms)
    else:
        assert got == expected


def test_decide_needs_a_step() -> None:
    with pytest.raises(ValueError, match="at least the step"):
        decide(100, [])


step_budgets = st.builds(
    StepBudget,
    weight=st.floats(min_value=0.01, max_value=100),
    min_ms=st.one_of(st.none(), st.floats(min_value=0, max_value=2000)),
    max_ms=st.one_of(st.none(), st.floats(min_value=1, max_value=5000)),
    optional=st.booleans(),
).filter(lambda s: s.min_ms is None or s.max_ms is None or s.min_ms <= s.max_ms)


@settings(max_examples=300, deadline=None)
@given(
    remaining=st.floats(min_value=-100, max_value=1e6),
    steps=st.lists(step_budgets, min_size=1, max_size=8),
)
def test_allotment_never_exceeds_time_left(remaining: float, steps: list[StepBudget]) -> None:
    decision = decide(remaining, steps)
    if isinstance(decision, Allot):
        assert 0 <= decision.ms <= max(remaining, 0)
        assert decision.ms >= steps[0].need_ms
        if steps[0].max_ms is not None:
            assert decision.ms <= steps[0].max_ms


def _simulate(
    total: float, steps: list[StepBudget], usage: list[float]
) -> tuple[list[float], float, list[str]]:
    """Drive decide() like the runner does: each step uses a fraction of its allotment (>1 = overrun,
    cut at the deadline, as the runner cuts it)."""
    used = 0.0
    allots: list[float] = []
    outcomes: list[str] = []
    for index in range(len(steps)):
        decision = decide(total - used, steps[index:])
        if isinstance(decision, Stop):
            outcomes.append("stop")
            break
        if isinstance(decision, Skip):
            outcomes.append("skip")
            continue
        allots.append(decision.ms)
        used += min(decision.ms * usage[index], decision.ms)  # the deadline cuts overruns
        outcomes.append("ran")
    return allots, used, outcomes


@settings(max_examples=300, deadline=None)
@given(
    total=st.floats(min_value=1, max_value=60_000),
    steps=st.lists(step_budgets, min_size=1, max_size=8),
    usage=st.lists(st.floats(min_value=0, max_value=5), min_size=8, max_size=8),
)
def test_run_stops_in_time_and_sum_within_budget(
    total: float, steps: list[StepBudget], usage: list[float]
) -> None:
    _allots, used, _ = _simulate(total, steps, usage)
    assert used <= total + 1e-6
    # Every allotment is carved from what was left, so even allotments sum within the budget when
    # each step uses all of it.
    full_allots, full_used, _ = _simulate(total, steps, [1.0] * 8)
    assert sum(full_allots) <= total + 1e-6
    assert full_used <= total + 1e-6


@settings(max_examples=200, deadline=None)
@given(
    total=st.floats(min_value=100, max_value=60_000),
    weights=st.lists(st.floats(min_value=0.05, max_value=10), min_size=2, max_size=6),
    fraction=st.floats(min_value=0, max_value=0.9),
)
def test_unused_time_flows_forward(total: float, weights: list[float], fraction: float) -> None:
    steps = [StepBudget(w) for w in weights]
    first = decide(total, steps)
    assert isinstance(first, Allot)
    # The first step leaves part of its allotment unused...
    used = first.ms * fraction
    second = decide(total - used, steps[1:])
    assert isinstance(second, Allot)
    # ...so the second gets more than its plain share of the budget, in proportion to its weight.
    plain_share = total * weights[1] / sum(weights)
    rest = sum(weights[1:])
    expected = max((total - used) * weights[1] / rest, DEFAULT_MIN_STEP_MS)
    assert second.ms == pytest.approx(expected)
    if first.ms == pytest.approx(total * weights[0] / sum(weights)):  # not bumped up to a minimum
        assert second.ms >= plain_share - 1e-6


# Whole numbers of ms and weights: every sum is exact in floats, whichever end it starts from,
# so the plan's precomputed sums must give the very same decisions.
whole_budgets = st.builds(
    StepBudget,
    weight=st.integers(min_value=1, max_value=100).map(float),
    min_ms=st.one_of(st.none(), st.integers(min_value=0, max_value=2000).map(float)),
    max_ms=st.one_of(st.none(), st.integers(min_value=2000, max_value=5000).map(float)),
    optional=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    remaining=st.integers(min_value=-100, max_value=100_000).map(float),
    steps=st.lists(whole_budgets, min_size=1, max_size=12),
    data=st.data(),
)
def test_plan_decides_as_decide_does(
    remaining: float, steps: list[StepBudget], data: st.DataObject
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(steps) - 1))
    assert Plan(steps).decide(index, remaining) == decide(remaining, steps[index:])


def test_plan_sums_once_for_a_long_chain() -> None:
    """The runner's plan for 2,000 steps: each decision reads its sums; none walks the rest."""
    steps = [StepBudget(1.0, optional=i % 3 == 0) for i in range(2000)]
    plan = Plan(steps)
    for index in (0, 1, 999, 1998, 1999):
        assert plan.decide(index, 60_000.0) == decide(60_000.0, steps[index:])
    # The last step gets all that is left; the first its 1/2000th.
    assert plan.decide(1999, 100.0) == Allot(100.0)
    assert plan.decide(1, 2000.0) == decide(2000.0, steps[1:])
