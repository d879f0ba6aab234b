"""Refunds in the support agent (``chains/support_agent.yaml``): the agent's tools, and the
deterministic record its answer is checked against.

The agent step's model chooses the calls (``find_order`` and ``refund_policy``); the record the
customer is answered from is still built from the question's own digits and the asking customer
(:func:`orders.lookup_order`), so a wrong or missing call never changes the facts, and a call
for another customer's order finds nothing, exactly like an order that does not exist.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

from pydantic import StringConstraints

APPROVAL_OVER_CENTS = 10_000
"""A refund over this (100 EUR) waits for a person's approval (the ``approve`` wait step)."""


def _orders() -> ModuleType:
    """``orders.py`` beside this file (the chain's tool files are loaded by path, not package)."""
    name = "chainrt_support_orders"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("orders.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


OrderId = Annotated[str, StringConstraints(pattern=r"^[0-9]{3,8}$")]
"""An order number: constrained decoding gives the model no way to leave it empty."""
CustomerId = Annotated[str, StringConstraints(pattern=r"^u[0-9]{1,6}$")]


def find_order(order_id: OrderId, customer_id: CustomerId) -> dict[str, Any]:
    """Look an order up.

    Args:
        order_id: The order number in the message.
        customer_id: The customer's id.
    """
    orders = _orders()
    record: dict[str, Any] = orders.lookup_order(f"order {order_id}", customer_id)
    return {"order_id": record.get("order_id"), "found": record["found"], "facts": record["facts"]}


def refund_policy() -> str:
    """The refund policy."""
    policy: str = _orders().REFUND_POLICY
    return policy


def _cents(total: Any) -> int:
    amount, _, _ = str(total or "0").partition(" ")
    try:
        return round(float(amount) * 100)
    except ValueError:
        return 0


def refund_record(order: dict[str, Any], agent: Any) -> dict[str, Any]:
    """The refund branch's record: the order (found for the asking customer only), the refund
    policy the agent looked up (the shop's policy when it did not call ``refund_policy``), and
    the names of the calls the agent made.

    ``agent`` is the agent step's output (``{answer, calls, ...}``), or None when it was skipped.
    """
    orders = _orders()
    calls = agent.get("calls") if isinstance(agent, dict) else None
    calls = calls if isinstance(calls, list) else []
    names = [str(c.get("name"))[:40] for c in calls if isinstance(c, dict)]
    looked_up = [
        c.get("result")
        for c in calls
        if isinstance(c, dict) and c.get("name") == "refund_policy" and "error" not in c
    ]
    policy = next((p for p in looked_up if isinstance(p, str) and p.strip()), None)
    record: dict[str, Any] = orders.with_policy(order, policy or orders.refund_policy())
    return {
        **record,
        "agent_answered": isinstance(agent, dict),
        "agent_calls": names,
        "policy_source": "agent" if policy else "chain",
    }


def refund_request(order: dict[str, Any]) -> dict[str, Any]:
    """The record with the refund it asks for: ``refund_cents`` (the order's total, when the
    question asks for a refund and the order is the customer's) and ``needs_approval`` (over
    100 EUR: the ``approve`` wait step stops the run for a person)."""
    wants_refund = "refund_policy" in order  # the question's own words asked for a refund
    cents = _cents(order.get("total")) if order.get("found") and wants_refund else 0
    return {**order, "refund_cents": cents, "needs_approval": cents > APPROVAL_OVER_CENTS}


def with_decision(checked: dict[str, Any], order: dict[str, Any], decision: Any) -> dict[str, Any]:
    """The reply: the checked answer (``answer_check``'s output) with the approval's outcome
    added, and the record with it (``decision`` is the ``approve`` wait's payload,
    ``{approved, note?}``; None when no approval was needed). Returns ``{answer, source,
    order}``."""
    answer = str(checked.get("answer") or "")
    source = checked.get("source")
    if not order.get("needs_approval"):
        return {"answer": answer, "source": source, "order": order}
    approved = isinstance(decision, dict) and decision.get("approved") is True
    outcome = (
        f"Your refund of {order.get('total')} was {'approved' if approved else 'not approved'}."
    )
    record = {**order, "refund_approved": approved, "facts": f"{order.get('facts', '')} {outcome}"}
    return {"answer": f"{answer.rstrip()} {outcome}", "source": source, "order": record}
