"""Loading chain files: valid chains, and one clear ``file:line: field: problem`` for bad ones."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from chainrt._errors import SpecError
from chainrt.spec import (
    ChainSpec,
    LoadedSpec,
    chain_json_schema,
    load_spec,
    parse_spec,
    spec_from_dict,
    validate_paths,
)

DATA = Path(__file__).parent / "data" / "spec"
SAMPLE = DATA / "support_agent.yaml"

BASE = """\
name: t
budget: 8s
inputs: {q: str}
steps:
  - id: a
    llm: {model: m, prompt: "{{ input.q }}"}
  - id: b
    tool: tools/orders.py:lookup_order
"""
# Line numbers in BASE: name 1, budget 2, inputs 3, steps 4, a 5, llm 6, b 7, tool 8.


@pytest.fixture
def chain_dir(tmp_path: Path) -> Path:
    """A directory with the test tools next to where each chain file is written."""
    shutil.copytree(DATA / "tools", tmp_path / "tools")
    return tmp_path


def load_text(chain_dir: Path, text: str | bytes) -> LoadedSpec:
    path = chain_dir / "chain.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return load_spec(path, allowed_modules=["json"])


# ------------------------------------------------------------------------------------ valid


def test_the_sample_chain_loads() -> None:
    loaded = load_spec(SAMPLE, allowed_modules=[])
    spec = loaded.spec
    assert loaded.path == SAMPLE.resolve()
    assert loaded.source_dir == DATA.resolve()
    assert spec.name == "support_agent"
    assert spec.budget == 8000.0
    assert list(spec.inputs) == ["user_id", "session_id", "question"]
    assert [s.id for s in spec.steps] == ["intent", "db_query", "summary", "memory_update"]
    intent = spec.steps[0]
    assert intent.llm is not None
    assert intent.llm.json_output is True
    assert intent.retry.attempts == 2
    assert intent.retry.backoff == 100.0
    assert intent.concurrency[0].key == "model:{{ step.model }}"
    assert spec.steps[2].min == 200.0
    assert spec.steps[2].max == 3000.0
    assert spec.steps[3].optional is True
    assert spec.output == "{{ steps.summary.output }}"


def test_load_spec_accepts_str_paths_and_reads_the_allow_list_from_settings(
    monkeypatch: pytest.MonkeyPatch, chain_dir: Path
) -> None:
    (chain_dir / "chain.yaml").write_text(BASE.replace("tools/orders.py", "json"))
    monkeypatch.setenv("CHAINRT_ALLOWED_MODULES", "yaml, json")
    assert load_spec(os.fspath(chain_dir / "chain.yaml")).spec.steps[1].tool == "json:lookup_order"
    monkeypatch.setenv("CHAINRT_ALLOWED_MODULES", "yaml")
    with pytest.raises(SpecError, match="module 'json' is not allowed"):
        load_spec(os.fspath(chain_dir / "chain.yaml"))


@pytest.mark.parametrize(
    "extra",
    [
        "output: '{{ steps.b.output }} {{ input.q }} {{ run_id }}'\n",
        "concurrency: [{key: 'u:{{ input.q }}:{{ run_id }}', limit: 2, rate: 5/s}]\n",
        "output: {a: '{{ steps.a.output }}', list: ['{{ steps.b.output.x | default(1) }}']}\n",
    ],
)
def test_templates_that_read_what_exists_are_accepted(chain_dir: Path, extra: str) -> None:
    assert load_text(chain_dir, BASE + extra).spec.name == "t"


def test_step_fields_may_use_step_and_earlier_steps(chain_dir: Path) -> None:
    text = BASE + (
        "    args: {x: '{{ steps.a.output }}', who: '{{ step.id }}/{{ step.weight }}'}\n"
        "    concurrency: [{key: 'model:{{ step.model }}:{{ input.q }}'}]\n"
        "  - id: c\n"
        "    llm:\n"
        "      model: m\n"
        "      messages: [{role: user, content: '{{ steps.b.output | tojson }}'}]\n"
        "    static_answer: 'sorry {{ run_id }} {{ steps.a.output }}'\n"
        "  - id: d\n"
        "    runnable: tools/orders.py:remember\n"
        "    input: {q: '{{ input.q }}', prev: ['{{ steps.c.output }}']}\n"
    )
    spec = load_text(chain_dir, text).spec
    assert [s.kind for s in spec.steps] == ["llm", "tool", "llm", "runnable"]


def test_parse_spec_reads_text_and_checks_tools_only_with_a_source_dir() -> None:
    spec = parse_spec(BASE.replace("tools/orders.py", "nowhere.py"))
    assert isinstance(spec, ChainSpec)
    with pytest.raises(SpecError, match=re.escape("no file 'nowhere.py'")):
        parse_spec(BASE.replace("tools/orders.py", "nowhere.py"), source_dir=DATA)


# ------------------------------------------------------------------------------ round trip


def test_the_normalised_spec_round_trips_exactly() -> None:
    spec = load_spec(SAMPLE, allowed_modules=[]).spec
    dumped = spec.model_dump(mode="json", by_alias=True)
    assert dumped["budget"] == "8000ms"
    assert dumped["steps"][0]["llm"]["json"] is True
    assert "json_output" not in dumped["steps"][0]["llm"]
    text = json.dumps(dumped)  # what a store keeps
    again = spec_from_dict(json.loads(text), file="<stored>")
    assert again == spec
    assert again.model_dump(mode="json", by_alias=True) == dumped


@pytest.mark.parametrize(
    ("written", "ms"),
    [
        ("1234.5678s", 1234567.8),
        ("0.5ms", 0.5),
        ("0.00000001s", 0.00001),
        ("2m", 120000.0),
        ("1h", 3_600_000.0),
        (3, 3000.0),
    ],
)
def test_durations_round_trip_without_losing_precision(written: object, ms: float) -> None:
    data: dict[str, Any] = {
        "name": "d",
        "budget": written if ms >= 1 else "10s",  # a budget under 1ms is refused (finding 10)
        "steps": [{"id": "x", "tool": "t.py:f", "min": written, "retry": {"backoff": written}}],
    }
    spec = spec_from_dict(data)
    assert spec.steps[0].min == pytest.approx(ms)
    assert spec.budget == pytest.approx(ms if ms >= 1 else 10_000)
    dumped = spec.model_dump(mode="json", by_alias=True)
    again = spec_from_dict(dumped)
    assert again == spec
    assert again.budget == spec.budget
    assert again.steps[0].min == spec.steps[0].min
    assert again.steps[0].retry.backoff == spec.steps[0].retry.backoff


def test_spec_from_dict_accepts_the_python_field_name_too() -> None:
    data = {
        "name": "j",
        "budget": "1s",
        "steps": [{"id": "x", "llm": {"model": "m", "prompt": "p", "json_output": True}}],
    }
    llm = spec_from_dict(data).steps[0].llm
    assert llm is not None
    assert llm.json_output is True


def test_spec_from_dict_reports_errors_with_the_given_name_and_no_line() -> None:
    with pytest.raises(SpecError) as info:
        spec_from_dict({"name": "x", "budget": "1s", "steps": []}, file="<stored spec of run r1>")
    assert str(info.value).startswith("<stored spec of run r1>: steps: ")
    assert info.value.line is None
    with pytest.raises(SpecError, match="must be a mapping"):
        spec_from_dict([1, 2])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- invalid files

# (name, yaml, line, field or None, fragment of the message)
INVALID: list[tuple[str, str, int | None, str | None, str]] = [
    (
        "unknown key",
        BASE + "    argz: {}\n",
        9,
        "steps[1].argz",
        "unknown key 'argz' (did you mean 'args'?); allowed: id, description, weight,",
    ),
    (
        "unknown top-level key",
        BASE + "outputs: x\n",
        9,
        "outputs",
        "unknown key 'outputs' (did you mean 'output'?); allowed: name, description, budget,",
    ),
    (
        "bad duration",
        BASE.replace("8s", "8 parsecs"),
        2,
        "budget",
        "a unit ms|s|m|h such as '1500ms' or '8s', got '8 parsecs'",
    ),
    ("negative duration", BASE.replace("8s", "-1"), 2, "budget", "finite duration >= 0"),
    (
        "bad retry duration",
        BASE + "    retry: {attempts: 2, backoff: soon}\n",
        9,
        "steps[1].retry.backoff",
        "got 'soon'",
    ),
    (
        "duplicate step id",
        BASE.replace("id: b", "id: a"),
        7,
        "steps[1].id",
        "duplicate step id 'a'",
    ),
    (
        "unknown step in output",
        BASE + "output: '{{ steps.zz.output }}'\n",
        9,
        "output",
        "{{ steps.zz.output }}: no step 'zz' (steps: a, b)",
    ),
    (
        "unknown step in a step",
        BASE + "    args: {x: '{{ steps.zz.output }}'}\n",
        9,
        "steps[1].args.x",
        "no step 'zz' before step 'b'",
    ),
    (
        "undeclared input",
        BASE.replace("{{ input.q }}", "{{ input.nope }}"),
        6,
        "steps[0].llm.prompt",
        "input 'nope' is not declared (inputs: q)",
    ),
    (
        "forward reference",
        BASE.replace("{{ input.q }}", "{{ steps.b.output }}"),
        6,
        "steps[0].llm.prompt",
        "no step 'b' before step 'a'",
    ),
    (
        "own output",
        BASE + "    args: {x: '{{ steps.b.output }}'}\n",
        9,
        "steps[1].args.x",
        "step 'b' cannot read its own output",
    ),
    (
        "steps without output",
        BASE + "output: '{{ steps.a.result }}'\n",
        9,
        "output",
        "a step exposes only its output: write steps.a.output",
    ),
    (
        "step in chain output",
        BASE + "output: '{{ step.id }}'\n",
        9,
        "output",
        "'step' exists only in the fields of a step",
    ),
    (
        "steps in a chain key",
        BASE + "concurrency: [{key: 'k:{{ steps.a.output }}'}]\n",
        9,
        "concurrency[0].key",
        "they may use only input and run_id",
    ),
    (
        "unknown root name",
        BASE.replace("{{ input.q }}", "{{ inputs.q }}"),
        6,
        "steps[0].llm.prompt",
        "unknown name 'inputs'; templates here can use input, steps, run_id, step",
    ),
    (
        "bad step field",
        BASE + "    args: {x: '{{ step.name }}'}\n",
        9,
        "steps[1].args.x",
        "step has only id, model, weight",
    ),
    (
        "template syntax",
        BASE.replace("{{ input.q }}", "{{ input.q | shout }}"),
        6,
        "steps[0].llm.prompt",
        "unknown filter 'shout'",
    ),
    (
        "template in a message",
        BASE.replace('prompt: "{{ input.q }}"', "messages: [{role: user, content: '{{ x }}'}]"),
        6,
        "steps[0].llm.messages[0].content",
        "unknown name 'x'",
    ),
    ("weight zero", BASE + "    weight: 0\n", 9, "steps[1].weight", "greater than 0 (got 0)"),
    ("weight negative", BASE + "    weight: -2\n", 9, "steps[1].weight", "greater than 0 (got -2)"),
    (
        "missing kind",
        BASE.replace("    tool: tools/orders.py:lookup_order\n", "    weight: 2\n"),
        7,
        "steps[1]",
        "a step needs exactly one of llm, agent, tool, runnable, switch, parallel, map, wait (found: none)",
    ),
    (
        "two kinds",
        BASE + "    runnable: tools/orders.py:remember\n",
        7,
        "steps[1]",
        "a step needs exactly one of llm, agent, tool, runnable, switch, parallel, map, wait (found: tool, runnable)",
    ),
    ("bad name", BASE.replace("name: t", "name: Bad Name"), 1, "name", "got 'Bad Name'"),
    ("missing budget", BASE.replace("budget: 8s\n", ""), 1, "budget", "required key is missing"),
    (
        "missing step id",
        BASE.replace("  - id: b\n    tool:", "  - tool:"),
        7,
        "steps[1].id",
        "required key is missing",
    ),
    ("no steps", "name: t\nbudget: 1s\nsteps: []\n", 3, "steps", "at least 1 item"),
    ("steps not a list", "name: t\nbudget: 1s\nsteps: {a: 1}\n", 3, "steps", "(got a mapping)"),
    (
        "bad input type",
        BASE.replace("{q: str}", "{q: string}"),
        3,
        "inputs",
        "unknown type 'string'",
    ),
    (
        "bad role",
        BASE.replace('prompt: "{{ input.q }}"', "messages: [{role: bot, content: hi}]"),
        6,
        "steps[0].llm.messages[0].role",
        "should be 'system', 'user' or 'assistant' (got 'bot')",
    ),
    (
        "json alias",
        BASE.replace("{model: m,", "{model: m, json: maybe,"),
        6,
        "steps[0].llm.json",
        "(got 'maybe')",
    ),
    (
        "tool outside the directory",
        BASE.replace("tools/orders.py", "../elsewhere.py"),
        8,
        "steps[1].tool",
        "outside the chain's directory",
    ),
    (
        "tool file missing",
        BASE.replace("tools/orders.py", "tools/none.py"),
        8,
        "steps[1].tool",
        "no file 'tools/none.py'",
    ),
    (
        "module not allowed",
        BASE.replace("tools/orders.py", "os"),
        8,
        "steps[1].tool",
        "module 'os' is not allowed (CHAINRT_ALLOWED_MODULES: json)",
    ),
    # --- YAML itself
    (
        "duplicate key",
        BASE + "    tool: tools/orders.py:remember\n",
        9,
        "steps[1].tool",
        "duplicate key 'tool' (first at line 8)",
    ),
    (
        "anchor",
        BASE + "description: &d hello\n",
        9,
        None,
        "anchors (&d) are not supported",
    ),
    (
        "alias",
        BASE + "description: *d\n",
        9,
        None,
        "aliases (*d) are not supported",
    ),
    ("merge key", BASE + "<<: {x: 1}\n", 9, None, "merge keys (<<) are not supported"),
    ("tab", BASE.replace("  - id: b", "\t- id: b"), 7, None, "YAML does not allow tabs"),
    ("garbage", BASE + "output: [1, 2\n", 10, None, "invalid YAML"),
    ("unclosed quote", BASE + 'output: "abc\n', 10, None, "invalid YAML"),
    ("not a mapping", "- name: t\n- budget: 1s\n", 1, None, "top level must be a mapping"),
    ("a scalar", "just some words\n", 1, None, "top level must be a mapping"),
    ("non-string key", BASE + "1: x\n", 9, None, "'1' reads as int; quote it"),
    ("boolean key", BASE + "    args: {on: 1}\n", 9, "steps[1].args", "'on' reads as bool"),
    (
        "python tag",
        BASE + "output: !!python/object/apply:os.system [ls]\n",
        9,
        "output",
        "YAML tag '!!python/object/apply:os.system' is not supported",
    ),
    ("custom tag", BASE + "output: !env HOME\n", 9, "output", "YAML tag '!env'"),
    ("infinity", BASE + "    weight: .inf\n", 9, "steps[1].weight", "infinite and NaN"),
    ("two documents", BASE + "---\nname: u\n", 9, None, "holds one YAML document"),
    ("control character", BASE + "output: \x07\n", 9, None, "character U+0007 is not allowed"),
    (
        "too deep",
        BASE + "output: " + "[" * 80 + "]" * 80 + "\n",
        9,
        None,
        "nesting deeper than 64 levels",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "field", "fragment"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_chain_names_file_line_and_field_on_one_line(
    chain_dir: Path, text: str, line: int | None, field: str | None, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        load_text(chain_dir, text)
    error = info.value
    message = str(error)
    where = f"{chain_dir / 'chain.yaml'}:{line}: " if line else f"{chain_dir / 'chain.yaml'}: "
    expected_prefix = where + (f"{field}: " if field else "")
    assert message.startswith(expected_prefix), message
    assert fragment in message
    assert "\n" not in message
    assert (error.file, error.line, error.field) == (
        os.fspath(chain_dir / "chain.yaml"),
        line,
        field,
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_file_says_so(chain_dir: Path, text: str) -> None:
    with pytest.raises(SpecError) as info:
        load_text(chain_dir, text)
    assert str(info.value) == (
        f"{chain_dir / 'chain.yaml'}: file is empty; a chain needs name, budget and steps"
    )


def test_a_file_that_is_not_utf8_names_the_line(chain_dir: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_text(chain_dir, BASE.encode() + b"description: caf\xe9\n")
    assert str(info.value).startswith(f"{chain_dir / 'chain.yaml'}:9: file is not valid UTF-8")


def test_a_utf8_bom_is_fine(chain_dir: Path) -> None:
    assert load_text(chain_dir, b"\xef\xbb\xbf" + BASE.encode()).spec.name == "t"


def test_a_file_over_one_mebibyte_is_refused_unread(chain_dir: Path) -> None:
    text = BASE + "description: '" + "x" * (1024 * 1024) + "'\n"
    with pytest.raises(SpecError, match="larger than 1048576 bytes"):
        load_text(chain_dir, text)


def test_a_missing_file_or_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such file"
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)


def test_several_errors_lead_with_the_first_by_line_and_stay_on_one_line(chain_dir: Path) -> None:
    text = BASE.replace("name: t", "name: T T") + "    weight: 0\n    retry: {attempts: 0}\n"
    with pytest.raises(SpecError) as info:
        load_text(chain_dir, text)
    message = str(info.value)
    assert message.startswith(f"{chain_dir / 'chain.yaml'}:1: name: name must match")
    assert "also line 9: steps[1].weight: should be greater than 0" in message
    assert "line 10: steps[1].retry.attempts" in message
    assert "\n" not in message
    assert info.value.line == 1


def test_many_errors_are_summarised(chain_dir: Path) -> None:
    text = BASE + "".join(f"    extra{i}: 1\n" for i in range(6))
    with pytest.raises(SpecError) as info:
        load_text(chain_dir, text)
    assert str(info.value).endswith("; and 2 more")
    assert info.value.line == 9


# ---------------------------------------------------------------------------- validate_paths


def test_validate_paths_checks_each_file_of_a_directory(tmp_path: Path) -> None:
    shutil.copytree(DATA / "tools", tmp_path / "tools")
    (tmp_path / "good.yaml").write_text(BASE)
    (tmp_path / "bad.yml").write_text(BASE.replace("8s", "later"))
    (tmp_path / "notes.txt").write_text("not a chain")
    single = tmp_path / "single.yaml"
    errors = validate_paths([tmp_path, single, SAMPLE], allowed_modules=[])
    assert [(e.file, e.line) for e in errors] == [
        (os.fspath(tmp_path / "bad.yml"), 2),
        (os.fspath(single), None),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    [error] = validate_paths([empty], allowed_modules=[])
    assert "no *.yaml or *.yml files" in str(error)
    assert validate_paths([SAMPLE], allowed_modules=[]) == []


# ------------------------------------------------------------------------------------ schema


def test_the_json_schema_describes_the_format() -> None:
    schema = chain_json_schema()
    json.dumps(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "chainrt chain"
    assert set(schema["required"]) == {"name", "budget", "steps"}
    assert schema["additionalProperties"] is False
    llm = schema["$defs"]["LlmSpec"]["properties"]
    assert "json" in llm
    assert "json_output" not in llm
    assert "anyOf" in schema["properties"]["budget"]


def test_the_sample_validates_against_the_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = chain_json_schema()
    jsonschema.validate(yaml.safe_load(SAMPLE.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "budget": "1s", "steps": [], "bogus": 1}, schema)


def test_the_public_names_are_pinned() -> None:
    import chainrt.spec

    assert chainrt.spec.__all__ == [
        "INPUT_TYPES",
        "ChainSpec",
        "ConcurrencyKeySpec",
        "DurationMs",
        "LlmSpec",
        "LoadedSpec",
        "MessageSpec",
        "RetrySpec",
        "StepSpec",
        "Template",
        "YamlDocument",
        "add_chain_root",
        "chain_json_schema",
        "chain_roots",
        "check_reference",
        "compile_template",
        "iter_templates",
        "load_spec",
        "parse_allowed_modules",
        "parse_spec",
        "parse_yaml",
        "read_yaml",
        "render_value",
        "resolve_callable",
        "resolve_object",
        "spec_from_dict",
        "validate_paths",
    ]
    assert all(hasattr(chainrt.spec, name) for name in chainrt.spec.__all__)
