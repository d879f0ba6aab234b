"""The acquire loop both limiters share: canonical order, waiting, deadline, cleanup on failure.

A backend supplies three primitives — ``_try`` (take the key or keep my place in line),
``_forget`` (drop my slot and my ticket, wake whoever is next) and optionally ``_before_wait`` —
and this module turns them into the :class:`Limiter` contract. Nothing here does I/O itself.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import math
import os
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConcurrencyError, ConcurrencyRejected
from ._protocol import Holding, KeyRequest, Limiter
from ._wake import Wake

__all__ = ["GRANTED", "Attempt", "BaseLimiter", "canonical_order", "holder_of"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """The answer of one try at a key."""

    granted: bool
    retry_in_s: float | None = None
    """Look again after this long even without a wake-up (None: only when woken)."""
    rate_limited: bool = False
    """``retry_in_s`` is exactly when the key's rate limit lets the next acquisition through."""
    ahead: int = 0
    """Tickets in line before this one."""
    holders: int = 0
    """Live holders of the key seen by this try."""


GRANTED = Attempt(granted=True)


def canonical_order(requests: Sequence[KeyRequest]) -> list[KeyRequest]:
    """Requests sorted by key (the one order every holder takes keys in: no deadlock)."""
    if isinstance(requests, list | tuple) and len(requests) == 1:  # the common case
        (req,) = requests
        if not isinstance(req, KeyRequest):
            raise ConcurrencyError(f"acquire() takes KeyRequest objects, got {req!r}")
        return [req]
    reqs = sorted(requests, key=lambda r: r.key)
    for req in reqs:
        if not isinstance(req, KeyRequest):
            raise ConcurrencyError(f"acquire() takes KeyRequest objects, got {req!r}")
    for a, b in itertools.pairwise(reqs):
        if a.key == b.key:
            raise ConcurrencyError(
                f"concurrency key {a.key!r} is requested twice in one acquire(); "
                "two templates render to the same key — make them distinct or drop one"
            )
    return reqs


def holder_of(member: str) -> str:
    """The holder name inside a member id ``"<instance>:<n>:<holder>"``."""
    return member.split(":", 2)[-1]


class _Holding(Holding):
    """The holding both limiters return: release runs once, to the end, whoever cancels whom."""

    __slots__ = ("_limiter", "_member", "_released", "_requests", "_task")

    def __init__(
        self,
        limiter: BaseLimiter,
        holder: str,
        requests: list[KeyRequest],
        member: str,
        waits_ms: dict[str, float],
    ) -> None:
        Holding.__init__(self, holder, tuple([r.key for r in requests]), waits_ms)
        self._limiter = limiter
        self._requests = requests
        self._member = member
        self._released = not requests
        self._task: asyncio.Future[None] | None = None

    async def release(self) -> None:
        """Give every key back; idempotent, and it finishes even if the caller is cancelled."""
        if self._task is not None:  # a release cut short by a cancellation is finishing
            await asyncio.shield(self._task)
            return
        if self._released:
            return
        self._released = True
        try:
            # No task of its own on this hot path: an await is cheaper than a loop round trip.
            await self._limiter._forget(self._requests, self._member, undo=False)
        except asyncio.CancelledError:
            # Cancelled midway: finish in a task the caller's cancellation cannot reach (giving
            # a key back twice is harmless), and let the cancellation through once it is done.
            self._task = self._limiter._spawn(
                self._limiter._forget(self._requests, self._member, undo=False)
            )
            await asyncio.shield(self._task)
            raise

    async def release_unconfirmed(self) -> None:
        """Give every key back without waiting for the store to confirm it where the limiter
        can (see :meth:`Holding.release_unconfirmed`); otherwise the same as :meth:`release`."""
        if (
            self._task is None
            and not self._released
            and self._limiter._forget_unconfirmed(self._requests, self._member)
        ):
            self._released = True
            return
        await self.release()


