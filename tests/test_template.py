"""The ``{{ ... }}`` template language: types, filters, errors, and the sandbox."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from chainrt._errors import TemplateError
from chainrt.spec import Template, compile_template, iter_templates, render_value
from chainrt.spec._template import MAX_TEMPLATE_CHARS

SCOPE: dict[str, Any] = {
    "input": {"question": "Where is order 1042?", "user_id": "u1", "n": 3, "tags": ["a", "b"]},
    "steps": {
        "intent": {"output": {"order_id": "1042", "score": 0.5, "ok": True, "none": None}},
        "list": {"output": [{"id": 1}, {"id": 2}, {"odd key": "x"}]},
    },
    "run_id": "r-1",
    "step": {"id": "summary", "model": "primary", "weight": 0.3},
}


def render(text: str, scope: dict[str, Any] | None = None) -> Any:
    return compile_template(text).render(SCOPE if scope is None else scope)


# ------------------------------------------------------------------------------ native types


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{{ input.n }}", 3),
        ("{{ steps.intent.output.score }}", 0.5),
        ("{{ steps.intent.output.ok }}", True),
        ("{{ steps.intent.output.none }}", None),
        ("{{ steps.intent.output }}", SCOPE["steps"]["intent"]["output"]),
        ("{{ input.tags }}", ["a", "b"]),
        ("{{ input.question }}", "Where is order 1042?"),
        ("  {{input.n}}\n", 3),
        ("{{ 7 }}", 7),
        ("{{ -1.5e2 }}", -150.0),
        ("{{ null }}", None),
        ("{{ 'lit' }}", "lit"),
    ],
)
def test_a_single_expression_keeps_its_type(text: str, expected: Any) -> None:
    value = render(text)
    assert value == expected
    assert type(value) is type(expected)


def test_native_value_is_the_scope_object_itself_not_a_copy_of_its_text() -> None:
    assert render("{{ steps.list.output }}") is SCOPE["steps"]["list"]["output"]


# ---------------------------------------------------------------------------- interpolation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Q: {{ input.question }}", "Q: Where is order 1042?"),
        ("n={{ input.n }}", "n=3"),
        (
            "ok={{ steps.intent.output.ok }} none={{ steps.intent.output.none }}",
            "ok=true none=null",
        ),
        ("o={{ steps.intent.output }}", 'o={"order_id":"1042","score":0.5,"ok":true,"none":null}'),
        ("t={{ input.tags }}.", 't=["a","b"].'),
        ("{{ input.user_id }}:{{ run_id }}", "u1:r-1"),
        ("no holes at all", "no holes at all"),
        ("}} and { alone", "}} and { alone"),
        ("{{ '{{' }} literal {{ \"}}\" }}", "{{ literal }}"),
    ],
)
def test_any_other_string_renders_to_text_with_json_for_non_strings(
    text: str, expected: str
) -> None:
    assert render(text) == expected


def test_unicode_is_inserted_as_is_not_escaped() -> None:
    assert render("é={{ input.x }}", {"input": {"x": {"k": "ünï"}}}) == 'é={"k":"ünï"}'


def test_indexes_and_quoted_keys() -> None:
    assert render("{{ steps.list.output[1].id }}") == 2
    assert render("{{ steps.list.output[-1]['odd key'] }}") == "x"
    assert render('{{ steps["intent"].output["order_id"] }}') == "1042"
    assert render("{{ input.tags[ 0 ] }}") == "a"


# ---------------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{{ input.question | tojson }}", '"Where is order 1042?"'),
        (
            "{{ steps.intent.output | tojson }}",
            '{"order_id":"1042","score":0.5,"ok":true,"none":null}',
        ),
        ("{{ input.missing | default('none') }}", "none"),
        ("{{ steps.intent.output.none | default(5) }}", 5),
        ("{{ steps.nope.output.x | default(true) }}", True),
        ("{{ input.missing | default(null) }}", None),
        ("{{ input.n | default(9) }}", 3),
        ("{{ input.question | lower }}", "where is order 1042?"),
        ("{{ input.question | upper }}", "WHERE IS ORDER 1042?"),
        ("{{ x | trim }}", "padded"),
        ("{{ input.tags | length }}", 2),
        ("{{ input.question | length }}", 20),
        ("{{ steps.intent.output | length }}", 4),
        ("{{ input.n | string }}", "3"),
        ("{{ input.question|trim|upper|length }}", 20),
        ("{{ input.missing | upper | default('d') }}", "d"),
        ("[{{ input.missing | default('') }}]", "[]"),
        ('{{ input.missing | default("a\\"b\\n\\u00e9") }}', 'a"b\né'),
    ],
)
def test_filters(text: str, expected: Any) -> None:
    scope = {**SCOPE, "x": "  padded \n"}
    assert render(text, scope) == expected


def test_default_applies_to_missing_and_null_only_not_to_falsy_values() -> None:
    scope = {"input": {"zero": 0, "empty": "", "false": False}}
    assert render("{{ input.zero | default(1) }}", scope) == 0
    assert render("{{ input.empty | default('x') }}", scope) == ""
    assert render("{{ input.false | default(true) }}", scope) is False


def test_length_of_a_number_is_an_error() -> None:
    with pytest.raises(TemplateError, match="length needs a string, list or object"):
        render("{{ input.n | length }}")


def test_values_that_are_not_json_cannot_be_rendered_as_text() -> None:
    with pytest.raises(TemplateError, match="cannot render"):
        render("x={{ input.v }}", {"input": {"v": float("nan")}})
    with pytest.raises(TemplateError, match="cannot render"):
        render("x={{ input.v }}", {"input": {"v": {1, 2}}})


# ------------------------------------------------------------------------------ missing names


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("{{ input.nope }}", ["input has no key 'nope'", "question, user_id, n, tags"]),
        ("{{ nothing }}", ["name 'nothing' is not defined", "input, run_id, step, steps"]),
        ("{{ steps.intent.output.order_id.x }}", ["steps.intent.output.order_id is a string"]),
        ("{{ steps.list.output[7] }}", ["index 7 is out of range", "steps.list.output has 3"]),
        ("{{ input[0] }}", ["input is an object, so it has no index [0]"]),
        ("{{ steps.intent.output.none.x }}", ["steps.intent.output.none is null"]),
        ("a {{ steps.ghost.output }} b", ["{{ steps.ghost.output }}", "steps has no key 'ghost'"]),
    ],
)
def test_a_missing_name_says_which_path_and_what_exists(text: str, fragments: list[str]) -> None:
    with pytest.raises(TemplateError) as info:
        render(text)
    for fragment in fragments:
        assert fragment in str(info.value)


# ------------------------------------------------------------------------------------ sandbox


class _Secretive:
    secret = "attribute value"

    def __getitem__(self, key: str) -> str:
        return "item value"


@pytest.mark.parametrize(
    "text",
    [
        "{{ input.__class__ }}",
        "{{ input.question.__class__ }}",
        "{{ input['__class__'] }}",
        "{{ input.__dict__ }}",
        "{{ input.keys }}",
        "{{ input.tags.__len__ }}",
        "{{ obj.secret }}",
        "{{ obj.x }}",
        "{{ steps.__init__ }}",
    ],
)
def test_no_attribute_of_any_python_object_is_reachable(text: str) -> None:
    scope = {**SCOPE, "obj": _Secretive()}
    with pytest.raises(TemplateError) as info:
        render(text, scope)
    assert "attribute value" not in str(info.value)
    assert "item value" not in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "{{ __import__('os').system('true') }}",
        "{{ input.question() }}",
        "{{ input.n + 1 }}",
        "{{ lambda: 1 }}",
        "{{ [].__class__ }}",
        "{{ input.question | attr('x') }}",
        "{{ input.question | default(input.n) }}",
        "{{ input.question; run_id }}",
    ],
)
def test_anything_but_the_grammar_is_a_syntax_error(text: str) -> None:
    with pytest.raises(TemplateError, match="bad template"):
        compile_template(text)


def test_other_template_languages_are_plain_text() -> None:
    assert (
        render("{% import os %}{# c #}${run_id}{{ run_id }}")
        == "{% import os %}{# c #}${run_id}r-1"
    )


def test_rendered_values_are_never_rendered_again() -> None:
    scope = {"input": {"q": "{{ run_id }}", "evil": "{{ input.q }}"}, "run_id": "secret"}
    assert render("Q: {{ input.q }} {{ input.evil }}", scope) == "Q: {{ run_id }} {{ input.q }}"
    assert render_value({"a": "{{ input.q }}"}, scope) == {"a": "{{ run_id }}"}


def test_a_defaultdict_in_the_scope_does_not_grow_keys() -> None:
    data: collections.defaultdict[str, int] = collections.defaultdict(int)
    with pytest.raises(TemplateError):
        render("{{ d.x }}", {"d": data})
    assert dict(data) == {}


# ------------------------------------------------------------------------------- syntax errors


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("Q: {{ input.q", "'{{' is never closed at column 4"),
        ("{{ input.q | shout }}", "unknown filter 'shout'"),
        ("{{ input.q | default }}", "default needs a value"),
        ("{{ }}", "expected a name or a literal, found '}' at column 4"),
        ("{{ input. }}", "expected a name at column 10"),
        ("{{ input[1.5] }}", "an index must be an integer or a quoted key"),
        ("{{ input[true] }}", "an index must be an integer or a quoted key"),
        ("{{ input['x }}", "unterminated string"),
        ("{{ 'a\\q' }}", "bad escape"),
        ("line1\nline2 {{ a b }}", "unexpected 'b' at line 2, column 12"),
        ("{{ 1.2.3 }}", "bad number"),
        ("{{ input.q | default(x) }}", "expected a literal, found name 'x'"),
        ("{{ 1" + "0" * 5000 + " }}", "a number longer than 64 characters"),
        ("{{ 1e999 }}", "is not finite"),
        ("{{ 12abc }}", "bad number '12a'"),
    ],
)
def test_bad_syntax_names_the_problem_and_position(text: str, fragment: str) -> None:
    with pytest.raises(TemplateError) as info:
        compile_template(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_pathological_templates_fail_fast_with_bounded_work() -> None:
    with pytest.raises(TemplateError, match="longer than"):
        compile_template("x" * (MAX_TEMPLATE_CHARS + 1))
    with pytest.raises(TemplateError, match="path longer than"):
        compile_template("{{ " + ".".join(["a"] * 100) + " }}")
    with pytest.raises(TemplateError, match="more than 16 filters"):
        compile_template("{{ a" + " | trim" * 17 + " }}")
    with pytest.raises(TemplateError):
        compile_template("{{ a" + "[" * 100_000 + " }}")
    # Many holes are fine and linear: 20 000 expressions parse and render.
    many = compile_template("{{ run_id }}," * 20_000)
    assert many.render({"run_id": "r"}) == "r," * 20_000


def test_deep_data_cannot_crash_rendering() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TemplateError, match="cannot render"):
        render("x={{ v }}", {"v": deep})


# ---------------------------------------------------------------------------------- the API


def test_compile_is_cached_and_the_template_knows_its_source_and_references() -> None:
    text = "{{ input.q }} {{ steps.a.output[0]['k'] | default(1) }} {{ 'lit' }} {{ run_id }}"
    template = compile_template(text)
    assert compile_template(text) is template
    assert isinstance(template, Template)
    assert template.source == text
    assert template.references == [
        ("input", "q"),
        ("steps", "a", "output", 0, "k"),
        ("run_id",),
    ]
    assert not template.is_native
    assert compile_template(" {{ run_id }} ").is_native


def test_compile_rejects_a_non_string() -> None:
    with pytest.raises(TemplateError, match="must be a string"):
        compile_template(42)  # type: ignore[arg-type]


def test_render_value_walks_containers_and_leaves_plain_strings_alone() -> None:
    plain = "no template here"
    value = {
        "{{ keys are not rendered }}": "{{ input.n }}",
        "list": ["{{ run_id }}-x", 5, None, plain, {"deep": "{{ input.tags }}"}],
        "tuple": ("{{ input.user_id }}",),
    }
    rendered = render_value(value, SCOPE)
    assert rendered == {
        "{{ keys are not rendered }}": 3,
        "list": ["r-1-x", 5, None, plain, {"deep": ["a", "b"]}],
        "tuple": ["u1"],
    }
    assert rendered["list"][3] is plain
    assert render_value(plain, SCOPE) is plain
    assert render_value(12, SCOPE) == 12


def test_iter_templates_yields_sub_paths() -> None:
    value = {
        "a": [{"b": "{{ input.q }}"}, "plain"],
        "c": "x {{ run_id }}",
        "d": 1,
        "odd key": "{{ x }}",
    }
    found = [(path, template.source) for path, template in iter_templates(value)]
    assert found == [
        ("a[0].b", "{{ input.q }}"),
        ("c", "x {{ run_id }}"),
        ('["odd key"]', "{{ x }}"),
    ]
    assert [path for path, _ in iter_templates("{{ run_id }}")] == [""]
    assert list(iter_templates("plain")) == []


def test_iter_templates_names_the_sub_path_of_a_bad_template() -> None:
    with pytest.raises(TemplateError, match=r"^a\[1\]: bad template"):
        list(iter_templates({"a": ["{{ ok }}", "{{ bad | nope }}"]}))
