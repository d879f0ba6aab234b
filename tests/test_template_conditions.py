"""Conditions inside {{ }}: comparisons, in, and/or/not, parentheses — JSON semantics, sandboxed."""

from __future__ import annotations

from typing import Any

import pytest

from chainrt import TemplateError
from chainrt.spec import compile_template
from chainrt.spec._expr import json_equal, truthy

SCOPE: dict[str, Any] = {
    "input": {"n": 3, "s": "refund", "l": [1, 2], "d": {"k": 1}, "t": True, "z": None, "f": 0.5},
    "steps": {"a": {"output": {"intent": "refund", "order_id": None}}},
    "models": {"primary": {"p50_ms": 120.0, "p99_ms": None, "healthy": True}},
}

TABLE = [
    ("{{ input.n == 3 }}", True),
    ("{{ input.n != 3 }}", False),
    ("{{ input.n < 4 and input.n <= 3 and input.n > 2 and input.n >= 3 }}", True),
    ("{{ input.f < 1 }}", True),
    ('{{ input.s == "refund" }}', True),
    ('{{ input.s < "z" }}', True),
    ("{{ input.t == 1 }}", False),  # JSON: true is not 1
    ("{{ input.n in input.l }}", False),
    ("{{ 2 in input.l }}", True),
    ("{{ 2 not in input.l }}", False),
    ('{{ "k" in input.d }}', True),
    ('{{ "fun" in input.s }}', True),
    ('{{ input.s in ["refund", "return"] }}', True),
    ("{{ not input.z }}", True),
    ("{{ not not input.l }}", True),
    ("{{ input.z or input.n }}", True),
    ("{{ input.z and input.n }}", False),
    ("{{ (input.n > 5 or input.t) and not (input.s == 'x') }}", True),
    ("{{ input.l | length >= 2 }}", True),
    ("{{ input.missing | default(7) == 7 }}", True),
    ("{{ steps.a.output.intent == 'refund' and not steps.a.output.order_id }}", True),
    ("{{ models.primary.p50_ms < 200 and models.primary.healthy }}", True),
    ("{{ models.primary.p99_ms > 2000 }}", False),  # no figure yet: an order is false
    ("{{ input.z == null }}", True),
    ("{{ input.l == [1, 2] }}", True),
    ("n={{ input.n > 1 }}", "n=true"),
]


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[t for t, _ in TABLE])
def test_conditions_evaluate_as_json_would(text: str, expected: Any) -> None:
    assert compile_template(text).render(SCOPE) == expected


BAD = [
    ("{{ input.s < 3 }}", "cannot compare a string < a number"),
    ("{{ input.n in 3 }}", "'in' needs a list, a string or an object"),
    ("{{ 1 in input.s }}", "'in' a string needs a string"),
    ("{{ input.nope == 1 }}", "has no key 'nope'"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD, ids=[t for t, _ in BAD])
def test_a_condition_that_cannot_be_evaluated_says_why(text: str, fragment: str) -> None:
    with pytest.raises(TemplateError, match=fragment):
        compile_template(text).render(SCOPE)


MALFORMED = [
    ("{{ input.n == }}", "expected a name or a literal"),
    ("{{ (input.n }}", "'(' is never closed"),
    ("{{ input.n not input.l }}", "expected 'in' after 'not'"),
    ("{{ input.n input.l }}", "unexpected 'i'"),
    ("{{ input.__class__() }}", "unexpected '('"),
    ("{{ " + "(" * 40 + "1" + ")" * 40 + " }}", "nested deeper than 32"),
    ("{{ [1, }}", "expected a name or a literal"),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED, ids=[t[:30] for t, _ in MALFORMED])
def test_malformed_conditions_are_refused_when_parsed(text: str, fragment: str) -> None:
    with pytest.raises(TemplateError, match=fragment.replace("(", r"\(")):
        compile_template(text)


def test_no_attribute_of_a_value_is_reachable() -> None:
    # A name resolves through dict keys only: __class__ is simply a key that is not there.
    with pytest.raises(TemplateError, match="has no key '__class__'"):
        compile_template("{{ input.s.__class__ == 1 }}").render(SCOPE)


def test_references_of_a_condition_are_every_path_it_reads() -> None:
    template = compile_template("{{ input.n > 1 and (steps.a.output or models.m.healthy) }}")
    assert template.references == [
        ("input", "n"),
        ("steps", "a", "output"),
        ("models", "m", "healthy"),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        (False, False),
        (0, False),
        (0.0, False),
        ("", False),
        ([], False),
        ({}, False),
        ("0", True),
        ([0], True),
        ({"a": None}, True),
        (-1, True),
    ],
)
def test_truthiness_is_jsons(value: Any, expected: bool) -> None:
    assert truthy(value) is expected


def test_equality_tells_booleans_from_numbers_at_any_depth() -> None:
    assert not json_equal(True, 1)
    assert not json_equal([True], [1])
    assert json_equal([1, [2.0]], [1, [2]])
