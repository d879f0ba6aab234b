"""Tools of the approval example (chains/approval_example.yaml): deterministic and local.

The refund is only computed, never paid: the example shows where a run stops for a person.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_DB = Path(__file__).resolve().parent.parent / "data" / "orders.json"


def refund_request(order_id: str) -> dict[str, Any]:
    """The refund an order would get: its total in cents, and whether a person must approve it
    (over 100 EUR)."""
    orders: dict[str, dict[str, Any]] = json.loads(_DB.read_text(encoding="utf-8"))
    order = orders.get(str(order_id))
    if order is None:
        return {"order_id": order_id, "found": False, "cents": 0, "needs_approval": False}
    amount, _, currency = str(order.get("total") or "0 EUR").partition(" ")
    cents = round(float(amount) * 100)
    return {
        "order_id": order_id,
        "found": True,
        "cents": cents,
        "currency": currency,
        "needs_approval": cents > 10_000,
    }


def settle(request: dict[str, Any], decision: dict[str, Any] | None) -> dict[str, Any]:
    """The outcome: refunded when no approval was needed or a person approved it."""
    if not request.get("found"):
        return {"refunded": False, "why": f"no order {request.get('order_id')}"}
    if request.get("needs_approval") and not (decision or {}).get("approved"):
        note = (decision or {}).get("note") or "not approved"
        return {"refunded": False, "why": note}
    return {"refunded": True, "cents": request["cents"], "currency": request["currency"]}
