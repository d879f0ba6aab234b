"""The shipped support agent (``chains/support_agent.yaml``): schema-valid JSON from the model,
JSON tool outputs, and an answer checked against the order's facts."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from bench_loader import load_module

import chainrt
from chainrt._defaults import default_runtime, run_sync

CHAINS = Path(__file__).resolve().parent.parent / "chains"


def _orders() -> ModuleType:
    return load_module("support_orders", CHAINS / "tools" / "orders.py")


orders = _orders()


def test_lookup_returns_json_values_not_python_reprs() -> None:
    record = orders.lookup_order(
        "Where is my order 1042?",
        user_id="u1",
        intent={"intent": "order_status", "order_id": "1042"},
        selection={"tool": "lookup_order"},
    )
    assert record["tool"] == "lookup_order"
    assert json.loads(json.dumps(record)) == record
    assert (record["status"], record["carrier"], record["eta"]) == ("shipped", "UPS", "2026-12-02")
    assert "refund_policy" not in record  # the question asks nothing about refunds
    # A model's refund label on a plain status question adds no refund policy.
    labelled = orders.lookup_order("Where is my order 1042?", "u1", intent={"intent": "refund"})
    assert "refund_policy" not in labelled
    assert orders.lookup_order("Where is 1042?", "u1", selection="not a dict")["tool"] is None
    # An order number the model invented is not looked up.
    invented = orders.lookup_order("Where is my package?", "u1", intent={"order_id": "1002"})
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
    record = orders.lookup_order("Where is my order 1042?", "u1")
    checked = orders.checked_answer(answer, record)
    assert checked["source"] == source
    assert checked["missing"] == missing
    if source == "template":
        assert "has shipped with UPS and should arrive on 2026-12-02" in checked["answer"]
    else:
        assert checked["answer"] == answer


def test_another_customers_order_is_not_found_like_a_missing_one() -> None:
    theirs = orders.lookup_order("Where is my order 1017?", "u1")  # 1017 is u2's
    missing = orders.lookup_order("Where is my order 9999?", "u1")
    assert theirs["found"] is False
    assert theirs["note"] == "no order 1017 on your account"
    assert missing["note"] == "no order 9999 on your account"
    assert theirs["facts"].replace("1017", "N") == missing["facts"].replace("9999", "N")
    for leaked in ("processing", "running shoes", "2026-12-04", "89.90", "u2", "customer"):
        assert leaked not in json.dumps(theirs)
    # Its owner finds it.
    assert orders.lookup_order("Where is my order 1017?", "u2")["item"] == "running shoes"


def test_an_answer_that_is_the_static_answer_is_not_reported_as_the_models() -> None:
    record = orders.lookup_order("Where is my order 1042?", "u1")
    checked = orders.checked_answer(record["facts"], record)  # the summary's static_answer
    assert checked == {"answer": record["facts"], "source": "static", "missing": []}


def test_unknown_orders_and_refunds_are_checked_too() -> None:
    unknown = orders.lookup_order("Can I get a refund for order 4242?", "u1")
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


def test_with_policy_adds_the_looked_up_policy_only_where_the_question_asks() -> None:
    refund = orders.lookup_order("Can I get a refund for order 1001?", "u1")
    merged = orders.with_policy(refund, "Refunds within 30 days, checked by hand.")
    assert merged["refund_policy"] == "Refunds within 30 days, checked by hand."
    assert merged["facts"].endswith("Refunds within 30 days, checked by hand.")
    assert "1001" in merged["facts"]
    # A model's refund label on a plain status question: the branch ran, the answer stays.
    status = orders.lookup_order("Where is my order 1042?", "u1", intent={"intent": "refund"})
    assert orders.with_policy(status, orders.refund_policy()) == status
    assert orders.with_policy(refund, None) == refund  # no policy looked up: the record as is


def test_the_intent_picks_the_branch_and_a_refund_waits_for_approval(tmp_path: Path) -> None:
    # Local model only, a generous budget (see above). The small model labels the intent; the
    # switch follows its label (a refund goes to the agent, whose calls never change the facts),
    # the question's words put the policy in the answer either way, and a refund over 100 EUR
    # (order 1001: 249.00 EUR) waits for a person's approval whichever branch ran.
    store = f"sqlite:///{tmp_path}/runs.db"
    waiting = chainrt.load(CHAINS / "support_agent.yaml").run(
        {"user_id": "u1", "session_id": "s1", "question": "Can I get a refund for order 1001?"},
        store=store,
        pool=None,
        budget="60s",
    )
    assert waiting.status == "waiting", waiting.error
    steps = {s.id: s for s in waiting.steps}
    assert steps["intent_parse"].status == "completed"
    route = steps["route"]
    assert route.branch in ("refund", "default")
    inner = [s.path for s in route.steps or []]
    if route.branch == "refund":
        assert inner == [
            "route.refund.refund_order",
            "route.refund.refund_agent",
            "route.refund.refund_record",
        ]
        assert (route.steps or [])[1].status in ("completed", "skipped")  # optional: in time?
    else:
        assert inner == ["route.default.db_query"]
    assert steps["approve"].status == "waiting"

    async def approve() -> chainrt.RunResult:
        runtime = await default_runtime(store, None)
        return await runtime.signal(waiting.run_id, "refund_ok", {"approved": True})

    result = run_sync(approve())
    assert result.status == "completed", result.error
    output = result.output
    assert isinstance(output, dict)
    for fact in ("1001", "30 days"):
        assert fact in output["answer"]
    parsed = output["order"]
    assert parsed["refund_policy"] == orders.REFUND_POLICY
    assert (parsed["needs_approval"], parsed["refund_approved"]) == (True, True)
    assert parsed["facts"].endswith("Your refund of 249.00 EUR was approved.")
