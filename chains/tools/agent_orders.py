"""Tools of chains/agent_example.yaml: an agent looks orders up and reads the refund policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_DB = Path(__file__).resolve().parent.parent / "data" / "orders.json"

REFUND_POLICY = "Refunds are possible within 30 days of delivery; the money is back within 5 days."


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its status, item, carrier, delivery date and total.

    Args:
        order_id: The order number, digits only (e.g. "1042").
    """
    orders: dict[str, dict[str, Any]] = json.loads(_DB.read_text(encoding="utf-8"))
    order = orders.get(order_id.strip().lstrip("#"))
    if order is None:
        return {"order_id": order_id, "found": False}
    shown = {k: v for k, v in order.items() if k != "customer"}
    return {"order_id": order_id, "found": True, **shown}


def refund_policy() -> str:
    """The shop's refund policy."""
    return REFUND_POLICY
