"""The ``wait`` step in the chain format: what loads, what is refused (with file:line), the schema."""

from __future__ import annotations

from typing import Any

import pytest

from chainrt.errors import SpecError
from chainrt.spec import chain_json_schema, parse_spec, spec_from_dict
from chainrt.spec._wait import payload_problem

HEAD = "name: approvals\nbudget: 5s\nsteps:\n"


def _chain(steps: str) -> str:
    return HEAD + steps


def test_a_wait_loads_and_round_trips_through_the_stored_spec() -> None:
    spec = parse_spec(
        _chain(
            "  - id: approve\n"
            "    wait:\n"
            "      signal: manager_ok\n"
            '      schema: {approved: bool, "note?": str}\n'
            "      timeout: 10m\n"
            "      on_timeout: continue\n"
        )
    )
    step = spec.steps[0]
    assert step.kind == "wait"
    assert step.wait is not None
    assert (step.wait.signal, step.wait.timeout, step.wait.on_timeout) == (
        "manager_ok",
        600_000.0,
        "continue",
    )
    stored = spec.model_dump(mode="json", by_alias=True)
    assert stored["steps"][0]["wait"]["timeout"] == "600000ms"
    assert spec_from_dict(stored) == spec


def test_a_chain_without_waits_keeps_its_stored_spec() -> None:
    spec = parse_spec(_chain("  - id: a\n    runnable: os:getcwd\n"))
    assert "wait" not in spec.model_dump(mode="json", by_alias=True)["steps"][0]


@pytest.mark.parametrize(
    ("wait", "message"),
    [
        ("{signal: 'bad name!'}", "signal name must match"),
        ("{signal: ok, timeout: 0s}", "timeout must be more than zero"),
        ("{signal: ok, timeout: soon}", "timeout must be a number with a unit"),
        ("{signal: ok, on_timeout: retry}", "on_timeout"),
        ("{signal: ok, schema: {a: text}}", "unknown type 'text'"),
        ("{signal: ok, schema: {a: str}, json_schema: {type: object}}", "not both"),
        ("{signal: ok, json_schema: {type: 12}}", "not a valid JSON Schema"),
        ("{signal: ok, colour: red}", "colour"),
        ("{}", "signal"),
    ],
)
def test_a_bad_wait_is_refused_with_its_line(wait: str, message: str) -> None:
    text = _chain(f"  - id: a\n    runnable: os:getcwd\n  - id: approve\n    wait: {wait}\n")
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(text, file="approvals.yaml")
    assert "approvals.yaml:7" in str(info.value)


def test_a_wait_with_keys_or_retries_is_refused() -> None:
    text = _chain("  - id: approve\n    wait: {signal: ok}\n    retry: {attempts: 2}\n")
    with pytest.raises(SpecError, match="do not apply to wait steps"):
        parse_spec(text)


@pytest.mark.parametrize(
    ("group", "where"),
    [
        ("parallel:\n      a: [{id: w, wait: {signal: ok}}]\n", "parallel branch"),
        ("map: '{{ input.items }}'\n    steps: [{id: w, wait: {signal: ok}}]\n", "map"),
    ],
)
def test_a_wait_inside_parallel_or_map_is_refused(group: str, where: str) -> None:
    text = HEAD.replace("steps:\n", "inputs: {items: list}\nsteps:\n") + f"  - id: g\n    {group}"
    with pytest.raises(SpecError, match=f"cannot be inside a {where}") as info:
        parse_spec(text, file="c.yaml")
    assert "c.yaml:" in str(info.value)


def test_a_wait_inside_a_switch_branch_loads() -> None:
    spec = parse_spec(
        HEAD.replace("steps:\n", "inputs: {kind: str}\nsteps:\n")
        + "  - id: route\n    switch: '{{ input.kind }}'\n"
        "    cases:\n      refund: [{id: approve, wait: {signal: ok}}]\n"
    )
    assert spec.steps[0].cases is not None


def test_the_chain_schema_describes_waits() -> None:
    schema: dict[str, Any] = chain_json_schema()
    wait = schema["$defs"]["WaitSpec"]
    assert {"signal", "schema", "json_schema", "timeout", "on_timeout"} <= set(wait["properties"])
    assert wait["required"] == ["signal"]


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"approved": True}, None),
        ({"approved": True, "note": "fine"}, None),
        ({"approved": "yes"}, "is not of type 'boolean'"),
        ({"note": "x"}, "'approved' is a required property"),
        ({"approved": True, "extra": 1}, "Additional properties"),
        ([1], "is not of type 'object'"),
    ],
)
def test_payloads_are_checked_against_the_fields(payload: Any, problem: str | None) -> None:
    spec = parse_spec(
        _chain('  - id: w\n    wait: {signal: ok, schema: {approved: bool, "note?": str}}\n')
    )
    assert spec.steps[0].wait is not None
    found = payload_problem(spec.steps[0].wait, payload)
    assert found is None if problem is None else (found is not None and problem in found)
