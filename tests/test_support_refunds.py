"""The support agent's refund tools (``chains/tools/support_refunds.py``): the agent's calls
never change the facts, another customer's order stays hidden, and a refund over 100 EUR needs
a person's approval."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from bench_loader import load_module

CHAINS = Path(__file__).resolve().parent.parent / "chains"


def _load(name: str, file: str) -> ModuleType:
    return load_module(name, CHAINS / "tools" / file)


refunds = _load("support_refunds", "support_refunds.py")
orders = _load("support_orders", "orders.py")

POLICY_CALL = {"name": "refund_policy", "arguments": {}, "result": orders.REFUND_POLICY}


def test_find_order_finds_only_the_asking_customers_order() -> None:
    mine = refunds.find_order("1042", "u1")
    assert mine["found"] is True
    assert "has shipped with UPS" in mine["facts"]
    theirs = refunds.find_order("1017", "u1")  # u2's order
    missing = refunds.find_order("9999", "u1")
    assert theirs["found"] is False
    for leaked in ("processing", "running shoes", "2026-12-04", "89.90"):
        assert leaked not in json.dumps(theirs)
    assert theirs["facts"].replace("1017", "N") == missing["facts"].replace("9999", "N")
    assert refunds.find_order("", "u1")["found"] is False  # an empty id finds nothing


def test_the_record_comes_from_the_question_not_from_the_agents_calls() -> None:
    order = orders.lookup_order("Can I get a refund for order 1001?", "u1")
    # The model asked for another order (and another customer): the record is still 1001's.
    wrong = {"name": "find_order", "arguments": {"order_id": "1017", "customer_id": "u2"}}
    record = refunds.refund_record(order, {"answer": "done", "calls": [wrong, POLICY_CALL]})
    assert (record["order_id"], record["status"]) == ("1001", "delivered")
    assert record["agent_calls"] == ["find_order", "refund_policy"]
    assert record["policy_source"] == "agent"
    assert "running shoes" not in json.dumps(record)
    assert record["facts"].endswith(orders.REFUND_POLICY)
    # No agent output (skipped: it ran out of time): the chain's own policy, nothing called.
    skipped = refunds.refund_record(order, None)
    assert (skipped["agent_calls"], skipped["policy_source"]) == ([], "chain")
    assert (skipped["agent_answered"], record["agent_answered"]) == (False, True)
    assert skipped["facts"] == record["facts"]
    # A refund_policy call that failed is not taken as the policy.
    failed = {"name": "refund_policy", "arguments": {}, "error": "boom"}
    assert refunds.refund_record(order, {"calls": [failed]})["policy_source"] == "chain"


def test_a_refund_over_100_eur_needs_approval() -> None:
    def needs(question: str, user: str) -> tuple[int, bool]:
        record = refunds.refund_request(orders.lookup_order(question, user))
        return record["refund_cents"], record["needs_approval"]

    assert needs("Can I get a refund for order 1001?", "u1") == (24_900, True)  # 249.00 EUR
    assert needs("Refund for order 1103 please", "u2") == (4_200, False)  # 42.00 EUR
    assert needs("Refund for order 1103 please", "u1") == (0, False)  # not this customer's
    assert needs("Can I get a refund for order 4242?", "u1") == (0, False)  # no such order
    assert needs("Where is my order 1001?", "u1") == (0, False)  # no refund asked for
    # The question's words decide, not the branch: a default-branch record asks for it too.
    assert needs("How do I get my money back for order 1042?", "u1") == (17_900, True)


def test_the_decision_is_added_to_the_checked_answer() -> None:
    record = refunds.refund_request(orders.lookup_order("Can I get a refund for order 1001?", "u1"))
    checked = orders.checked_answer("Order 1001 was delivered by DHL; 30 days to refund.", record)
    assert checked["source"] == "model"
    approved = refunds.with_decision(checked, record, {"approved": True, "note": "ok by Ann"})
    assert approved["answer"] == checked["answer"] + " Your refund of 249.00 EUR was approved."
    assert approved["source"] == "model"
    assert approved["order"]["refund_approved"] is True
    assert approved["order"]["facts"].endswith("Your refund of 249.00 EUR was approved.")
    refused = refunds.with_decision(checked, record, {"approved": False})
    assert refused["answer"].endswith("Your refund of 249.00 EUR was not approved.")
    assert refused["order"]["refund_approved"] is False
    # No approval needed: the checked answer and the record as they were.
    small = refunds.refund_request(orders.lookup_order("Refund for order 1103 please", "u2"))
    plain = orders.checked_answer("", small)
    assert refunds.with_decision(plain, small, None) == {
        "answer": plain["answer"],
        "source": "template",
        "order": small,
    }
