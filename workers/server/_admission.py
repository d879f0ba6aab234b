"""Admission control: may this request enter the engine now, later, or never? And in which order?

:func:`decide` is pure (table-tested): it weighs a request's KV-cache need — (prompt tokens +
``max_tokens``) × KV bytes per token — against the engine's memory and the watermark. Memory in
use after admission must stay at or under ``watermark × total``. Three answers:

* :class:`Admit` — go; reserve ``reserve_bytes`` until the request ends.
* :class:`RetryLater` — not now (HTTP 429, ``Retry-After``): the advice names a ``max_tokens``
  that fits now, or, when nothing fits now, the largest that will fit once memory frees up.
* :class:`NeverFits` — not on this worker, whatever happens (HTTP 413).

:class:`AdmissionQueue` bounds how many requests are inside the engine at once; waiters are served
best priority first (``critical`` < ``high`` < ``normal`` < ``low``), first come first served
within a priority. It is leak-proof: a waiter cancelled just as it is handed a slot passes it on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from dataclasses import dataclass

from chainrt.engines import MemoryStats
from chainrt.wire import PRIORITIES

__all__ = [
    "PRIORITIES",
    "AdmissionQueue",
    "Admit",
    "Decision",
    "NeverFits",
    "QueueFull",
    "RetryLater",
    "Slot",
    "capacity_tokens",
    "decide",
]


@dataclass(frozen=True, slots=True)
class Admit:
    """The request fits: it holds ``reserve_bytes`` of KV memory until it ends."""

    reserve_bytes: int


@dataclass(frozen=True, slots=True)
class RetryLater:
    """Not enough free memory now (429): retry after ``retry_after_s`` or ask for less."""

    message: str
    advice_max_tokens: int
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class NeverFits:
    """The request can never fit on this worker (413); ``advice_max_tokens`` would, if set."""

    message: str
    advice_max_tokens: int | None


Decision = Admit | RetryLater | NeverFits


def capacity_tokens(stats: MemoryStats | None, watermark: float) -> int | None:
    """The most tokens (prompt + completion) one request may ever hold; None when unknown.

    ``watermark × total`` KV memory, and no more than ``stats.extra["context_tokens"]``.
    """
    if stats is None or stats.kv_bytes_per_token <= 0:
        return None
    cap = int(stats.total_bytes * watermark) // stats.kv_bytes_per_token
    context = int(stats.extra.get("context_tokens", 0))
    return min(cap, context) if context > 0 else cap


def decide(
    stats: MemoryStats | None,
    *,
    prompt_tokens: int,
    max_tokens: int,
    watermark: float,
    reserved_bytes: int = 0,
    drain_tokens_per_s: float = 50.0,
) -> Decision:
    """Decide on one request from memory figures (pure: no clock, no I/O).

    ``reserved_bytes`` is what requests already admitted hold beyond what ``stats.free_bytes``
    reflects; ``drain_tokens_per_s`` (recent throughput) turns a shortfall into a retry delay.
    ``stats.extra["context_tokens"]`` (when present) caps prompt + completion per request.
    """
    cap = capacity_tokens(stats, watermark)
    if stats is None or cap is None:
        return Admit(0)  # the engine cannot tell: admission is its own business
    per_token = stats.kv_bytes_per_token
    limit_bytes = int(stats.total_bytes * watermark)
    need = prompt_tokens + max_tokens
    if prompt_tokens + 1 > cap:
        return NeverFits(
            f"the prompt has {prompt_tokens} tokens but this worker holds at most {cap} tokens "
            f"per request (prompt + completion, {watermark:.0%} memory watermark); shorten the "
            "prompt or use a model with a larger context",
            None,
        )
    if need > cap:
        return NeverFits(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = {need} tokens can "
            f"never fit: this worker holds at most {cap} tokens per request; ask for "
            f"max_tokens <= {cap - prompt_tokens}",
            cap - prompt_tokens,
        )
    used = stats.total_bytes - stats.free_bytes + reserved_bytes
    room = max(0, (limit_bytes - used) // per_token)
    if need <= room:
        return Admit(need * per_token)
    fits_now = room - prompt_tokens
    advice = fits_now if fits_now >= 1 else min(max_tokens, cap - prompt_tokens)
    wait = min(60.0, max(0.1, (need - room) / max(drain_tokens_per_s, 1e-3)))
    retry_after = math.ceil(wait * 10) / 10
    return RetryLater(
        f"not enough free KV-cache memory for {need} tokens ({need * per_token} bytes) under "
        f"the {watermark:.0%} watermark: {room} tokens fit now; retry after {retry_after}s or "
        f"lower max_tokens to {advice}",
        advice,
        retry_after,
    )


class QueueFull(Exception):
    """The admission queue already holds its maximum of waiting requests."""


class Slot:
    """One place inside the engine; :meth:`release` is idempotent (safe in every ``finally``)."""

    __slots__ = ("_queue", "reserved_bytes")

    def __init__(self, queue: AdmissionQueue) -> None:
        self._queue: AdmissionQueue | None = queue
        self.reserved_bytes = 0
        """KV memory this request holds (set after the memory decision)."""

    def release(self) -> None:
        """Give the place back (to the best waiter, if any)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._give_back(self)


class AdmissionQueue:
    """At most ``slots`` requests in the engine; waiters ordered by (priority, arrival).

    Single event loop: all methods run on the server's loop.
    """

    def __init__(self, slots: int, max_waiting: int) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self._free = slots
        self._waiting = 0
        self._heap: list[tuple[int, int, asyncio.Future[Slot]]] = []
        self._seq = itertools.count()
        self._reserved = 0

    @property
    def depth(self) -> int:
        """Requests waiting for a slot."""
        return self._waiting

    @property
    def in_use(self) -> int:
        """Slots held now."""
        return self.slots - self._free

    @property
    def reserved_bytes(self) -> int:
        """KV memory reserved by the requests holding slots."""
        return self._reserved

    def reserve(self, slot: Slot, nbytes: int) -> None:
        """Record that ``slot``'s request holds ``nbytes`` of KV memory until released."""
        self._reserved += nbytes - slot.reserved_bytes
        slot.reserved_bytes = nbytes

    async def acquire(self, priority: int, max_wait_s: float | None = None) -> Slot:
        """Wait for a slot (QueueFull at once when the queue is full; TimeoutError after
        ``max_wait_s`` seconds)."""
        if self._free > 0:  # invariant: a free slot means nobody is waiting
            self._free -= 1
            return Slot(self)
        if self._waiting >= self.max_waiting:
            raise QueueFull(f"{self._waiting} requests are already waiting for this worker")
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (priority, next(self._seq), future))
        self._waiting += 1
        try:
            return await asyncio.wait_for(future, max_wait_s)
        except BaseException:
            if future.done() and not future.cancelled():
                future.result().release()  # handed a slot we will not use: pass it on
            else:
                future.cancel()  # stays in the heap; _give_back skips it
            raise
        finally:
            self._waiting -= 1

    def _give_back(self, slot: Slot) -> None:
        self._reserved -= slot.reserved_bytes
        slot.reserved_bytes = 0
        while self._heap:
            _, _, future = heapq.heappop(self._heap)
            if not future.done():
                future.set_result(Slot(self))
                return
        self._free += 1
