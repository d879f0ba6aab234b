"""The production checkpoint store: Redis (or Valkey), shared by every runner process and host.

A run is two keys in one Cluster slot (see ``chainrt.redis.keys``): a hash with the run's parts and a hash of
its step records. ``create_run``, ``commit``, ``claim`` and ``renew`` are Lua scripts: each
checks the fencing token inside Redis and writes everything it writes atomically, in one round
trip. Every script is safe to send twice (a retry after a lost reply finds its own write and
succeeds), so transient connection errors are retried here, within ``retry_for_s``.

The URL may name one Redis server or any node of a Redis Cluster: the connection, cluster
detection, retries and error mapping live in ``_redis_client``, the base of ``RedisStore``; the
commit path (the pipe, the group commit per cluster master, the fallback to the client) in
``_redis_commit``, another base.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from redis.crc import key_slot

from .._errors import CheckpointError, CorruptRecord
from .._records import OwnerLease, RunRecord, RunStatus, StepRecord
from .._settings import get_settings
from ..redis import close_client, pack, split_options
from ..redis.keys import StoreKeys, check_run_id
from ._answers import AnswerCache, RedisAnswers, kept
from ._cluster_index import FIRST_COMMIT_MAX
from ._codec import (
    FINAL_STATUSES,
    as_dict,
    assemble_run,
    check_owner,
    decode_progress,
    decode_run,
    decode_step,
    encode,
    not_found,
)
from ._group import InFlightGroup
from ._protocol import DEFAULT_MAX_RECORD_BYTES, CheckpointStore
from ._redis_client import one_line
from ._redis_commit import RedisCommits
from ._redis_lists import ListIndexes
from ._scripts import SCRIPTS
from ._scripts import RunFields as F
from ._signals_redis import RedisSignals
from ._url import check_redis_url, redact_url

__all__ = ["RedisStore"]

logger = logging.getLogger("chainrt.store")

_SWEEP_EVERY_S = 60.0  # create_run drops index entries of expired runs at most this often
_SWEEP_BATCH = 500


class RedisStore(RedisSignals, RedisCommits, ListIndexes, CheckpointStore):
    """Checkpoint store in Redis: ``redis://[:password@]host:port/db`` or ``rediss://`` (TLS).

    Nothing connects until the first call. ``retry_for_s`` bounds how long one call retries
    transient errors (a restart, a failover) before raising StoreUnavailable;
    ``socket_timeout_s`` bounds one round trip. ``record_ttl_s`` (default
    ``CHAINRT_RECORD_TTL_S``) is how long a finished run's keys live.
    """

    def __init__(
        self,
        url: str,
        *,
        record_ttl_s: float | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        retry_for_s: float = 2.0,
        socket_timeout_s: float = 2.0,
        key_prefix: str = "chainrt",
    ) -> None:
        self.raw_url = url
        self.url = redact_url(url)
        check_redis_url(url)
        try:
            self._client_url, options = split_options(url)
        except ValueError as exc:
            raise CheckpointError(f"invalid Redis store URL {self.url!r}: {exc}") from None
        self.wait_replicas = options.wait_replicas
        """Replicas that must have each write before it counts (``?wait_replicas=N``; 0: none)."""
        self._wait_timeout_ms = options.wait_timeout_ms
        self.cluster: bool | None = None
        """True on a Redis Cluster, False on one node, None until the first call has found out."""
        self.record_ttl_s = record_ttl_s if record_ttl_s is not None else _default_ttl()
        self.max_record_bytes = max_record_bytes
        # ?retry_for_s= on the URL wins over the argument (the CLI has no other way to set it).
        self.retry_for_s = retry_for_s if options.retry_for_s is None else options.retry_for_s
        self.keys = StoreKeys(key_prefix)
        self._ttl_ms = str(max(1, round(self.record_ttl_s * 1000)))
        self._last_sweep = 0.0
        self._socket_timeout_s = socket_timeout_s
        self._redis = self._new_client()  # no I/O yet; parses (and so checks) the URL now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # Before the first call has found out what the URL names, and with wait_replicas: each
        # commit through the client (WAIT goes with each). On one node otherwise: the pipe.
        self._commits = InFlightGroup(self._through_client)
        # On a cluster: one group commit per master, by node name ("" while none is known).
        self._per_master = {}
        # On a cluster: runs created here with an owner (this process runs them) whose first
        # commit has not gone yet (it takes them out of their slot's `unindexed` set, see
        # _cluster_index); insertion-ordered, at most FIRST_COMMIT_MAX (the oldest go first).
        self._first_commit = {}
        self._creating: set[str] = set()
        self._chains_known = {}

    # -- the protocol ------------------------------------------------------------------------

    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run (with its owner lease). CheckpointError if the id exists."""
        run_id = check_run_id(run.run_id)
        check_owner(run)
        data = encode(run, limit=self.max_record_bytes, what=f"run {run_id!r}")
        owner = run.owner
        args: list[str | bytes] = [
            run_id,
            data,
            run.status,
            str(run.fencing_token),
            repr(run.created_at),
            repr(run.updated_at),
            "1" if owner else "0",
            owner.host if owner else "",
            str(owner.pid) if owner else "",
            repr(owner.expires_at) if owner else "",
            self._ttl_ms if run.status in FINAL_STATUSES else "0",
            run.chain,
        ]
        keys = [self.keys.run(run_id), self.keys.steps(run_id), self.keys.index]
        keys += [self.keys.by_status(run.status), self.keys.by_chain(run.chain), self.keys.chains]
        keys.append(self.keys.by_chain_status(run.chain, run.status))
        self._remember_chain(run_id, run.chain)
        if self.cluster is None:
            await self._call(self._connect)
        if self.cluster:
            reply = await self._create_on_cluster(run, keys, args)
        elif self.wait_replicas:
            reply = await self._script("create", keys, args)
        else:
            command = pack("EVALSHA", SCRIPTS["create"].sha, len(keys), *keys, *args)
            reply = await self._on_pipe("create", command, keys, args)
        if reply[0] != 0:
            raise CheckpointError(
                f"run {run_id!r} already exists in {self.url}; choose another run id, "
                "or resume that run"
            )
        if time.time() - self._last_sweep > _SWEEP_EVERY_S:
            await self._sweep_index()

    async def _create_on_cluster(
        self, run: RunRecord, keys: list[str], args: list[str | bytes]
    ) -> Any:
        """The index lives in another slot, which a cluster refuses in the run's script: the
        script (which also puts the run into its slot's ``unindexed`` set) and the index entry
        go at once, to their two masters; both acknowledged, the run's first commit empties
        the set again (see ``_cluster_index``), or, for a run created without an owner (queued
        for a runner elsewhere: ``chainrt serve``), an ``SREM`` right away."""
        run_id = run.run_id
        unindexed = self.keys.unindexed(key_slot(keys[0].encode()))
        self._creating.add(run_id)  # a sweep meanwhile must not take its entry for a stale one
        try:
            indexing = asyncio.ensure_future(
                self._index_add(run_id, run.created_at, run.status, run.chain)
            )
            try:
                reply = await self._script_fast("create_run", [keys[0], keys[1], unindexed], args)
            except BaseException:
                # The run may exist (a lost reply): then its slot's set has it, for the repair.
                indexing.cancel()
                with contextlib.suppress(BaseException):
                    await indexing
                raise
            await indexing
        finally:
            self._creating.discard(run_id)
        if reply[0] == 0:
            if run.owner is not None:  # its first commit, here, empties the set
                first = self._first_commit
                if len(first) >= FIRST_COMMIT_MAX:
                    # A run that never commits here: the repair empties its set entry.
                    del first[next(iter(first))]
                first[run_id] = None
            else:  # queued for another process: nothing here will commit it
                await self._unindex(run_id, unindexed)
        return reply

    async def get_run(self, run_id: str) -> RunRecord:
        """Load a run. RunNotFound if absent (or expired), CorruptRecord if unreadable."""
        key = self.keys.run(run_id)
        fields = as_dict(
            await self._read_fast(pack("HGETALL", key), key, lambda: self._hgetall(key))
        )
        if not fields:
            raise not_found(run_id, self.url)
        return self._assemble(run_id, key, fields)

    async def get_steps(self, run_id: str) -> dict[str, StepRecord]:
        """All step records of a run, by step id. RunNotFound if the run is absent."""
        run_key, steps_key = self.keys.run(run_id), self.keys.steps(run_id)

        async def read() -> list[Any]:
            if self.cluster:
                # A MULTI is not redirected while the run's slot migrates (ASK): it failed until
                # the migration ended. Two commands are, each on its own. A run deleted between
                # them reads as one with no steps, as a read just after its deletion would.
                return [await self._client.exists(run_key), await self._client.hgetall(steps_key)]
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.exists(run_key)
                pipe.hgetall(steps_key)
                result: list[Any] = await pipe.execute()
                return result

        commands = (pack("EXISTS", run_key), pack("HGETALL", steps_key))
        exists, raw = await self._transaction_fast(commands, steps_key, read)
        raw_steps = as_dict(raw)
        if not exists:
            raise not_found(run_id, self.url)
        where = f"{self.url} key {steps_key}"
        steps = {}
        for raw_id, raw in raw_steps.items():
            step_id = raw_id.decode(errors="replace")
            steps[step_id] = decode_step(raw, run_id=run_id, step_id=step_id, where=where)
        return steps

    async def claim(self, run_id: str, expected_token: int, owner: OwnerLease) -> int:
        """Compare-and-set the fencing token; the new token is ``expected_token + 1``."""
        check_run_id(run_id)
        new_token = expected_token + 1
        args = [
            str(expected_token),
            str(new_token),
            owner.host,
            str(owner.pid),
            repr(owner.expires_at),
            repr(time.time()),
        ]
        keys = [self.keys.run(run_id), self.keys.steps(run_id)]
        if self.cluster is None:
            await self._call(self._connect)
        if self.cluster:  # marked in its slot until its sets moved (as _commit_status)
            unindexed = self.keys.unindexed(key_slot(keys[0].encode()))
            reply = await self._script_fast("claim_marked", [*keys, unindexed], [*args, run_id])
            self._check(reply, run_id, expected_token, action="claim")
            await self._index_status(run_id, "running", unindexed)
        else:  # the run moves into the `running` set in the same script
            keys += [*self.keys.status_sets(), *await self._chain_sets(run_id)]
            reply = await self._script_fast("claim_status", keys, [*args, run_id])
            self._check(reply, run_id, expected_token, action="claim")
        owner.token = new_token
        return new_token

    async def renew(self, run_id: str, token: int, expires_at: float) -> None:
        """Extend the owner lease to ``expires_at``; FencedOut if ``token`` is stale."""
        args = [str(token), repr(expires_at)]
        reply = await self._script_fast("renew", [self.keys.run(run_id)], args)
        self._check(reply, run_id, token, action="renew")

    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 100,
        *,
        before: tuple[float, str] | None = None,
        chain: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, optionally only those with ``status`` and of ``chain``; corrupt
        ones are skipped.

        Walks the index newest first in pages (a filtered page: the status's or the chain's
        sorted set, :mod:`._redis_lists`); index entries whose run has expired are dropped
        from the index on the way. ``before`` (``created_at, run_id``) starts after that run:
        at its rank in the sorted set (O(log N)), not by reading what comes first.
        """
        if limit < 0:
            raise CheckpointError(f"list_runs limit must be >= 0, got {limit}")
        if time.time() - self._last_sweep > _SWEEP_EVERY_S:
            await self._sweep_index()
            if self.cluster:
                await self._repair_index()
        if status is not None or chain is not None:
            return await self._filtered_page(status, chain, limit, before)
        runs: list[RunRecord] = []
        stale: list[bytes] = []
        start = 0 if before is None else await self._rank_after(before)
        while len(runs) < limit:
            ids = await self._index_page(start, limit)
            if not ids:
                break
            start += limit
            runs.extend(await self._read_listed(ids, stale))
        if stale and self.cluster:
            stale = await self._stale_for_good(stale)
        if stale:
            await self._call(lambda: self._client.zrem(self.keys.index, *stale))
        return runs[:limit]

    async def _read_listed(self, ids: list[bytes], stale: list[bytes]) -> list[RunRecord]:
        """The runs of the index entries ``ids``, in their order, read in one round trip; an
        entry whose run has expired is added to ``stale``, one that cannot be read is logged
        and skipped (a list page never fails on one bad record)."""
        runs: list[RunRecord] = []
        records = await self._pipelined(ids, lambda pipe, key: pipe.hgetall(key))
        for raw_id, fields in zip(ids, records, strict=True):
            run_id = raw_id.decode(errors="replace")
            if not fields:
                stale.append(raw_id)
                continue
            try:
                if isinstance(fields, Exception):
                    raise CorruptRecord(f"the run key cannot be read: {one_line(fields)}")
                runs.append(self._assemble(run_id, self.keys.run(run_id), fields))
            except CheckpointError as exc:
                logger.warning("list_runs skips run %r: %s", run_id, exc)
        return runs

    def answer_cache(self) -> AnswerCache:
        """Answers as Redis strings with a TTL under the store's key prefix (shared by every
        process on this Redis)."""
        return kept(self, lambda: RedisAnswers(self))

    async def close(self) -> None:
        """Close the connection pool; the store is unusable afterwards."""
        self._closed = True
        if self._loop is asyncio.get_running_loop():
            await self._close_fast()
            await close_client(self._redis)
        elif self._loop is not None:  # a foreign loop: closed on the store's own, if it runs
            self._retire(self._loop)  # (a closed loop's were closed at its shutdown)
            self._redis = self._new_client()

    async def _hgetall(self, key: str) -> dict[bytes, bytes]:
        return cast(dict[bytes, bytes], await self._client.hgetall(key))

    async def _rank_after(self, before: tuple[float, str]) -> int:
        """Where the runs after ``before`` start in the index, newest first. The index orders
        equal scores by member, descending, as the SQLite store orders equal times by run id."""
        created_at, run_id = float(before[0]), str(before[1])
        index = self.keys.index
        rank = await self._call(lambda: self._client.zrevrank(index, run_id))
        if rank is not None:
            return int(rank) + 1
        # The run left the index (expired): start after every run newer than it.
        newer = await self._call(lambda: self._client.zcount(index, f"({created_at!r}", "+inf"))
        return int(newer)

    async def _index_page(self, start: int, size: int) -> list[bytes]:
        """Run ids of the index from ``start`` (0 = newest), at most ``size`` of them."""
        index = self.keys.index
        ids = await self._call(lambda: self._client.zrevrange(index, start, start + size - 1))
        return cast(list[bytes], ids)

    async def _pipelined(
        self, ids: list[bytes], command: Callable[[Any, str], object]
    ) -> list[Any]:
        """``command(pipe, run_key)`` for each run id, in one round trip; errors come back as
        exception objects in place (one bad key must not hide the other runs)."""

        async def read() -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for raw_id in ids:
                    command(pipe, self.keys.run(raw_id.decode(errors="replace")))
                result: list[Any] = await pipe.execute(raise_on_error=False)
                return result

        return await self._call(read) if ids else []

    async def _sweep_index(self) -> None:
        """Drop index entries of runs created long ago whose keys have expired (best effort)."""
        self._last_sweep = now = time.time()
        index = self.keys.index
        old = cast(
            list[bytes],
            await self._call(
                lambda: self._client.zrangebyscore(
                    index, "-inf", now - self.record_ttl_s, start=0, num=_SWEEP_BATCH
                )
            ),
        )
        if old:
            found = await self._pipelined(old, lambda pipe, key: pipe.exists(key))
            gone = [rid for rid, exists in zip(old, found, strict=True) if exists == 0]
            if gone and self.cluster:
                gone = await self._stale_for_good(gone)
            if gone:
                await self._call(lambda: self._client.zrem(index, *gone))
                await self._unlist(gone)

    def _assemble(self, run_id: str, key: str, fields: dict[bytes, bytes]) -> RunRecord:
        where = f"{self.url} key {key}"

        def get(name: str) -> bytes | None:
            return fields.get(name.encode())

        try:
            raw, token, status = get(F.RECORD), get(F.TOKEN), get(F.STATUS)
            if raw is None or token is None or status is None:
                raise ValueError("the record, token or status field is missing")
            raw_progress, host, pid, expires = (
                get(F.PROGRESS),
                get(F.OWNER_HOST),
                get(F.OWNER_PID),
                get(F.OWNER_EXPIRES_AT),
            )
            updated_at, budget_total = get(F.UPDATED_AT), get(F.BUDGET_TOTAL_MS)
            token_value = int(token)
            pid_value = None if pid is None else int(pid)
            expires_value = None if expires is None else float(expires)
            updated_value = time.time() if updated_at is None else float(updated_at)
            budget_value = None if budget_total is None else float(budget_total)
        except ValueError as exc:
            raise CorruptRecord(
                f"the stored run {run_id!r} at {where} is not a valid record ({exc}); nothing "
                "was loaded from it. Inspect or delete that key."
            ) from None
        base = decode_run(raw, run_id=run_id, where=where)
        self._remember_chain(run_id, base.chain)
        progress = None
        if raw_progress is not None:
            progress = decode_progress(raw_progress, run_id=run_id, where=where)
        return assemble_run(
            base,
            status=status.decode(errors="replace"),
            token=token_value,
            progress=progress,
            owner_host=None if host is None else host.decode(errors="replace"),
            owner_pid=pid_value,
            owner_expires_at=expires_value,
            updated_at=updated_value,
            budget_total_ms=budget_value,
            trace=get(F.TRACE),
            where=where,
        )


def _default_ttl() -> float:
    return get_settings().record_ttl_s
