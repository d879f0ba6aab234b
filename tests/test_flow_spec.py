"""Control flow in the chain format: when, switch, parallel, map — shapes, checks, schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from chainrt import SpecError
from chainrt.spec import chain_json_schema, load_spec, parse_spec, spec_from_dict
from chainrt.spec._dump import spec_dump
from chainrt.spec._flow import MAX_NESTING, walk_steps

GOOD = """\
name: flow
budget: 2s
inputs: {q: str, items: list}
steps:
  - id: intent
    tool: x:y
  - id: lookup
    when: "{{ steps.intent.output.order_id and models.primary.p99_ms < 2000 }}"
    tool: x:y
  - id: route
    switch: "{{ steps.intent.output.intent }}"
    cases:
      refund:
        - {id: policy, tool: x:y}
        - {id: answer, tool: x:y, args: {v: "{{ steps.policy.output }}"}}
    default: [{id: other, tool: x:y, args: {v: "{{ steps.intent.output }}"}}]
  - id: gather
    parallel:
      orders: [{id: orders, tool: x:y, args: {b: "{{ steps.route.branch }}"}}]
      kb: [{id: search, tool: x:y}]
    join: {quorum: 1}
  - id: per_item
    map: "{{ input.items }}"
    max_concurrency: 4
    steps: [{id: classify, tool: x:y, args: {v: "{{ item }}", i: "{{ index }}"}}]
output: "{{ steps.gather.output.kb }}"
"""


def parse(text: str) -> Any:
    return parse_spec(text, file="chain.yaml", allowed_modules=["x"])


def test_every_form_loads_and_its_stored_form_loads_again_unchanged() -> None:
    spec = parse(GOOD)
    kinds = [s.kind for s in spec.steps]
    assert kinds == ["tool", "tool", "switch", "parallel", "map"]
    ids = [s.id for s, _ in walk_steps(spec.steps)]
    assert ids == [
        *("intent", "lookup", "route", "policy", "answer", "other"),
        *("gather", "orders", "search", "per_item", "classify"),
    ]
    dumped = spec_dump(spec)
    again = spec_from_dict(json.loads(json.dumps(dumped)))
    assert again == spec
    assert spec_dump(again) == dumped


def test_a_straight_steps_stored_form_has_no_flow_keys() -> None:
    spec = parse(GOOD)
    intent = spec_dump(spec)["steps"][0]
    assert not {"when", "switch", "cases", "parallel", "join", "map", "max_concurrency"} & set(
        intent
    )
    assert spec_dump(spec)["steps"][1]["when"].startswith("{{")


def replace(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


BAD = [
    (
        "reads a sibling branch",
        replace('{b: "{{ steps.route.branch }}"}', '{b: "{{ steps.search.output }}"}'),
        19,
        "step 'search' may not have run here: it is inside group 'gather'",
    ),
    (
        "reads inside a group from outside",
        replace('output: "{{ steps.gather.output.kb }}"', 'output: "{{ steps.classify.output }}"'),
        26,
        "it is inside group 'per_item' (read steps.per_item.output)",
    ),
    (
        "unknown parallel branch",
        replace("steps.gather.output.kb", "steps.gather.output.docs"),
        26,
        "group 'gather' has no branch 'docs' (branches: orders, kb)",
    ),
    (
        "duplicate id across branches",
        replace("{id: search, tool: x:y}", "{id: policy, tool: x:y}"),
        20,
        "duplicate step id 'policy'",
    ),
    (
        "item outside a map",
        replace('{b: "{{ steps.route.branch }}"}', '{b: "{{ item }}"}'),
        19,
        "unknown name 'item'",
    ),
    (
        "models outside when and switch",
        replace('v: "{{ item }}"', 'v: "{{ models.primary.p50_ms }}"'),
        25,
        "unknown name 'models'",
    ),
    (
        "a model field that does not exist",
        replace("models.primary.p99_ms", "models.primary.p95_ms"),
        8,
        "write models.<name>.p50_ms, .p99_ms, .healthy",
    ),
    (
        "branch of a step that is not a switch",
        replace("steps.route.branch", "steps.intent.branch"),
        19,
        "a step exposes only its output",
    ),
    (
        "a bad expression",
        replace("steps.intent.output.intent }}", "steps.intent.output.intent == }}"),
        11,
        "expected a name or a literal",
    ),
    (
        "a switch branch that does not exist",
        replace(
            "  - id: gather\n",
            "  - id: gather\n    when: \"{{ steps.route.branch in ['refund', 'refnd'] }}\"\n",
        ),
        18,
        "switch 'route' has no branch 'refnd' (branches: refund, default)",
    ),
    (
        "a switch branch compared the other way round",
        replace(
            "  - id: gather\n",
            "  - id: gather\n    when: \"{{ 'status' == steps.route.branch }}\"\n",
        ),
        18,
        "switch 'route' has no branch 'status'",
    ),
    ("quorum above the branches", replace("{quorum: 1}", "{quorum: 3}"), 17, "quorum 3"),
    ("join without parallel", replace("max_concurrency: 4", "join: any"), 22, "join applies"),
    ("a case called default", replace("      refund:\n", "      default:\n"), 10, "'default'"),
    ("an empty branch", replace("kb: [{id: search, tool: x:y}]", "kb: []"), 17, "branch 'kb'"),
    ("map without steps", replace("    max_concurrency: 4\n    steps:", "    other:"), 24, None),
    ("two kinds", replace("    map: ", "    tool: x:y\n    map: "), 22, "found: tool, map"),
]


@pytest.mark.parametrize(
    ("text", "line", "fragment"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_a_wrong_flow_is_refused_with_file_and_line(
    text: str, line: int, fragment: str | None
) -> None:
    with pytest.raises(SpecError) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith(f"chain.yaml:{line}: "), message
    if fragment is not None:
        assert fragment in message


def nested(depth: int) -> list[dict[str, Any]]:
    if depth == 0:
        return [{"id": "leaf", "tool": "x:y"}]
    return [{"id": f"g{depth}", "parallel": {"a": nested(depth - 1)}}]


def test_groups_nest_eight_deep_and_no_deeper() -> None:
    ok = {"name": "deep", "budget": "2s", "steps": nested(MAX_NESTING)}
    parse(yaml.safe_dump(ok))
    too_deep = {"name": "deep", "budget": "2s", "steps": nested(MAX_NESTING + 1)}
    with pytest.raises(SpecError, match="groups nest at most 8 deep; this one is level 9"):
        parse(yaml.safe_dump(too_deep))


def test_tool_files_inside_branches_are_checked(tmp_path: Path) -> None:
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        "name: t\nbudget: 1s\nsteps:\n  - id: g\n    parallel:\n"
        "      a: [{id: one, tool: missing.py:fn}]\n"
    )
    with pytest.raises(SpecError, match=r"chain.yaml:6: steps\[0\]\.parallel\.a\[0\]\.tool"):
        load_spec(chain)


def test_the_json_schema_describes_the_groups() -> None:
    schema = chain_json_schema()
    step = schema["$defs"]["StepSpec"]["properties"]
    for key in ("when", "switch", "cases", "default", "parallel", "join", "map", "steps"):
        assert key in step, key
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(GOOD))
    wrong = yaml.safe_load(GOOD)
    wrong["steps"][4]["max_concurrency"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(wrong)
