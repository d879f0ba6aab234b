"""The run index on a Redis Cluster: written beside the run's creation, repaired after a crash.

On one Redis node the ``create`` script adds the run to the index (``chainrt:runs``) in the same
round trip. On a cluster the index lives in a slot of its own, which a run's script may not
touch. ``create_run`` sends both at once, so a run's creation costs one round trip as on one node:

- the ``create_run`` script to the run's master, which writes the run and adds its id to the
  ``unindexed`` set of the run's own slot (``StoreKeys.unindexed``), atomically;
- ``ZADD NX`` of the index entry to the index's master (:meth:`ClusterIndex._index_add`).

``create_run`` returns once both are acknowledged, and the run's first commit takes its id out of
the set; a run created without an owner (queued for a runner in another process, as ``chainrt
serve`` creates them) is taken out by an ``SREM`` as soon as both are acknowledged, since no
commit of this process will come. A process killed between the two writes, or an index master that stayed down past the
retry window, leaves the id in the set: :meth:`ClusterIndex._repair_index`, which ``list_runs``
runs (at most once a minute per store, and on its first call), reads every slot's set and puts
back into the index each run that still exists. A run is therefore never lost from the listing
for good: the set is written in the same script as the run.

A change of status (a claim, a commit to another status than ``running``) marks the run in its
slot's set the same way, atomically with the change, until the status sets have moved it
(``_redis_lists``); the repair puts every run it finds marked into the sets of the status it
has.

The ``ZADD`` may reach the index before the script reaches the run (two masters, no order): an
index entry whose run is missing is dropped (by the listing, by the sweep of expired runs) only
when it is over :data:`INDEX_GRACE_S` old and its run is not in its slot's ``unindexed`` set,
checked after the run was found missing (:meth:`ClusterIndex._stale_for_good`).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from redis import exceptions as rx
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .._errors import CheckpointError
from ..redis import LOST, pack
from ..redis.keys import StoreKeys
from ._redis_client import RedisConnection
from ._scripts import RunFields

__all__ = ["FIRST_COMMIT_MAX", "INDEX_GRACE_S", "ClusterIndex"]

logger = logging.getLogger("chainrt.store")

INDEX_GRACE_S = 60.0
"""How old an index entry without its run must be before the listing drops it (an entry written
just before its run's script ran is younger; a creation gives up long before this)."""


FIRST_COMMIT_MAX = 65_536
"""How many runs a store remembers as created here and not yet committed (their first commit
empties their slot's ``unindexed`` entry); past that the oldest is forgotten, and the repair
empties its entry instead. Bounds a process that creates runs it never commits."""


class ClusterIndex(RedisConnection):
    """The cluster side of the run index, for ``RedisStore`` (see the module)."""

    keys: StoreKeys
    _creating: set[str]
    """Runs this store is creating right now: their index entry may be there before their run."""

    async def _index_add(self, run_id: str, created_at: float) -> None:
        """The run's index entry (``ZADD NX``: a creation sent again keeps the first score)."""
        index = self.keys.index
        command = pack("ZADD", index, "NX", repr(created_at), run_id)
        done, _ = await self._on_master(index, command)
        if not done:
            score = {run_id: created_at}
            await self._call(lambda: self._client.zadd(index, score, nx=True), key=index)

    async def _restored(self, ids: list[bytes]) -> None:
        """Runs the repair found marked in their slot's ``unindexed`` set and still there
        (their index entry is now written; the store's other indexes hook in here)."""

    async def _unindex(self, run_id: str, unindexed: str) -> None:
        """Take a run whose index entry is acknowledged out of its slot's ``unindexed`` set
        (``SREM``). Best effort: an entry left there is emptied by the next repair."""
        command = pack("SREM", unindexed, run_id)
        try:
            done, _ = await self._on_master(unindexed, command)
            if not done:
                await self._call(lambda: self._client.srem(unindexed, run_id), key=unindexed)
        except CheckpointError as exc:  # StoreUnavailable included
            logger.info("run %s stays in %s until the index repair: %s", run_id, unindexed, exc)

    async def _stale_for_good(self, ids: list[bytes]) -> list[bytes]:
        """Of index entries whose run was just found missing, those that may go: over
        ``INDEX_GRACE_S`` old, not being created by this store, and not in their slot's
        ``unindexed`` set. A run in that set is being created (its index entry got there first)
        or was cut short (the repair keeps it). The age is the run's ``created_at``, which a
        caller may set in the past (an import, a test): a run this store is creating right now
        may have an old entry and no run yet, and not be in its set yet either."""
        index = self.keys.index
        scores = await self._call(lambda: self._client.zmscore(index, ids), key=index)
        old = time.time() - INDEX_GRACE_S
        creating = self._creating
        aged = [
            rid
            for rid, score in zip(ids, scores, strict=True)
            if (score is None or score < old) and rid.decode(errors="replace") not in creating
        ]

        async def members() -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for rid in aged:
                    run_key = self.keys.run(rid.decode(errors="replace")).encode()
                    pipe.sismember(self.keys.unindexed(key_slot(run_key)), rid)
                result: list[Any] = await pipe.execute()
                return result

        being_created = await self._call(members) if aged else []
        return [rid for rid, member in zip(aged, being_created, strict=True) if not member]

    async def _repair_index(self) -> int:
        """Put back into the index every run listed in an ``unindexed`` set that still exists,
        then empty those sets; the number of runs put back."""
        found = await self._unindexed_members()
        if not found:
            return 0
        ids = sorted({run_id for members in found.values() for run_id in members})
        index = self.keys.index
        scores = await self._call(lambda: self._client.zmscore(index, ids), key=index)
        missing = [rid for rid, score in zip(ids, scores, strict=True) if score is None]

        async def created_at() -> list[Any]:  # one pipelined HGET per run, by master
            async with self._client.pipeline(transaction=False) as pipe:
                for rid in missing:
                    pipe.hget(self.keys.run(rid.decode(errors="replace")), RunFields.CREATED_AT)
                result: list[Any] = await pipe.execute()
                return result

        created = await self._call(created_at) if missing else []
        restored: dict[bytes, float] = {
            rid: float(at)
            for rid, at in zip(missing, created, strict=True)
            if at is not None  # a run that expired or was deleted needs no entry
        }
        if restored:
            await self._call(lambda: self._client.zadd(index, restored, nx=True), key=index)
            logger.warning(
                "the run index missed %d run(s) of a creation cut short; put them back: %s",
                len(restored),
                ", ".join(sorted(r.decode(errors="replace") for r in restored)),
            )
        # Every run still there, those indexed before included: one marked by a change of
        # status whose move between the other indexes was cut short gets them now.
        gone = set(missing) - set(restored)
        await self._restored([rid for rid in ids if rid not in gone])
        # Only after the index has them: a repair cut short here is done again next time.
        for slot, members in found.items():
            key = self.keys.unindexed(slot)
            await self._call(partial(self._client.srem, key, *members), key=key)
        return len(restored)

    async def _unindexed_members(self) -> dict[int, list[bytes]]:
        """Every slot's ``unindexed`` members, by slot (only slots with some): one pipelined
        ``SMEMBERS`` per master, on bare connections; a slot whose call is redirected or lost
        is read through the cluster client."""
        masters = self._cluster_fast
        by_master: dict[str, list[int]] = {}
        for slot in range(REDIS_CLUSTER_HASH_SLOTS):
            by_master.setdefault(masters.master_at(slot), []).append(slot)
        found: dict[int, list[bytes]] = {}
        again: list[int] = []
        for slots in by_master.values():
            lean = masters.at_slot(slots[0])
            if lean is None:
                again += slots
                continue
            commands = [pack("SMEMBERS", self.keys.unindexed(slot)) for slot in slots]
            try:
                replies: list[Any] = await lean.call(commands, len(commands))
            except LOST:
                await masters.refresh(lost=lean)
                again += slots
                continue
            for slot, reply in zip(slots, replies, strict=True):
                if isinstance(reply, rx.ResponseError):
                    again.append(slot)
                elif reply:
                    found[slot] = list(reply)
        for slot in again:
            key = self.keys.unindexed(slot)
            members = await self._call(partial(self._client.smembers, key), key=key)
            if members:
                found[slot] = sorted(members)
        return found
