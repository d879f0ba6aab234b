"""``models.<name>`` in ``when`` and ``switch``: the dispatcher's live view of a model.

``p50_ms`` and ``p99_ms`` are the recent answer times the dispatcher keeps for the model (the
same window its reserve and hedging read; ``null`` until it has enough answers), ``healthy``
whether the model has an endpoint to try now (its breakers and health checks allow one). The
view is read when the expression is evaluated, never stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..dispatch import Dispatcher

__all__ = ["ModelsView", "model_view"]


def model_view(dispatcher: Dispatcher, name: str, now: float | None = None) -> dict[str, Any]:
    """``{p50_ms, p99_ms, healthy}`` of model ``name`` as the dispatcher sees it now."""
    at = time.monotonic() if now is None else now
    p50 = dispatcher.latency.p50(name, at)
    p99 = dispatcher.latency.seconds_quantile(name, at, 0.99)
    backend = dispatcher.backend(name)
    return {
        "p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "p99_ms": None if p99 is None else round(p99 * 1000, 3),
        "healthy": backend is not None and backend.available(),
    }


class ModelsView(Mapping[str, dict[str, Any]]):
    """A read-only mapping: model name -> :func:`model_view` (computed on each read)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    def __getitem__(self, name: str) -> dict[str, Any]:
        if not isinstance(name, str):
            raise KeyError(name)
        return model_view(self._dispatcher, name)

    def get(self, name: str, default: Any = None) -> Any:
        """Every name has a view (an unknown model: no figures, not healthy)."""
        return self[name] if isinstance(name, str) else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._dispatcher.models)

    def __len__(self) -> int:
        return len(self._dispatcher.models)
