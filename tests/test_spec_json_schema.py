"""``llm.json_schema`` in a chain: checked against the JSON Schema metaschema at load time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chainrt.errors import SpecError
from chainrt.spec import load_spec

CHAIN = """\
name: structured
budget: 5s
steps:
  - id: intent
    llm:
      model: local
      prompt: "Classify: hello"
      json_schema:
{schema}
"""


def write(tmp_path: Path, schema: str) -> Path:
    path = tmp_path / "chain.yaml"
    indented = "\n".join("        " + line for line in schema.splitlines())
    path.write_text(CHAIN.format(schema=indented))
    return path


def test_a_valid_schema_loads_and_implies_json(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "type: object\nproperties:\n  intent: {enum: [order_status, refund]}\nrequired: [intent]",
    )
    llm = load_spec(path).spec.steps[0].llm
    assert llm is not None
    assert llm.json_schema == {
        "type": "object",
        "properties": {"intent": {"enum": ["order_status", "refund"]}},
        "required": ["intent"],
    }


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ("type: banana", "not a valid JSON Schema: at type: 'banana' is not valid"),
        ("properties:\n  a: {minLength: -1}", "at properties/a/minLength"),
        ("required: yes", "at required"),
    ],
    ids=["unknown_type", "negative_length", "required_not_a_list"],
)
def test_an_invalid_schema_is_a_spec_error_with_file_and_line(
    tmp_path: Path, schema: str, fragment: str
) -> None:
    path = write(tmp_path, schema)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    error = info.value
    assert error.file == os.fspath(path)
    assert error.line == 8  # the json_schema key
    assert "json_schema" in (error.field or "")
    assert fragment in str(error)
    assert "\n" not in str(error)


def test_a_schema_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(CHAIN.format(schema="        - a list"))
    with pytest.raises(SpecError, match="json_schema"):
        load_spec(path)
