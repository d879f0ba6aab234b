"""Owner leases of running runs: who owns a run, whether that owner is alive, taking a run over,
and the heartbeat that keeps a lease alive while its run executes.

A new run is created with its owner lease (:func:`new_lease`). A resume first waits until the
owner is gone (:func:`wait_for_owner`: pid gone on this host, or lease expired), then takes the
run over with the next fencing token (:func:`claim`); from then on the old owner's writes are
refused by the store. While an execution runs, :class:`Heartbeat` renews its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import FencedOut, LeaseReleased, RunLocked, StoreUnavailable
from .._records import OwnerLease, RunRecord
from ..store._protocol import CheckpointStore

__all__ = [
    "Heartbeat",
    "OwnerState",
    "claim",
    "new_lease",
    "owner_state",
    "pid_alive",
    "this_host",
    "wait_for_owner",
]


def this_host() -> str:
    """The name this process's leases carry."""
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # The state follows the parenthesised command name, which may contain spaces.
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


@dataclass(frozen=True, slots=True)
class OwnerState:
    """Whether a run's owner is gone, and if not, for how long its lease still runs."""

    gone: bool
    why: str
    expires_in_s: float = 0.0


def owner_state(
    owner: OwnerLease | None,
    *,
    now: float,
    host: str,
    alive: Callable[[int], bool] = pid_alive,
) -> OwnerState:
    """Decide (purely) whether a run may be taken over from ``owner``."""
    if owner is None:
        return OwnerState(True, "no owner")
    if owner.host == host and owner.pid == os.getpid():
        return OwnerState(
            False, f"owned by this very process (pid {owner.pid})", owner.expires_at - now
        )
    if owner.host == host and not alive(owner.pid):
        return OwnerState(True, f"owner pid {owner.pid} on {host} is gone")
    if owner.expires_at <= now:
        return OwnerState(True, f"owner lease of {owner.host}:{owner.pid} expired")
    return OwnerState(
        False, f"owned by {owner.host}:{owner.pid}, lease valid", owner.expires_at - now
    )


def new_lease(host: str, token: int, ttl_s: float) -> OwnerLease:
    """A lease for this process on ``host`` with fencing ``token``, valid for ``ttl_s``."""
    return OwnerLease(host=host, pid=os.getpid(), token=token, expires_at=time.time() + ttl_s)


async def wait_for_owner(
    store: CheckpointStore, record: RunRecord, *, host: str, ttl_s: float, wait: bool
) -> RunRecord:
    """Return the run's record once its owner is gone (it may then be taken over).

    With ``wait`` this waits for a live owner's lease to expire, re-reading the record, unless
    the lease runs far longer than leases of this process would (then it refuses at once);
    without, a live owner is refused at once. Refusal is :class:`RunLocked`.
    """
    while True:
        state = owner_state(record.owner, now=time.time(), host=host)
        if state.gone:
            return record
        if not wait or state.expires_in_s > ttl_s * 3:
            raise RunLocked(
                f"run {record.run_id} is {state.why} for {state.expires_in_s:.1f}s more; "
                "resume it after the lease expires (or wait for it)"
            )
        await asyncio.sleep(min(max(state.expires_in_s, 0.05), 0.5))
        record = await store.get_run(record.run_id)


async def claim(store: CheckpointStore, record: RunRecord, *, host: str, ttl_s: float) -> int:
    """Take the run over with the next fencing token; return it (FencedOut if someone was first)."""
    token = record.fencing_token + 1
    return await store.claim(record.run_id, record.fencing_token, new_lease(host, token, ttl_s))


class Heartbeat:
    """Renews the owner lease every ``ttl_s / 3`` while a run executes.

    When the store says another process took the run over (FencedOut), ``on_fenced`` is called
    once (the runner cancels its work) and the heartbeat stops. Store outages are tolerated until
    the lease would have expired.

    Between renewals nothing runs: a timer on the loop starts each renewal as its own task. A
    run shorter than ``ttl_s / 3`` therefore never creates a task, and stopping the heartbeat
    does not suspend the run (issue 18: the heartbeat off the step and run paths).
    """

    def __init__(
        self,
        store: CheckpointStore,
        run_id: str,
        token: int,
        ttl_s: float,
        on_fenced: Callable[[], None],
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._token = token
        self._ttl_s = ttl_s
        self._on_fenced = on_fenced
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.fenced = False
        self.why = ""
        """The store's words when it fenced this heartbeat out ('' until then)."""

    def start(self) -> None:
        """Start renewing in the background."""
        self._schedule()

    def _schedule(self) -> None:
        if not self._stopped:
            self._timer = asyncio.get_running_loop().call_later(self._ttl_s / 3, self._due)

    def _due(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(
            self._renew(), name=f"chainrt-heartbeat-{self._run_id}"
        )

    async def _renew(self) -> None:
        try:
            await self._store.renew(self._run_id, self._token, time.time() + self._ttl_s)
        except LeaseReleased:
            # This process's own final commit landed (its reply may still be on the way, or
            # lost in a failover and being retried): the run is not someone else's. Cancelling
            # it now would release it again as `running` over its final status.
            self._stopped = True
            self._task = None
            return
        except FencedOut as exc:
            self.fenced = True
            self.why = str(exc)
            self._on_fenced()
            return
        except StoreUnavailable:
            pass  # tolerated until the lease would have expired: the next renewal tries again
        self._task = None
        self._schedule()

    async def stop(self) -> None:
        """Stop renewing (the final commit releases the lease)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
