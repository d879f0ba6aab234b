"""A chain spec's stored form, computed once per spec object rather than once per run.

Every run record carries its chain's normalised spec (``model_dump(mode="json")``), so that a
resume anywhere needs nothing else. A reused runtime starts many runs of the same
:class:`~chainrt.spec.ChainSpec` (an immutable model): dumping it for each run was a fixed
~0.1-0.2 ms of set-up per run, and serialising the dump inside each run record (most of the
record: ~23 KB for 60 steps) another ~0.15 ms. Both are kept while the spec object lives
(:class:`~chainrt.spec._cache.PerSpec`). Callers treat the returned dict as read-only (the run
record's own validation copies its top level; nothing in chainrt mutates a record's spec).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from ._cache import PerSpec
from ._models import ChainSpec

__all__ = ["spec_dump", "spec_json"]

_JSON: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def _dump(spec: ChainSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", by_alias=True)


def _json(spec: ChainSpec) -> bytes:
    data: bytes = _JSON.dump_json(spec_dump(spec))
    return data


_dumps: PerSpec[dict[str, Any]] = PerSpec(_dump)
_jsons: PerSpec[bytes] = PerSpec(_json)


def spec_dump(spec: ChainSpec) -> dict[str, Any]:
    """``spec.model_dump(mode="json", by_alias=True)``, cached for as long as ``spec`` lives."""
    return _dumps.get(spec)


def spec_json(spec: ChainSpec) -> bytes:
    """:func:`spec_dump` serialised as a record's ``dict[str, Any]`` field serialises it (the
    bytes :meth:`~chainrt._records.RunRecord.attach_spec_json` takes), cached likewise."""
    return _jsons.get(spec)
