"""Fuzzing: whatever goes in, the loader raises only SpecError and templates only TemplateError.

Any other exception escaping fails the test (hypothesis prints the input). An error that is
raised must also be what a person can use: one line, naming the file (and the line or field
when there is one), with a message after the prefix and none of a library's internals.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrt._errors import SpecError, TemplateError
from chainrt.spec import ChainSpec, compile_template, parse_spec, render_value, spec_from_dict

DATA = Path(__file__).parent / "data" / "spec"
SAMPLE_TEXT = (DATA / "support_agent.yaml").read_text()

# No example database: the checkout is shared, and failures print their reproducing example.
FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# Keys of the format, so that generated structures reach deep into validation.
KEYS = st.sampled_from(
    [
        "name",
        "budget",
        "inputs",
        "steps",
        "id",
        "llm",
        "tool",
        "runnable",
        "model",
        "prompt",
        "messages",
        "role",
        "content",
        "args",
        "input",
        "output",
        "weight",
        "retry",
        "attempts",
        "backoff",
        "concurrency",
        "key",
        "limit",
        "rate",
        "fallbacks",
        "json",
        "min",
        "max",
        "optional",
        "static_answer",
        "x",
        "__class__",
    ]
) | st.text(max_size=8)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**6), max_value=10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(
        [
            "8s",
            "100ms",
            "-1s",
            "primary",
            "t.py:f",
            "{{ input.q }}",
            "{{ steps.a.output }}",
            "{{",
            "}}",
            "{{ x | nope }}",
            "str",
            "user",
            "a",
        ]
    )
    | st.text(max_size=12)
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)


_MAX_MESSAGE = 2000
"""Long enough for an echoed value (values are cut short), short enough to read."""
_LEAKS = ("Traceback", "errors.pydantic.dev", "For further information", "\n")


def _readable(message: str) -> None:
    assert message.strip(), "empty error message"
    assert len(message) <= _MAX_MESSAGE, f"{len(message)}-character message"
    for leak in _LEAKS:
        assert leak not in message, f"{leak!r} in {message!r}"


def _spec_error(error: SpecError | None, file: str, *, field: bool = False) -> None:
    """``error`` (if any) reads ``file[:line]: [field: ]problem`` on one line."""
    if error is None:
        return
    text = str(error)
    _readable(text)
    assert error.file == file
    match = re.match(rf"{re.escape(file)}(?::(\d+))?: (.+)$", text)
    assert match is not None, text
    assert (match.group(1) is None) == (error.line is None), text
    assert error.line is None or error.line >= 1
    if error.field is not None:
        assert match.group(2).startswith(f"{error.field}: "), text
    assert match.group(2).removeprefix(f"{error.field}: ").strip(), text
    if field:
        assert error.field, f"no field named: {text}"


def _template_error(error: TemplateError) -> None:
    _readable(str(error))


def _parse(source: str | bytes) -> None:
    error: SpecError | None = None
    try:
        spec = parse_spec(source, file="fuzz.yaml", source_dir=DATA, allowed_modules=["json"])
    except SpecError as exc:
        error = exc
    else:
        assert isinstance(spec, ChainSpec)
    _spec_error(error, "fuzz.yaml")


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text_gives_only_spec_errors(text: str) -> None:
    _parse(text)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_only_spec_errors(raw: bytes) -> None:
    _parse(raw)


@FUZZ
@given(st.text(alphabet="ab:-[]{}&*!|>'\"# \n\t?%@`,.0123456789", max_size=200))
def test_yaml_punctuation_soup_gives_only_spec_errors(text: str) -> None:
    _parse(text)


@FUZZ
@given(st.dictionaries(KEYS, JSONISH, max_size=8))
def test_arbitrary_structures_give_only_spec_errors(data: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return
    _parse(text)
    error: SpecError | None = None
    try:
        spec_from_dict(data, file="<fuzz>")
    except SpecError as exc:
        error = exc
    _spec_error(error, "<fuzz>")


@FUZZ
@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=4),
    st.text(max_size=6),
)
def test_mutated_sample_gives_only_spec_errors(cuts: list[int], insert: str) -> None:
    text = SAMPLE_TEXT
    for cut in cuts:
        at = cut % (len(text) + 1)
        text = text[:at] + insert + text[at + len(insert) :]
    _parse(text)


def _mutate_valid(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    steps = [dict(step) for step in data["steps"]]
    steps[0][key] = value
    return {**data, "steps": steps}


@FUZZ
@given(KEYS, JSONISH)
def test_one_bad_field_in_a_valid_spec_gives_only_spec_errors(key: str, value: Any) -> None:
    data = yaml.safe_load(SAMPLE_TEXT)
    error: SpecError | None = None
    try:
        spec = spec_from_dict(_mutate_valid(data, key, value), file="<fuzz>")
    except SpecError as exc:
        error = exc
    else:
        # Whatever was accepted must survive the store's round trip.
        assert spec_from_dict(spec.model_dump(mode="json", by_alias=True)) == spec
    _spec_error(error, "<fuzz>", field=True)  # the one bad field is named


# ---------------------------------------------------------------------------------- templates

TEMPLATE_PIECES = st.sampled_from(
    [
        "{{",
        "}}",
        " ",
        "input",
        "steps",
        "run_id",
        "step",
        ".",
        "[",
        "]",
        "0",
        "-1",
        "'k'",
        '"q"',
        "|",
        "tojson",
        "default",
        "(",
        ")",
        "lower",
        "length",
        "trim",
        "string",
        "upper",
        "true",
        "null",
        "1.5e3",
        "\\",
        "__class__",
        "x",
        "output",
        "text ",
    ]
)
SCOPE_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=15,
)


def _render(text: str, scope: dict[str, Any]) -> None:
    try:
        template = compile_template(text)
    except TemplateError as exc:
        _template_error(exc)
        return
    try:
        template.render(scope)
        render_value({"a": [text]}, scope)
    except TemplateError as exc:
        _template_error(exc)


@FUZZ
@given(st.text(max_size=200), st.dictionaries(KEYS, SCOPE_VALUES, max_size=4))
def test_arbitrary_template_text_gives_only_template_errors(
    text: str, scope: dict[str, Any]
) -> None:
    _render(text, scope)


@FUZZ
@given(
    st.lists(TEMPLATE_PIECES, max_size=30).map("".join),
    SCOPE_VALUES,
    SCOPE_VALUES,
)
def test_template_shaped_text_gives_only_template_errors(
    text: str, input_value: Any, output: Any
) -> None:
    scope = {
        "input": input_value,
        "steps": {"x": {"output": output}},
        "run_id": "r",
        "step": {"id": "x", "model": None, "weight": 1.0},
    }
    _render(text, scope)
