"""The in-process limiter of the embedded (SQLite, no Redis) mode: limits hold within one process.

Same rules as the Redis limiter, on plain dicts under one lock: a key's waiters form a FIFO line;
the first ``limit - holders`` tickets may take a slot (only the first one when the key has a rate,
so the rate is handed out in line order too); whoever frees a slot wakes the tickets now in reach.
The lock (not the event loop) guards the state because one instance serves every event loop of
the process: sync entry points run their own loops in threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ._driver import GRANTED, Attempt, BaseLimiter, holder_of
from ._protocol import KeyRequest, KeyState
from ._wake import Wake

__all__ = ["LocalLimiter"]

_SWEEP_EVERY = 1024
"""Forget calls between two sweeps of idle key states (rate-limited keys linger until then)."""


class _Key:
    """State of one key: holders, the line of waiters, and the rate's theoretical arrival time."""

    __slots__ = ("holders", "queue", "tat")

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}  # member -> holder name
        self.queue: dict[str, Wake] = {}  # member -> its wake-up; dicts keep insertion order
        self.tat = 0.0  # GCRA theoretical arrival time (time.monotonic seconds)

    def idle(self, now: float) -> bool:
        return not self.holders and not self.queue and self.tat <= now


class LocalLimiter(BaseLimiter):
    """Concurrency keys within one process (asyncio, any number of event loops and threads).

    Holders are not leased: when the process dies, its slots die with it. ``close()`` is a no-op
    so that one shared instance can serve every chain of the process.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._keys: dict[str, _Key] = {}
        self._forgets = 0

    async def _try(self, req: KeyRequest, member: str, wake: Wake) -> Attempt:
        with self._lock:
            return self._try_locked(req, member, wake)

    def _try_locked(self, req: KeyRequest, member: str, wake: Wake) -> Attempt:
        st = self._keys.get(req.key)
        if st is None:
            st = self._keys[req.key] = _Key()
        if member in st.holders:
            return GRANTED
        free = req.limit - len(st.holders)
        queued = member in st.queue
        ahead = _rank(st.queue, member) if queued else len(st.queue)
        retry_in: float | None = None
        grant = False
        if ahead < free:
            if req.rate_per_s is None:
                grant = True
            elif ahead == 0:
                now = time.monotonic()
                interval = 1.0 / req.rate_per_s
                tat = max(st.tat, now)
                allow_at = tat - (req.burst - 1) * interval
                if allow_at <= now:
                    st.tat = tat + interval
                    grant = True
                else:
                    retry_in = allow_at - now
        if grant:
            st.holders[member] = holder_of(member)
            if queued:
                del st.queue[member]
                if req.rate_per_s is not None:
                    _wake_next(st, req)  # the new head learns its rate wait
            return GRANTED
        if not queued:
            st.queue[member] = wake
        return Attempt(
            granted=False,
            retry_in_s=retry_in,
            rate_limited=retry_in is not None,
            ahead=ahead,
            holders=len(st.holders),
        )

    async def _forget(self, requests: Sequence[KeyRequest], member: str, *, undo: bool) -> None:
        # No await in here: a cancellation cannot cut it short, and no try can be in flight.
        now = time.monotonic()
        with self._lock:
            for req in requests:
                st = self._keys.get(req.key)
                if st is None:
                    continue
                held = st.holders.pop(member, None) is not None
                queued = st.queue.pop(member, None) is not None
                if held or queued:
                    _wake_next(st, req)
                if st.idle(now):
                    del self._keys[req.key]
            self._forgets += 1
            if self._forgets % _SWEEP_EVERY == 0:
                for key in [k for k, s in self._keys.items() if s.idle(now)]:
                    del self._keys[key]

    async def snapshot(self, key: str) -> KeyState:
        """Holders and waiters of ``key`` in this process."""
        with self._lock:
            st = self._keys.get(key)
            if st is None:
                return KeyState(key, (), ())
            return KeyState(key, tuple(st.holders.values()), tuple(holder_of(m) for m in st.queue))

    async def close(self) -> None:
        """Nothing to close: holdings stay valid until released."""


def _rank(queue: dict[str, Wake], member: str) -> int:
    for i, m in enumerate(queue):
        if m == member:
            return i
    raise AssertionError("member is not queued")  # callers check membership first


def _wake_next(st: _Key, req: KeyRequest) -> None:
    """Wake the tickets that may now take a slot (just the head when the key has a rate)."""
    n = min(req.limit - len(st.holders), len(st.queue))
    if req.rate_per_s is not None:
        n = min(n, 1)
    for i, wake in enumerate(st.queue.values()):
        if i >= n:
            break
        wake.set()
