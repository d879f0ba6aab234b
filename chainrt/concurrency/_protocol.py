"""The limiter protocol behind semantic concurrency keys (docs/concurrency.md).

A :class:`Limiter` hands out slots of named keys. Every implementation keeps these promises, and
``chainrt.testing.limiter_conformance`` checks them:

* at most ``limit`` holders per key at any moment (across processes, for the Redis limiter);
* waiters are served first come, first served per key (strictly in order for ``limit: 1``);
* several keys are taken one by one in sorted key order, so two holders can never deadlock;
* a timeout, an error or a cancellation at any await point leaves nothing held and no ticket queued;
* ``Holding.release()`` is idempotent and completes even if its caller is cancelled.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from .._errors import ConcurrencyError

__all__ = ["Holding", "KeyRequest", "KeyState", "Limiter"]

MAX_KEY_LENGTH = 1024
"""Longest rendered key accepted (a longer one is almost surely a template rendering a blob)."""


@dataclass(frozen=True, slots=True)
class KeyRequest:
    """One rendered key to take: at most ``limit`` holders, and optionally a rate.

    ``rate_per_s`` limits how often the key is *taken* (GCRA: one acquisition every
    ``1/rate_per_s`` seconds, up to ``burst`` at once after a quiet spell). Invalid values raise
    :class:`chainrt.ConcurrencyError` at construction.
    """

    key: str
    limit: int
    rate_per_s: float | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ConcurrencyError(
                f"a concurrency key rendered to {self.key!r}; a key must be a non-empty string "
                "(check the template and the input it reads)"
            )
        if len(self.key) > MAX_KEY_LENGTH:
            raise ConcurrencyError(
                f"concurrency key {self.key[:60]!r}... is {len(self.key)} characters long, "
                f"over the {MAX_KEY_LENGTH} allowed; render a shorter key (an id, not a document)"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConcurrencyError(
                f"concurrency key {self.key!r}: limit must be >= 1, got {self.limit!r}"
            )
        if self.rate_per_s is not None and not (
            math.isfinite(self.rate_per_s) and self.rate_per_s > 0
        ):
            raise ConcurrencyError(
                f"concurrency key {self.key!r}: rate must be a positive number per second, "
                f"got {self.rate_per_s!r}"
            )
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConcurrencyError(
                f"concurrency key {self.key!r}: burst must be >= 1, got {self.burst!r}"
            )


@dataclass(frozen=True, slots=True)
class KeyState:
    """What a limiter knows about one key right now (for ``inspect``, metrics and tests)."""

    key: str
    holders: tuple[str, ...]
    """Holder names (as passed to ``acquire``) whose slot is live."""
    waiting: tuple[str, ...]
    """Holder names with a live ticket, first in line first."""


@dataclass(slots=True)
class Holding(abc.ABC):
    """Keys held by one holder. Release is idempotent and shielded from cancellation."""

    holder: str
    keys: tuple[str, ...]
    waits_ms: dict[str, float] = field(default_factory=dict)
    """Milliseconds waited for each key (in the order taken)."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give every key back (safe to call twice; survives cancellation of the caller)."""

    async def release_unconfirmed(self) -> None:
        """Give every key back, returning as soon as the release is on its way where the
        limiter can tell it apart from its arrival (the Redis limiter on one node: the release
        is sent, ahead of anything the same limiter sends afterwards, and its reply is checked in
        the background; :meth:`Limiter.close` waits for it). Another process may still see the
        keys held for up to one round trip. Other limiters: :meth:`release`. The runner gives a
        step's keys back this way; use :meth:`release` where the keys must be free, as every
        client sees them, when the call returns."""
        await self.release()

    async def __aenter__(self) -> Holding:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


class Limiter(abc.ABC):
    """Hands out slots of concurrency keys, first come first served per key."""

    @abc.abstractmethod
    async def acquire(
        self, requests: Sequence[KeyRequest], *, timeout_s: float, holder: str
    ) -> Holding:
        """Take every key (in canonical, sorted order) within ``timeout_s`` seconds.

        Raises :class:`chainrt.ConcurrencyRejected` naming the key it could not get and how long it
        waited; then nothing is held and no ticket is left queued. Cancellation likewise leaves
        nothing behind. An empty ``requests`` returns an empty holding at once. ``timeout_s <= 0``
        grants only a slot that is free right now. The same key twice in one call is a
        :class:`chainrt.ConcurrencyError`.
        """

    @abc.abstractmethod
    async def snapshot(self, key: str) -> KeyState:
        """The live holders and waiters of ``key`` (read-only; empty for an unknown key)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and stop lease renewal tasks."""