class BaseLimiter(Limiter):
    """Implements :meth:`acquire` on top of a backend's ``_try`` / ``_forget`` primitives."""

    poll_s: float = math.inf
    """Longest sleep between two tries of a waiter (a safety net for lost wake-ups)."""

    def __init__(self) -> None:
        # The instance id starts every member id: wake-ups are addressed to it, and the holder
        # name that follows keeps the stored state readable for operators.
        self._iid = os.urandom(8).hex()
        self._seq = itertools.count(1)
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False

    # ------------------------------------------------------------------ backend primitives

    @abc.abstractmethod
    async def _try(self, req: KeyRequest, member: str, wake: Wake) -> Attempt:
        """Take ``req.key`` for ``member`` if it is its turn, else keep (or take) its ticket."""

    @abc.abstractmethod
    async def _forget(self, requests: Sequence[KeyRequest], member: str, *, undo: bool) -> None:
        """Remove ``member``'s slot and ticket from every key and wake the next waiters.

        Idempotent. ``undo``: the acquisition is being abandoned (timeout, error, cancellation),
        so a try for ``member`` still on its way must not take a slot after this. Must not raise
        anything but a cancellation: a failure is logged (a Redis lease then lapses by itself).
        """

    def _forget_unconfirmed(self, requests: Sequence[KeyRequest], member: str) -> bool:
        """Send what gives ``member``'s keys back without waiting for it to land, ahead of
        anything this limiter sends afterwards; False when the backend cannot (then
        :meth:`_forget` is awaited instead). Failures are the backend's to retry or log."""
        return False

    async def _before_wait(self) -> bool:
        """Prepare for a first sleep; True means "look again before sleeping"."""
        return False

    def _register(self, member: str, wake: Wake) -> None:
        """Route wake-ups addressed to ``member`` to ``wake`` (hook)."""

    def _unregister(self, member: str) -> None:
        """Stop routing wake-ups to ``member`` (hook)."""

    # ------------------------------------------------------------------ the contract

    async def acquire(
        self, requests: Sequence[KeyRequest], *, timeout_s: float, holder: str
    ) -> Holding:
        """Take every key in sorted order within ``timeout_s``; see :meth:`Limiter.acquire`."""
        if self._closed:
            raise ConcurrencyError("this limiter is closed; open a new one")
        if not isinstance(holder, str) or not holder:
            raise ConcurrencyError(f"acquire() needs a non-empty holder name, got {holder!r}")
        reqs = canonical_order(requests)
        if not reqs:
            return _Holding(self, holder, [], "", {})
        loop = asyncio.get_running_loop()
        budget_s = timeout_s if timeout_s > 0 else 0.0  # NaN and negatives: only a free slot
        t0 = loop.time()
        deadline = t0 + budget_s
        member = f"{self._iid}:{next(self._seq)}:{holder}"
        wake = Wake(loop)
        self._register(member, wake)
        tried: list[KeyRequest] = []
        waits: dict[str, float] = {}
        try:
            for req in reqs:
                tried.append(req)
                wake.clear()  # wake-ups from before this look at the state are stale
                # The first try is awaited right here (the common case: granted at once);
                # only a key not granted goes into the waiting loop.
                attempt = await self._try(req, member, wake)
                if not attempt.granted:
                    await self._wait(req, member, wake, deadline, budget_s, attempt, t0)
                now = loop.time()
                waits[req.key] = round((now - t0) * 1000, 3)
                t0 = now
        except BaseException:
            # Timeout, error or cancellation: undo every key tried, granted or queued. The undo
            # runs in its own task so that a second cancellation cannot leave it half done.
            await asyncio.shield(self._spawn(self._forget(tried, member, undo=True)))
            raise
        finally:
            self._unregister(member)
        return _Holding(self, holder, reqs, member, waits)

    async def _wait(
        self,
        req: KeyRequest,
        member: str,
        wake: Wake,
        deadline: float,
        budget_s: float,
        attempt: Attempt,
        t0: float,
    ) -> None:
        """Wait for ``req`` after ``attempt`` (not granted): sleep until woken or until the
        attempt's hint, look again, until granted or past ``deadline``."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            remaining = deadline - now
            retry_in = math.inf if attempt.retry_in_s is None else max(attempt.retry_in_s, 0.0)
            # (a timer may fire a hair early: a millisecond left is no time left)
            if remaining <= 0.001 or (attempt.rate_limited and retry_in > remaining):
                raise _rejection(req, attempt, (now - t0) * 1000, budget_s)
            if not await self._before_wait():
                await wake.wait(min(remaining, self.poll_s, retry_in))
            wake.clear()  # wake-ups from before this look at the state are stale
            attempt = await self._try(req, member, wake)
            if attempt.granted:
                return

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        # asyncio keeps only weak references to tasks: hold them until they finish.
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


def _rejection(
    req: KeyRequest, attempt: Attempt, waited_ms: float, budget_s: float
) -> ConcurrencyRejected:
    if attempt.rate_limited and attempt.retry_in_s is not None:
        why = (
            f"its rate limit of {req.rate_per_s:g}/s lets the next one through in "
            f"{attempt.retry_in_s * 1000:.0f} ms"
        )
    else:
        why = f"{attempt.holders} of {req.limit} slots held, {attempt.ahead} waiting ahead"
    return ConcurrencyRejected(
        f"concurrency key {req.key!r} could not be taken within the {budget_s * 1000:.0f} ms "
        f"the budget left (waited {waited_ms:.0f} ms; {why}); give the run more budget, "
        "raise the key's limit, or retry later",
        key=req.key,
        waited_ms=round(waited_ms, 3),
    )
