"""Per-hop latency of an answered attempt, from the worker's reported prefill/decode split."""

from __future__ import annotations

from typing import Any

from ._backend import BackendAnswer

__all__ = ["answer_hops"]


def answer_hops(got: BackendAnswer, elapsed_ms: float) -> dict[str, Any]:
    """The attempt record's ``confidence`` and ``hops_ms`` for an answer that took ``elapsed_ms``.

    ``network`` is what the worker's own prefill + decode do not explain: the request and answer
    on the wire and the worker's queue wait and admission (never below 0).
    """
    hops: dict[str, float] | None = None
    if got.prefill_ms is not None and got.decode_ms is not None:
        served = got.prefill_ms + got.decode_ms
        hops = {
            "prefill": round(got.prefill_ms, 3),
            "decode": round(got.decode_ms, 3),
            "network": round(max(0.0, elapsed_ms - served), 3),
        }
    return {"confidence": got.confidence, "hops_ms": hops}
