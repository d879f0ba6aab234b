"""The spec of a stored run, validated once per spec rather than once per run.

Starting a run from its record (a run submitted to ``chainrt serve``, a resume) validates the
record's normalised spec again (:func:`~chainrt.spec.spec_from_dict`: ~0.13-0.5 ms a run on a
2-core machine, a tenth of what a served no-op run costs in all). A chain's runs carry the same
spec; a record whose spec came with its JSON (:meth:`~chainrt._records.RunRecord.spec_json`: a
record built by a submit in this process) is looked up by that JSON: the same bytes validate to
the same spec, and a :class:`~chainrt.spec.ChainSpec` is frozen, so one serves every such run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from ._loader import spec_from_dict
from ._models import ChainSpec

if TYPE_CHECKING:
    from .._records import RunRecord

__all__ = ["MAX_KEPT", "stored_spec"]

MAX_KEPT = 64
"""Specs kept (the least recently used goes first)."""

_kept: OrderedDict[bytes, ChainSpec] = OrderedDict()
_lock = threading.Lock()


def stored_spec(record: RunRecord) -> ChainSpec:
    """The chain spec ``record`` holds, validated (ChainSpecError as :func:`spec_from_dict`)."""
    data = record.spec_json()
    if data is not None:
        with _lock:
            hit = _kept.get(data)
            if hit is not None:
                _kept.move_to_end(data)
                return hit
    spec = spec_from_dict(record.spec, file=f"<stored spec of run {record.run_id}>")
    if data is not None:
        with _lock:
            _kept[data] = spec
            while len(_kept) > MAX_KEPT:
                _kept.popitem(last=False)
    return spec
