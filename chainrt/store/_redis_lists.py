"""The status and chain indexes of the Redis store: filtered ``list_runs`` pages in O(limit).

Beside the listing index (``chainrt:runs``, every run by ``created_at``) each run is in the
sorted set of its status, in that of its chain and in that of both (keys in :mod:`chainrt.redis.keys`), so
that a page of ``?status=failed``, ``?chain=triage`` or ``?chain=triage&status=failed`` walks
one set and reads the runs it returns and no others (a page that matches nothing reads none):

- on one node the scripts that change a run's status move it between the status sets and its
  chain's chain-status sets in the same script (``create``, ``claim_status``,
  ``commit_status``); step commits, which leave the status ``running``, go as before and touch
  no set. The scripts are given the chain-status keys of the run's chain: the store knows the
  chain of every run it created or read (:meth:`ListIndexes._chain_of`), and reads it from the
  run's record otherwise;
- on a cluster the run's script cannot reach the sets' slot: ``index_run`` (at creation) and
  ``index_status`` (after a claim or a commit to another status) follow it to the index's master.
  A process killed between the two leaves the run in the sets of its old status: a reader skips
  an entry whose run has another status, and drops one whose run has expired.

Runs created before these sets existed are indexed once, by :meth:`ListIndexes.rebuild_list_indexes`
(run by the first filtered page when the marker key is missing; safe to run again, and while
runs are created: it only adds what is missing).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from .._errors import CheckpointError
from .._records import RunRecord
from ._cluster_index import ClusterIndex
from ._scripts import SCRIPTS, STATUSES, RunFields

__all__ = ["ListIndexes"]

logger = logging.getLogger("chainrt.store")

_REBUILD_BATCH = 500
_CHAINS_KNOWN_MAX = 16_384
"""How many runs' chains a store remembers (for the chain-status keys of their status changes);
past that the oldest is forgotten and read again from its record when needed."""


def chain_of(raw: bytes | None) -> str | None:
    """The chain name of a run's stored record JSON, None when it cannot be read."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    chain = value.get("chain") if isinstance(value, dict) else None
    return chain if isinstance(chain, str) else None


