"""The records the store conformance suite writes, and the factory a store's test provides.

:func:`make_run` and :func:`make_step` exercise every field of a run and a step; they and
:class:`StoreFactory` are public through :mod:`chainrt.testing.store_conformance`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from chainrt._records import (
    AttemptRecord,
    OwnerLease,
    RunProgress,
    RunRecord,
    StepRecord,
)
from chainrt.store._protocol import CheckpointStore

__all__ = [
    "UNICODE",
    "OpenStore",
    "StoreFactory",
    "make_lease",
    "make_progress",
    "make_run",
    "make_step",
]


class StoreFactory(Protocol):
    """Opens a fresh store on the test's shared backing database."""

    def __call__(
        self, *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
    ) -> Awaitable[CheckpointStore]: ...


OpenStore = Callable[..., Awaitable[CheckpointStore]]

UNICODE = "naïve café — 東京 🚀 \u0000-free \\ \"quoted\" 'single'"
"""Text that a store must keep as it is (accents, CJK, emoji, quotes, backslash)."""


def make_run(run_id: str = "run-1", *, token: int = 1, **overrides: Any) -> RunRecord:
    """A run record exercising every field (nested spec, unicode input, owner lease)."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "chain": "support_agent",
        "spec": {
            "name": "support_agent",
            "budget": 8000.0,
            "steps": [{"id": "intent", "weight": 0.2, "llm": {"model": "primary"}}],
        },
        "source": "/srv/chains",
        "input": {"user_id": "u1", "question": UNICODE, "nested": {"list": [1, 2.5, None]}},
        "budget_total_ms": 8000.0,
        "owner": OwnerLease(host="host-a", pid=4242, token=token, expires_at=time.time() + 10),
        "fencing_token": token,
        "trace": {"trace_id": "0af7651916cd43dd8448eb211c80319c", "links": []},
        "waits_ms": {"user:u1": 1.5},
        "created_at": 1_700_000_000.25,
        "updated_at": 1_700_000_000.5,
    }
    fields.update(overrides)
    return RunRecord(**fields)


def make_step(step_id: str = "intent", **overrides: Any) -> StepRecord:
    """A completed step record with a nested, unicode output and an attempt log."""
    fields: dict[str, Any] = {
        "step_id": step_id,
        "status": "completed",
        "output": {"intent": "order_status", "text": UNICODE, "scores": [0.9, 0.1]},
        "attempts": 2,
        "model": "primary",
        "fallback": "local",
        "allotted_ms": 1600.0,
        "elapsed_ms": 420.5,
        "started_at": 1_700_000_001.0,
        "finished_at": 1_700_000_001.4205,
        "attempt_log": [
            AttemptRecord(attempt=1, model="primary", status="timeout", elapsed_ms=300.0),
            AttemptRecord(attempt=2, model="local", status="ok", elapsed_ms=120.5),
        ],
        "waits_ms": {"model:primary": 0.25},
    }
    fields.update(overrides)
    return StepRecord(**fields)


def make_progress(used: float, status: Any = "running", **overrides: Any) -> RunProgress:
    """A run's progress to commit (``running`` unless told)."""
    return RunProgress(status=status, budget_used_ms=used, **overrides)


def make_lease(host: str, token: int = 0) -> OwnerLease:
    """An owner lease of ``host``, valid for 10 s."""
    return OwnerLease(host=host, pid=1000, token=token, expires_at=time.time() + 10)
