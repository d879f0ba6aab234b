"""Agent steps without a model: the chain format, tool schemas, call checks, and the pure rules
of the loop (final reserve, reading a turn)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chainrt.agent import _budget as rules
from chainrt.agent._tools import BadCall, check_call, load_tool, parse_docstring
from chainrt.agent._turns import Proposed, Turn, read_turn, turn_schema, unwrap_answer
from chainrt.cli import main
from chainrt.errors import SpecError
from chainrt.spec import load_spec, parse_spec, spec_from_dict
from chainrt.spec._agent import AgentToolSpec
from chainrt.spec._dump import spec_dump

AGENT = Path(__file__).parent / "data" / "chains" / "agent"

CHAIN = """\
name: a
budget: 5s
inputs: {q: str}
steps:
  - id: agent
    agent:
      model: primary
      prompt: "{{ input.q }}"
      tools:
        - tools.py:lookup_order
        - {tool: tools.py:refund_policy, name: policy}
      final_reserve: 500ms
    fallbacks: [local]
"""


def test_an_agent_step_loads_and_its_stored_spec_loads_again() -> None:
    spec = parse_spec(CHAIN, source_dir=AGENT)
    step = spec.steps[0]
    assert step.kind == "agent"
    assert step.agent is not None
    assert step.agent.final_reserve_ms() == 500.0
    assert [t.name for t in step.agent.tools] == [None, "policy"]
    stored = spec_dump(spec)
    assert stored["steps"][0]["agent"]["final_reserve"] == "500ms"
    assert spec_from_dict(stored) == spec
    auto = parse_spec(CHAIN.replace("500ms", "auto"))
    assert auto.steps[0].agent is not None
    assert auto.steps[0].agent.final_reserve_ms() is None
    # Other steps' stored form has no agent key.
    plain = parse_spec("name: p\nbudget: 1s\nsteps: [{id: s, tool: tools.py:slow}]\n")
    assert "agent" not in spec_dump(plain)["steps"][0]


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        (("500ms", "soon"), 12, "final_reserve must be 'auto' or a duration"),
        (("tools.py:lookup_order", "nofile.py:lookup_order"), 10, "nofile.py"),
        (("name: policy", "name: lookup_order"), 6, "two tools are named 'lookup_order'"),
        (("name: policy", "name: 'bad name'"), 11, "tool name must match"),
        (("{{ input.q }}", "{{ input.x }}"), 8, "input 'x' is not declared"),
        (("final_reserve", "final_reservez"), 12, "unknown key 'final_reservez'"),
        (('      prompt: "{{ input.q }}"\n', ""), 6, "needs `prompt` or `messages`"),
    ],
)
def test_a_bad_agent_step_names_file_line_and_field(
    tmp_path: Path, change: tuple[str, str], line: int, message: str
) -> None:
    chain = tmp_path / "c.yaml"
    (tmp_path / "tools.py").write_text((AGENT / "tools.py").read_text())
    chain.write_text(CHAIN.replace(*change))
    with pytest.raises(SpecError) as caught:
        load_spec(chain)
    assert str(caught.value).startswith(f"{chain}:{line}: steps[0].agent")
    assert message in str(caught.value)


def test_the_format_schema_has_agent_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert "AgentSpec" in json.loads(capsys.readouterr().out)["$defs"]


def test_schema_tools_prints_each_agent_tools_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--tools", str(AGENT / "orders.yaml")]) == 0
    out = capsys.readouterr().out
    tools = {t["function"]["name"]: t["function"] for t in json.loads(out)["agent"]}
    assert tools["lookup_order"] == {
        "name": "lookup_order",
        "description": "Look an order up by its id.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order's id, e.g. A12."}
            },
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }
    # A pydantic parameter is written in place (no $ref out of the turn's schema), ctx is hidden.
    refund = tools["issue_refund"]["parameters"]
    assert "$defs" not in json.dumps(refund)
    assert set(refund["properties"]) == {"refund"}
    assert refund["properties"]["refund"]["required"] == ["order_id", "amount"]
    assert main(["schema", "--tools", str(AGENT / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_docstrings_give_the_descriptions() -> None:
    google = parse_docstring("Find it.\n\nMore.\n\nArgs:\n    a: the a.\n    b (int): the b.\n")
    assert google == ("Find it.", {"a": "the a.", "b": "the b."})
    rest = parse_docstring("Find it.\n\n:param a: the a.\n:param int b: the b.\n")
    assert rest == ("Find it.", {"a": "the a.", "b": "the b."})
    assert parse_docstring(None) == ("", {})


def test_calls_are_checked_against_the_tools_schemas() -> None:
    tools = {
        t.name: t
        for t in (
            load_tool(AgentToolSpec(tool=f"tools.py:{name}"), AGENT, ())
            for name in ("lookup_order", "issue_refund")
        )
    }
    assert check_call(tools, "lookup_order", {"order_id": "A1"}) == {"order_id": "A1"}
    checked = check_call(tools, "issue_refund", {"refund": {"order_id": "A1", "amount": 3}})
    assert type(checked["refund"]).__name__ == "Refund"  # the tool gets its pydantic model
    for name, arguments, message in [
        ("nope", {}, "there is no tool 'nope'; the tools are: lookup_order, issue_refund"),
        ("lookup_order", {}, "order_id: Field required"),
        ("lookup_order", {"order_id": "A1", "x": 1}, "x: Extra inputs are not permitted"),
        ("lookup_order", [], "must be a JSON object"),
        ("issue_refund", {"refund": {"order_id": "A1", "amount": -1}}, "greater than 0"),
    ]:
        with pytest.raises(BadCall) as caught:
            check_call(tools, name, arguments)
        assert message in caught.value.message


@pytest.mark.parametrize(
    ("fixed", "p90_s", "allotted", "expected"),
    [
        (250.0, 2.0, 10_000.0, 250.0),  # a fixed reserve is kept as given
        (None, 0.4, 10_000.0, 600.0),  # auto: p90 x 1.5
        (None, None, 10_000.0, rules.DEFAULT_RESERVE_MS),  # no answer times yet
        (None, 4.0, 10_000.0, 6000.0),  # measured: kept whole, even over half the allotment
        (None, 8.0, 10_000.0, 12_000.0),  # ... or over all of it (the agent answers at once)
        (None, None, 2000.0, 1000.0),  # the unmeasured default: at most half the allotment
        (None, 0.001, 10_000.0, rules.MIN_RESERVE_MS),  # at least a round trip
    ],
)
def test_final_reserve(
    fixed: float | None, p90_s: float | None, allotted: float, expected: float
) -> None:
    assert rules.final_reserve_ms(fixed, p90_s, allotted) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("tool_turns", "left_ms", "expected"),
    [
        (0, 5000.0, rules.Move(final=False)),
        (2, 5000.0, rules.Move(final=False)),
        (3, 5000.0, rules.Move(final=True, why="max_iterations")),
        (0, 600.0, rules.Move(final=True, why="budget")),
        (0, -5.0, rules.Move(final=True, why="budget")),
    ],
)
def test_next_move(tool_turns: int, left_ms: float, expected: rules.Move) -> None:
    move = rules.next_move(tool_turns=tool_turns, max_iterations=3, left_ms=left_ms, reserve_ms=600)
    assert move == expected


def test_the_records_writes_are_kept_before_the_reserve() -> None:
    # 700 ms left, a 600 ms reserve: a tool turn, unless writing its records takes 100 ms more.
    move = rules.next_move(tool_turns=0, max_iterations=3, left_ms=700.0, reserve_ms=600)
    assert move == rules.Move(final=False)
    kept = rules.next_move(
        tool_turns=0, max_iterations=3, left_ms=700.0, reserve_ms=600, writes_ms=100.0
    )
    assert kept == rules.Move(final=True, why="budget")


@pytest.mark.parametrize(
    ("recent", "expected"),
    [
        ([], 0.0),  # nothing written yet
        ([2.0], 3.0),  # p90 x 1.5
        ([1.0] * 9 + [40.0], 1.5),  # one slow write in ten is past the p90
        ([1.0] * 8 + [40.0, 40.0], 60.0),
    ],
)
def test_write_allowance(recent: list[float], expected: float) -> None:
    assert rules.write_allowance_ms(recent) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"content": "hi"}', Turn("hi")),
        ("plain words", Turn("plain words")),
        ('{"calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}',
         Turn(None, (Proposed("a", {"x": 1}), Proposed("b", {})))),
        ('{"name": "a", "arguments": {"x": 1}}', Turn(None, (Proposed("a", {"x": 1}),))),
        ('{"calls": [1, 2, 3]}', Turn(None, (Proposed(None, 1), Proposed(None, 2)))),
        ("[1, 2]", Turn("[1, 2]")),
    ],
)  # fmt: skip
def test_read_turn(text: str, expected: Turn) -> None:
    assert read_turn(text, max_calls=2) == expected


def test_unwrap_answer_and_turn_schema() -> None:
    assert unwrap_answer('{"content": "done"}') == "done"
    assert unwrap_answer("done") == "done"
    tool = load_tool(AgentToolSpec(tool="tools.py:lookup_order"), AGENT, ())
    strict = turn_schema([tool], 3)
    calls = strict["anyOf"][0]["properties"]["calls"]
    assert calls["maxItems"] == 3
    assert calls["items"]["properties"]["name"] == {"const": "lookup_order"}
    loose = turn_schema([tool], 3, strict=False)
    assert loose["anyOf"][0]["properties"]["calls"]["items"]["properties"]["name"] == {
        "type": "string"
    }


def test_a_plain_function_tool_loads_without_importing_langchain() -> None:
    # Tools are loaded inside the first run's budget: LangChain's import took seconds of it.
    code = (
        "import sys; from pathlib import Path; from chainrt.agent._tools import load_tool; "
        "from chainrt.spec._agent import AgentToolSpec; "
        f"tool = load_tool(AgentToolSpec(tool='tools.py:lookup_order'), Path({str(AGENT)!r}), ()); "
        "assert not tool.langchain; "
        "print(sorted(m for m in sys.modules if m.startswith('langchain')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_validate_reads_the_agents_tool_files_for_their_definitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tools.py").write_text((AGENT / "tools.py").read_text())
    chain = tmp_path / "c.yaml"
    chain.write_text(CHAIN.replace("tools.py:refund_policy", "tools.py:refund_polic"))
    assert main(["validate", str(chain)]) == 2
    err = capsys.readouterr().err
    assert f"{chain}:11: steps[0].agent.tools[1].tool" in err
    assert "refund_polic" in err
