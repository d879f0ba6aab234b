"""Tools of the agent test chains. Calls are logged to the file named by CHAINRT_TEST_LOG."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


def _log(name: str, **extra: Any) -> None:
    path = os.environ.get("CHAINRT_TEST_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tool": name, "pid": os.getpid(), "t": time.time(), **extra}))
            fh.write("\n")


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up by its id.

    Args:
        order_id: The order's id, e.g. A12.
    """
    _log("lookup_order", order_id=order_id)
    return {"order_id": order_id, "status": "shipped", "total": 40}


async def refund_policy(days: int = 30) -> str:
    """The refund policy.

    :param days: How many days after delivery a refund is allowed.
    """
    _log("refund_policy")
    await asyncio.sleep(0)
    return f"refunds within {days} days"


class Refund(BaseModel):
    """A refund to issue."""

    order_id: str
    amount: float = Field(gt=0, description="Amount in EUR.")


class Refunded(BaseModel):
    """What a refund did."""

    refunded: float
    order_id: str


def issue_refund(refund: Refund, ctx: Any) -> Refunded:
    """Issue a refund (a side effect: once per call, keyed by ctx.idempotency_key)."""
    _log("issue_refund", key=ctx.idempotency_key, attempt=ctx.attempt)
    marker = os.environ.get("CHAINRT_TEST_KILL_AT")
    if marker and not Path(marker).exists():
        Path(marker).write_text(ctx.idempotency_key)
        time.sleep(60)  # killed here (kill -9) by the test
    return Refunded(refunded=refund.amount, order_id=refund.order_id)


def broken(reason: str) -> str:
    """A tool that always raises."""
    _log("broken")
    raise RuntimeError(f"broken tool: {reason}")


async def slow(ms: float) -> str:
    """Sleep ``ms`` milliseconds."""
    started = time.time()
    await asyncio.sleep(ms / 1000)
    _log("slow", ms=ms, started=started, ended=time.time())
    return "slept"


def unstorable() -> str:
    """Return text the store cannot hold (a lone surrogate)."""
    _log("unstorable")
    return "bad \ud800 text"
