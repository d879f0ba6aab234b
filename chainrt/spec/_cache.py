"""Values computed from a chain spec once per spec object rather than once per run.

A :class:`~chainrt.spec.ChainSpec` is immutable, and a reused runtime starts many runs of the
same spec object: what depends only on the spec (its stored JSON form, its budget plan, the models
it names) is computed on its first run and kept beside the spec object while that object lives.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from ._models import ChainSpec

__all__ = ["PerSpec"]

T = TypeVar("T")


class PerSpec(Generic[T]):
    """``build(spec)``, computed once per live spec object (by identity, not by content)."""

    def __init__(self, build: Callable[[ChainSpec], T]) -> None:
        self._build = build
        self._values: dict[int, tuple[weakref.ref[ChainSpec], T]] = {}
        self._lock = threading.Lock()

    def get(self, spec: ChainSpec) -> T:
        """The value for ``spec``, built on first use; forgotten when ``spec`` is collected."""
        key = id(spec)
        hit = self._values.get(key)
        if hit is not None and hit[0]() is spec:
            return hit[1]
        value = self._build(spec)
        values, lock = self._values, self._lock

        def forget(ref: weakref.ref[ChainSpec]) -> None:
            with lock:
                if values.get(key, (None,))[0] is ref:
                    del values[key]

        with lock:
            values[key] = (weakref.ref(spec, forget), value)
        return value
