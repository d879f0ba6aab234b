"""``llm.hedge`` (docs/dispatch.md): the step field, its validation, and the pure hedge decision.

The hedged attempts themselves run against real workers in ``test_dispatch_hedge.py``.
"""

from __future__ import annotations

import pytest

from chainrt._errors import SpecError
from chainrt._run._llm import llm_call
from chainrt.dispatch._hedge import hedge_wait
from chainrt.dispatch._policy import MIN_ATTEMPT_S
from chainrt.spec import parse_spec, spec_from_dict


def chain(hedge: str) -> str:
    return (
        "name: h\n"
        "budget: 8s\n"
        "inputs: {q: str}\n"
        "steps:\n"
        "  - id: a\n"
        "    llm:\n"
        "      model: primary\n"
        "      prompt: '{{ input.q }}'\n"
        f"      hedge: {hedge}\n"
    )


@pytest.mark.parametrize(
    ("written", "after", "quantile", "delay_ms"),
    [
        ("{after: p95}", "p95", 0.95, None),
        ("{after: p50}", "p50", 0.5, None),
        ("{after: P90}", "p90", 0.9, None),
        ("{after: p99}", "p99", 0.99, None),
        ("{}", "p95", 0.95, None),
        ("{after: 250ms}", "250ms", None, 250.0),
        ("{after: 1.5s}", "1500ms", None, 1500.0),
        ("{after: 0.2}", "200ms", None, 200.0),
    ],
)
def test_hedge_after_accepts_percentiles_and_durations(
    written: str, after: str, quantile: float | None, delay_ms: float | None
) -> None:
    spec = parse_spec(chain(written))
    llm = spec.steps[0].llm
    assert llm is not None
    assert llm.hedge is not None
    assert (llm.hedge.after, llm.hedge.quantile, llm.hedge.delay_ms) == (after, quantile, delay_ms)
    call = llm_call(spec.steps[0], {"input": {"q": "hi"}}, "r1")
    assert (call.hedge_quantile, call.hedge_after_ms) == (quantile, delay_ms)
    # The normalised spec (what resume reads) loads back to the same field.
    again = spec_from_dict(spec.model_dump(mode="json", by_alias=True))
    assert again.steps[0].llm is not None
    assert again.steps[0].llm.hedge == llm.hedge


def test_hedging_is_off_without_the_field() -> None:
    spec = parse_spec(chain("null"))
    assert spec.steps[0].llm is not None
    assert spec.steps[0].llm.hedge is None
    call = llm_call(spec.steps[0], {"input": {"q": "hi"}}, "r1")
    assert (call.hedge_quantile, call.hedge_after_ms) == (None, None)


@pytest.mark.parametrize(
    ("written", "field", "fragment"),
    [
        ("{after: p97}", "steps[0].llm.hedge.after", "after must be p50, p90, p95, p99 or a"),
        ("{after: soon}", "steps[0].llm.hedge.after", "got 'soon'"),
        ("{after: 0ms}", "steps[0].llm.hedge.after", "longer than zero"),
        ("{after: 2h}", "steps[0].llm.hedge.after", "at most 1h"),
        ("{after: -1}", "steps[0].llm.hedge.after", "after must be"),
        ("{after: true}", "steps[0].llm.hedge.after", "after must be"),
        ("{before: p95}", "steps[0].llm.hedge.before", "unknown key 'before'"),
        ("p95", "steps[0].llm.hedge", ""),
    ],
)
def test_a_bad_hedge_is_a_clear_error_naming_the_field(
    written: str, field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(chain(written), file="chain.yaml")
    assert info.value.field == field
    assert info.value.line == 9
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("after_s", "waited_s", "left_s", "need_s", "expected"),
    [
        (None, 0.0, 10.0, 0.1, None),  # no figures for the endpoint: no hedge
        (0.2, 0.0, 10.0, 0.1, 0.2),  # wait the rest of the threshold
        (0.2, 0.05, 10.0, 0.1, 0.15),
        (0.2, 0.3, 10.0, 0.1, 0.0),  # already past it: at once
        (0.2, 0.0, 0.31, 0.1, 0.2),  # 0.2 + 0.1 fits 0.31
        (0.2, 0.0, 0.29, 0.1, None),  # the hedge's usual answer would not fit
        (0.2, 0.0, 0.2 + MIN_ATTEMPT_S, None, 0.2),  # unknown need: the least attempt time
        (0.2, 0.0, 0.2, None, None),
        (-1.0, 0.0, 10.0, 0.1, None),
    ],
)
def test_hedge_wait(
    after_s: float | None,
    waited_s: float,
    left_s: float,
    need_s: float | None,
    expected: float | None,
) -> None:
    got = hedge_wait(after_s=after_s, waited_s=waited_s, left_s=left_s, need_s=need_s)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)
