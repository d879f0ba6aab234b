"""Per-hop latency of an answered attempt, from the worker's reported prefill/decode split."""

from __future__ import annotations

import math
from typing import Any

from ._backend import BackendAnswer

__all__ = ["answer_hops", "extensions"]


def answer_hops(got: BackendAnswer, elapsed_ms: float) -> dict[str, Any]:
    """The attempt record's ``confidence`` and ``hops_ms`` for an answer that took ``elapsed_ms``.

    ``queue`` and ``admission`` are the worker's wait for an engine slot and its memory admission
    (absent for the in-process model, which has neither), ``prefill`` and ``decode`` the
    engine's; ``network`` is what those do not explain: the request and answer on the wire,
    parsing, and the runner's own overhead (never below 0).
    """
    hops: dict[str, float] | None = None
    if got.prefill_ms is not None and got.decode_ms is not None:
        hops = {}
        for name, ms in (
            ("queue", got.queue_ms),
            ("admission", got.admission_ms),
            ("prefill", got.prefill_ms),
            ("decode", got.decode_ms),
        ):
            if ms is not None:
                hops[name] = round(ms, 3)
        hops["network"] = round(max(0.0, elapsed_ms - sum(hops.values())), 3)
    return {"confidence": got.confidence, "hops_ms": hops}


def extensions(body: dict[str, Any]) -> dict[str, float | None]:
    """chainrt's extension fields of a worker's answer (``confidence_score``, ``timings``);
    a field that is absent or not a finite number in range is None."""
    timings = body.get("timings")
    if not isinstance(timings, dict):
        timings = {}
    return {
        "confidence": _number(body.get("confidence_score"), 1.0),
        "prefill_ms": _number(timings.get("prefill_ms"), math.inf),
        "decode_ms": _number(timings.get("decode_ms"), math.inf),
        "queue_ms": _number(timings.get("queue_ms"), math.inf),
        "admission_ms": _number(timings.get("admission_ms"), math.inf),
    }


def _number(value: object, top: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number <= top and math.isfinite(number) else None