class ListIndexes(ClusterIndex):
    """The status and chain sets, for ``RedisStore`` (see the module)."""

    _lists_ready = False
    _chains_known: dict[str, str]
    """Run id -> chain of the runs this store created or read (insertion-ordered, bounded)."""

    if TYPE_CHECKING:  # RedisStore's

        async def _index_page(self, start: int, size: int) -> list[bytes]: ...

        async def _pipelined(
            self, ids: list[bytes], command: Callable[[Any, str], object]
        ) -> list[Any]: ...

        async def _read_listed(self, ids: list[bytes], stale: list[bytes]) -> list[RunRecord]: ...

    def _index_run_call(
        self, run_id: str, created_at: float, status: str, chain: str
    ) -> tuple[list[str], list[str | bytes]]:
        keys = [self.keys.index, self.keys.by_chain(chain), self.keys.chains]
        keys += self.keys.status_sets()
        keys += self.keys.chain_status_sets(chain)
        return keys, [run_id, repr(created_at), status, chain]

    def _remember_chain(self, run_id: str, chain: str) -> None:
        """Keep ``run_id``'s chain for the chain-status keys of its next status change."""
        known = self._chains_known
        if run_id not in known:
            if len(known) >= _CHAINS_KNOWN_MAX:
                del known[next(iter(known))]
            known[run_id] = chain

    async def _chain_sets(self, run_id: str) -> tuple[str, ...]:
        """The chain-status sets of ``run_id``'s chain (STATUSES order), for a script that
        changes its status: its chain as remembered, else read from its record (one round
        trip, for a run this store has neither created nor read); none when the record is
        missing or unreadable (the script then leaves those sets alone)."""
        chain = self._chains_known.get(run_id)
        if chain is None:
            key = self.keys.run(run_id)
            raw = await self._call(lambda: self._client.hget(key, RunFields.RECORD), key=key)
            chain = chain_of(raw)
            if chain is None:
                return ()
            self._remember_chain(run_id, chain)
        return self.keys.chain_status_sets(chain)

    async def _restored(self, ids: list[bytes]) -> None:
        """Runs the cluster repair put back into the listing index: into their sets too."""
        await self._relist(ids)

    async def _index_add(
        self, run_id: str, created_at: float, status: str = "", chain: str | None = None
    ) -> None:
        """On a cluster: the run's index entry and (with ``chain``) its status and chain sets,
        in one script on the index's master (``ZADD NX``: a creation sent again keeps its
        score)."""
        if chain is None:
            await super()._index_add(run_id, created_at)
            return
        keys, args = self._index_run_call(run_id, created_at, status, chain)
        await self._script_fast("index_run", keys, args)

    async def _index_status(self, run_id: str, status: str, unindexed: str) -> None:
        """On a cluster, after a script that changed a run's status and put it into its slot's
        ``unindexed`` set: the run moves into the sets of ``status``, then out of that set.
        Not done (Redis away past the retries), the run stays in the set and the next repair
        (``_repair_index``) puts it into the sets of the status it has then; meanwhile a reader
        skips an entry whose run moved on."""
        try:
            keys = [self.keys.index, *self.keys.status_sets(), *await self._chain_sets(run_id)]
            await self._script_fast("index_status", keys, [run_id, status])
        except CheckpointError as exc:  # StoreUnavailable included
            logger.warning("run %s not moved to the %s list yet (%s)", run_id, status, exc)
            return
        await self._unindex(run_id, unindexed)

    async def rebuild_list_indexes(self) -> int:
        """Put every run of the listing index into the sets of its status, of its chain and of
        both (runs created before those sets existed), then set the marker; the runs indexed."""
        done = 0
        start = 0
        while True:
            ids = await self._index_page(start, _REBUILD_BATCH)
            if not ids:
                break
            start += len(ids)
            done += await self._relist(ids)
        marker = self.keys.lists_marker
        await self._call(lambda: self._client.set(marker, b"1"), key=marker)
        self._lists_ready = True
        if done:
            logger.info("status and chain lists: %d run(s) indexed", done)
        return done

    async def _relist(self, ids: list[bytes]) -> int:
        """Put the runs ``ids`` into the sets of their status and chain (read from their keys);
        how many were."""
        found = await self._pipelined(
            ids,
            lambda pipe, key: pipe.hmget(
                key, RunFields.STATUS, RunFields.CREATED_AT, RunFields.RECORD
            ),
        )
        calls = []
        for raw_id, fields in zip(ids, found, strict=True):
            if isinstance(fields, Exception) or fields[0] is None or fields[1] is None:
                continue  # expired meanwhile, or unreadable: the listing skips it too
            chain = chain_of(fields[2])
            if chain is None:
                continue
            run_id = raw_id.decode(errors="replace")
            status = fields[0].decode(errors="replace")
            calls.append(self._index_run_call(run_id, float(fields[1]), status, chain))
        if not calls:
            return 0
        script = SCRIPTS["index_run"]

        async def send() -> None:  # every key in the index's slot: one pipeline on a cluster too
            await self._client.script_load(script.source)
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                await pipe.execute()

        await self._call(send, key=self.keys.index)
        return len(calls)

    async def _ensure_lists(self) -> None:
        """Once per store: rebuild the status and chain sets if no store has (the marker)."""
        if self._lists_ready:
            return
        marker = self.keys.lists_marker
        if await self._call(lambda: self._client.exists(marker), key=marker):
            self._lists_ready = True
            return
        await self.rebuild_list_indexes()

    async def _filtered_page(
        self,
        status: str | None,
        chain: str | None,
        limit: int,
        before: tuple[float, str] | None,
    ) -> list[RunRecord]:
        """A page of ``list_runs`` filtered by status and/or chain: walks the status's, the
        chain's or (both filters) the chain-status set newest first, from ``before``; runs that
        no longer match are skipped, entries of expired runs dropped."""
        if status is not None and status not in STATUSES:
            return []  # no run has it: no set to read
        await self._ensure_lists()
        if chain is not None and status is not None:
            key = self.keys.by_chain_status(chain, status)
        elif chain is not None:
            key = self.keys.by_chain(chain)
        else:
            key = self.keys.by_status(str(status))
        start = 0 if before is None else await self._rank_in(key, before)
        runs: list[RunRecord] = []
        stale: list[bytes] = []
        page = max(limit, 10)
        wanted = None if status is None else status
        while len(runs) < limit:
            first, last = start, start + page - 1
            ids = cast(
                list[bytes],
                await self._call(partial(self._client.zrevrange, key, first, last), key=key),
            )
            if not ids:
                break
            start += len(ids)
            for run in await self._read_listed(ids, stale):
                if (wanted is None or run.status == wanted) and chain in (None, run.chain):
                    runs.append(run)
                    if len(runs) == limit:
                        break
        if stale and self.cluster:
            stale = await self._stale_for_good(stale)
        if stale:
            await self._call(lambda: self._client.zrem(key, *stale), key=key)
        return runs

    async def _rank_in(self, key: str, before: tuple[float, str]) -> int:
        """Where the entries after ``before`` start in the sorted set ``key``, newest first."""
        created_at, run_id = float(before[0]), str(before[1])
        rank = await self._call(lambda: self._client.zrevrank(key, run_id), key=key)
        if rank is not None:
            return int(rank) + 1
        newer = await self._call(
            lambda: self._client.zcount(key, f"({created_at!r}", "+inf"), key=key
        )
        return int(newer)

    async def _unlist(self, gone: list[bytes]) -> None:
        """Drop runs that expired from every status, chain and chain-status set (the sweep)."""
        if not gone:
            return
        chains_key = self.keys.chains
        chains = await self._call(lambda: self._client.smembers(chains_key), key=chains_key)
        sets = [*self.keys.status_sets()]
        for name in sorted(c.decode(errors="replace") for c in chains):
            sets += [self.keys.by_chain(name), *self.keys.chain_status_sets(name)]

        async def zrem_all() -> None:  # (every set is in one slot: one pipeline on a cluster too)
            async with self._client.pipeline(transaction=False) as pipe:
                for key in sets:
                    pipe.zrem(key, *gone)
                await pipe.execute()

        await self._call(zrem_all, key=sets[0])
