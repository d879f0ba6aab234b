"""Chain values that used to be accepted wrongly or refused unclearly (issue 12 findings 4, 10)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from chainrt._durations import parse_duration_ms
from chainrt.errors import BudgetError, SpecError, TemplateError
from chainrt.spec import compile_template, render_value, spec_from_dict
from chainrt.spec._filters import MAX_RENDERED_CHARS


def _chain(**changes: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"id": "x", "tool": "t.py:f"}
    step.update(changes.pop("step", {}))
    return {"name": "q", "budget": "8s", "steps": [step], **changes}


@pytest.mark.parametrize("budget", ["0.0000001ms", "0ms", "0.999ms", 0, 0.0000001])
def test_budget_under_one_millisecond_is_refused(budget: object) -> None:
    with pytest.raises(SpecError, match="budget must be at least 1ms"):
        spec_from_dict(_chain(budget=budget))


def test_one_millisecond_is_the_smallest_budget() -> None:
    assert spec_from_dict(_chain(budget="1ms")).budget == 1.0


@pytest.mark.parametrize("written", ["\u0663s", "1\u0660ms", "\uff13s", "\u09e9m"])
def test_non_ascii_digits_are_not_durations(written: str) -> None:
    with pytest.raises(BudgetError, match="a number with a unit"):
        parse_duration_ms(written)
    with pytest.raises(SpecError, match="budget"):
        spec_from_dict(_chain(budget=written))


def test_non_ascii_digits_are_not_rates() -> None:
    keys = [{"key": "k", "limit": 1, "rate": "\u0663/s"}]
    with pytest.raises(SpecError, match="rate must look like"):
        spec_from_dict(_chain(concurrency=keys))


def test_a_trailing_newline_is_not_a_duration() -> None:
    with pytest.raises(BudgetError):
        parse_duration_ms("8s\nx")


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        ("NaN", "weight must be a finite number greater than 0, got nan"),
        (float("nan"), "weight must be a finite number greater than 0, got nan"),
        ("inf", "weight must be a finite number greater than 0, got inf"),
        (True, "weight must be a number, got true"),
        (False, "weight must be a number, got false"),
        ("heavy", "weight must be a number, got 'heavy'"),
    ],
)
def test_weight_is_a_finite_positive_number(weight: object, message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_dict(_chain(step={"weight": weight}))
    assert message in str(info.value)
    assert "greater than 0" in message or "Input should" not in str(info.value)


def test_good_weights_still_work() -> None:
    assert spec_from_dict(_chain(step={"weight": 2})).steps[0].weight == 2.0
    assert spec_from_dict(_chain(step={"weight": "0.5"})).steps[0].weight == 0.5
    with pytest.raises(SpecError, match="greater than 0"):
        spec_from_dict(_chain(step={"weight": 0}))


# ------------------------------------------------------------------ rendered size cap


def test_sixteen_chained_tojson_stop_at_the_cap_quickly_and_small() -> None:
    template = compile_template("{{ input.text" + " | tojson" * 16 + " }}")
    scope = {"input": {"text": 'a "quoted" \\ text ' * 160}}  # ~3 KB
    tracemalloc.start()
    try:
        with pytest.raises(TemplateError, match=f"larger than {MAX_RENDERED_CHARS:,} characters"):
            template.render(scope)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # It once built a 375 MiB string (1 GB resident, 5.7 s). Now the largest intermediate is
    # bounded by a few times the cap.
    assert peak < 8 * MAX_RENDERED_CHARS, peak


def test_text_templates_are_capped_in_total() -> None:
    part = "x" * (MAX_RENDERED_CHARS // 3)
    template = compile_template("{{ a }}{{ a }}{{ a }}{{ a }}")
    with pytest.raises(TemplateError, match="larger than"):
        template.render({"a": part})
    assert len(compile_template("{{ a }}{{ a }}").render({"a": part})) == 2 * len(part)


def test_a_tojson_at_the_cap_is_fine_and_one_past_it_is_refused() -> None:
    fits = "x" * (MAX_RENDERED_CHARS - 2)  # plus two quotes: exactly the cap
    assert len(render_value("{{ v | tojson }}", {"v": fits})) == MAX_RENDERED_CHARS
    with pytest.raises(TemplateError, match="larger than"):
        render_value("{{ v | tojson }}", {"v": fits + "x"})
    with pytest.raises(TemplateError, match="larger than"):
        render_value("{{ v | tojson }}", {"v": '"' * (MAX_RENDERED_CHARS // 2)})  # escaping
