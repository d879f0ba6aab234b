"""Order look-up for the support agent, over the small order database in ``data/orders.json``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_DB = Path(__file__).resolve().parent.parent / "data" / "orders.json"
_ORDER_ID = re.compile(r"\b(\d{3,8})\b")

REFUND_POLICY = "Refunds are possible within 30 days of delivery; the money is back within 5 days."


def _load() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(_DB.read_text(encoding="utf-8"))
    return data


def _order_id(question: str, intent: Any) -> str | None:
    """The order id: from the parsed intent if the model found one, else from the question."""
    if isinstance(intent, dict):
        candidate = intent.get("order_id")
        if isinstance(candidate, int | str) and str(candidate).isdigit():
            return str(candidate)
    match = _ORDER_ID.search(question)
    return match.group(1) if match else None


def lookup_order(question: str, intent: Any = None, selection: Any = None) -> dict[str, Any]:
    """Find the order the question is about; small models make mistakes, so the question's own
    digits back up the parsed intent. Returns a JSON-ready record."""
    wants_refund = "refund" in question.lower() or (
        isinstance(intent, dict) and intent.get("intent") == "refund"
    )
    order_id = _order_id(question, intent)
    record: dict[str, Any] = {"order_id": order_id, "tool": str(selection or "").strip()[:40]}
    if order_id is None:
        record["found"] = False
        record["note"] = "no order number in the question"
    else:
        order = _load().get(order_id)
        record["found"] = order is not None
        if order is not None:
            record.update({k: v for k, v in order.items() if k != "customer"})
        else:
            record["note"] = f"no order {order_id}"
    if wants_refund:
        record["refund_policy"] = REFUND_POLICY
    record["facts"] = _facts(record)
    return record


_STATUS = {
    "delivered": "was delivered",
    "processing": "is being prepared",
    "shipped": "has shipped",
    "cancelled": "was cancelled",
    "out_for_delivery": "is out for delivery",
    "returned": "was returned",
}


def _facts(record: dict[str, Any]) -> str:
    """The record in one plain sentence or two: small models paraphrase prose better than JSON."""
    if not record.get("found"):
        text = f"We could not find an order: {record.get('note', 'unknown order')}."
    else:
        text = f"Order {record['order_id']} ({record.get('item')}) {_STATUS.get(record.get('status', ''), record.get('status'))}"
        if record.get("carrier"):
            text += f" with {record['carrier']}"
        if record.get("eta") and record.get("status") not in ("delivered", "cancelled", "returned"):
            text += f" and should arrive on {record['eta']}"
        text += "."
    if record.get("refund_policy"):
        text += " " + REFUND_POLICY
    return text
