"""The shipped support agent (``chains/support_agent.yaml``): schema-valid JSON from the model,
JSON tool outputs, and an answer checked against the order's facts."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from bench_loader import load_module

import chainrt

CHAINS = Path(__file__).resolve().parent.parent / "chains"


def _orders() -> ModuleType:
    return load_module("support_orders", CHAINS / "tools" / "orders.py")


orders = _orders()


def test_lookup_returns_json_values_not_python_reprs() -> None:
    record = orders.lookup_order(
        "Where is my order 1042?",
        intent={"intent": "order_status", "order_id": "1042"},
        selection={"tool": "lookup_order"},
    )
    assert record["tool"] == "lookup_order"
    assert json.loads(json.dumps(record)) == record
    assert (record["status"], record["carrier"], record["eta"]) == ("shipped", "UPS", "2026-12-02")
    assert "refund_policy" not in record  # the question asks nothing about refunds
    # A model's refund label on a plain status question adds no refund policy.
    labelled = orders.lookup_order("Where is my order 1042?", intent={"intent": "refund"})
    assert "refund_policy" not in labelled
    assert orders.lookup_order("Where is 1042?", selection="not a dict")["tool"] is None
    # An order number the model invented is not looked up.
    invented = orders.lookup_order("Where is my package?", intent={"order_id": "1002"})
    assert invented["order_id"] is None
    assert invented["found"] is False


@pytest.mark.parametrize(
    ("answer", "source", "missing"),
    [
        ("Your order 1042 has shipped with UPS and should arrive on 2026-12-02.", "model", []),
        ("Your order 1042 was delivered by UPS on 2026-12-02.", "template", ["status", "no other status"]),
        ("Order 1042 has shipped with DHL, arriving 2026-12-02.", "template", ["carrier"]),
        ("Order 1042 has shipped with UPS.", "template", ["eta"]),
        (
            "I'm sorry, but I am unable to assist you with order 1042.",
            "template",
            ["status", "carrier", "eta", "no refusal ('unable to assist')", "no refusal (\"i'm sorry, but\")"],
        ),
        ("", "template", ["an answer"]),
        (
            # The item's own name holds another status's word ("cancel"): not a wrong status.
            "Good news! Order 1042 (noise-cancelling headphones) has shipped with UPS and should "
            "arrive on 2026-12-02.",
            "model",
            [],
        ),
        (
            "Order 1042 (noise-cancelling headphones) was cancelled; it has shipped with UPS, "
            "arriving 2026-12-02.",
            "template",
            ["no other status"],
        ),
        (
            "Order 1042 has shipped with UPS, arriving 2026-12-02. Sender: 1234567890",
            "template",
            ["no invented numbers (1234567890)", "no echo of the instructions"],
        ),
    ],
    ids=[
        "right", "wrong_status", "wrong_carrier", "no_eta", "refusal", "empty", "item_name",
        "item_name_and_wrong_status", "invented",
    ],
)  # fmt: skip
def test_the_answer_is_checked_against_the_order(
    answer: str, source: str, missing: list[str]
) -> None:
    record = orders.lookup_order("Where is my order 1042?")
    checked = orders.checked_answer(answer, record)
    assert checked["source"] == source
    assert checked["missing"] == missing
    if source == "template":
        assert "has shipped with UPS and should arrive on 2026-12-02" in checked["answer"]
    else:
        assert checked["answer"] == answer


def test_unknown_orders_and_refunds_are_checked_too() -> None:
    unknown = orders.lookup_order("Can I get a refund for order 4242?")
    assert orders.checked_answer("We could not find order 4242.", unknown)["missing"] == [
        "refund policy"
    ]
    good = "We could not find order 4242; refunds are possible within 30 days of delivery."
    assert orders.checked_answer(good, unknown)["source"] == "model"


def test_the_agent_answers_with_the_orders_real_facts(tmp_path: Path) -> None:
    # Local model only; a generous budget so a loaded machine cannot push a step to its static
    # answer (the shipped chain's 8 s is for an idle one).
    result = chainrt.load(CHAINS / "support_agent.yaml").run(
        {"user_id": "u1", "session_id": "s1", "question": "Where is my order 1042?"},
        store=f"sqlite:///{tmp_path}/runs.db",
        pool=None,
        budget="60s",
    )
    assert result.status == "completed"
    steps = {s.id: s for s in result.steps}
    # Constrained decoding: the model's own JSON, not the static fallback.
    assert steps["intent_parse"].model == "local"
    assert steps["tool_selection"].model == "local"
    output = result.output
    assert isinstance(output, dict)
    assert output["order"]["tool"] in ("lookup_order", "refund_policy", "none")
    answer = output["answer"]
    for fact in ("1042", "shipped", "UPS", "2026-12-02"):
        assert fact in answer
    assert output["answer_source"] in ("model", "template")
