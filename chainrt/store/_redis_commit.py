"""The commit path of the Redis store (a base of :class:`._redis.RedisStore`).

``commit`` writes a step record and the run's progress atomically with one script call. On one
node (without ``wait_replicas``) the call is packed once and goes on the pipe (:meth:`chainrt.redis.LeanRedis.pipelined`),
with the other calls of its loop turn in one write; on a cluster each master has its own group
commit (:class:`._group.InFlightGroup`) whose batches go as packed ``EVALSHA`` on a bare
connection to that master. A call whose connection failed, or that was answered with a
redirection or a ``NOSCRIPT``, goes again through redis-py's client (retried, redirections
followed; every script is safe to send twice). A commit to another status than ``running`` also
moves the run between the status sets (:mod:`._redis_lists`). :meth:`RedisCommits._check` turns
the fenced scripts' replies (commit, claim, renew) into the store's errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from redis import exceptions as rx
from redis.crc import key_slot

from .._errors import CheckpointError
from .._records import RunProgress, StepRecord
from ..redis import LOST, REDIRECTED, pack, pack_args
from ..redis.keys import StoreKeys
from ._codec import FINAL_STATUSES, encode, encode_trace, fenced, finished, no_lease, not_found
from ._commit_wire import commit_wire
from ._group import InFlightGroup, Outcomes
from ._redis_client import RedisConnection
from ._scripts import SCRIPTS

__all__ = ["RedisCommits"]

# EVALSHA of the commit script with its 2 keys and 11 arguments: the fixed part, packed once.
_COMMIT_HEAD = b"*16\r\n" + pack_args(("EVALSHA", SCRIPTS["commit"].sha, "2"))
# The same with a third key and a 12th argument: a run's first commit on a cluster (_cluster_index).
_FIRST_COMMIT_HEAD = b"*18\r\n" + pack_args(("EVALSHA", SCRIPTS["commit"].sha, "3"))
# A commit to another status on a cluster: the run also goes into its slot's `unindexed` set.
_MARKED_COMMIT_HEAD = b"*18\r\n" + pack_args(("EVALSHA", SCRIPTS["commit_marked"].sha, "3"))


class _Commit(NamedTuple):
    """One commit, encoded as the commit script's keys and arguments."""

    run_id: str
    token: int
    keys: tuple[str, ...]
    """The run's keys; on a cluster, for the run's first commit, its slot's ``unindexed`` set too
    (and the run id as a 12th argument)."""
    args: list[str | bytes]
    slot: int = -1
    """On a cluster, the hash slot of the run's keys (computed once, routed by); -1 elsewhere."""
    script: str = "commit"
    """``commit``, or on a cluster ``commit_marked`` (a commit to another status)."""

    def packed(self) -> bytes:
        """The EVALSHA of the commit script, packed."""
        if self.script != "commit":
            return commit_wire(_MARKED_COMMIT_HEAD, self.keys, self.args)
        head = _COMMIT_HEAD if len(self.keys) == 2 else _FIRST_COMMIT_HEAD
        return commit_wire(head, self.keys, self.args)


class RedisCommits(RedisConnection):
    """The commit half of :class:`~chainrt.store._redis.RedisStore` (a base of it).

    The store sets these attributes in its ``__init__`` before any call.
    """

    keys: StoreKeys
    max_record_bytes: int
    _ttl_ms: str
    _commits: InFlightGroup[_Commit]
    _per_master: dict[str, InFlightGroup[_Commit]]
    _first_commit: dict[str, None]

    if TYPE_CHECKING:  # ListIndexes'

        async def _chain_sets(self, run_id: str) -> tuple[str, ...]: ...

        async def _index_status(self, run_id: str, status: str, unindexed: str) -> None: ...

    async def commit(
        self, run_id: str, token: int, progress: RunProgress, step: StepRecord | None = None
    ) -> None:
        """Write ``step`` (if any) and ``progress`` atomically, in one round trip."""
        keys: tuple[str, ...] = self.keys.run_and_steps(run_id)  # checks the id first
        limit = self.max_record_bytes
        progress_data = encode(progress, limit=limit, what=f"progress of run {run_id!r}")
        step_data = b""
        if step is not None:
            what = f"step {step.step_id!r} of run {run_id!r}"
            step_data = encode(step, limit=limit, what=what)
        args: list[str | bytes] = [
            str(token),
            progress.status,
            progress_data,
            repr(time.time()),
            "" if progress.budget_total_ms is None else repr(progress.budget_total_ms),
            b"" if progress.trace is None else encode_trace(progress.trace),
            "1" if progress.release_owner else "0",
            "0" if step is None else "1",
            "" if step is None else step.step_id,
            step_data,
            self._ttl_ms if progress.status in FINAL_STATUSES else "0",
        ]
        if self._first_commit and run_id in self._first_commit:
            # Taken out before the commit is acknowledged: one that fails leaves the run in
            # its slot's `unindexed` set, which the repair empties (the index has the run).
            del self._first_commit[run_id]
            keys += (self.keys.unindexed(key_slot(keys[0].encode())),)
            args.append(run_id)
        if progress.status != "running":  # the run changes status (a step commit does not)
            await self._commit_status(run_id, token, keys, args, progress.status)
            return
        if self.cluster is False and not self.wait_replicas:
            command = commit_wire(_COMMIT_HEAD, keys, args)
            reply = await self._on_pipe("commit", command, keys, args)
            self._check(reply, run_id, token, action="commit")
            return
        if self.cluster:
            await self._cluster_commit(run_id, token, keys, args)
            return
        await self._commits.submit(_Commit(run_id, token, keys, args))

    async def _commit_status(
        self, run_id: str, token: int, keys: tuple[str, ...], args: list[str | bytes], status: str
    ) -> None:
        """A commit to another status than ``running``: on one node the ``commit_status``
        script (the run also moves between the status sets); on a cluster the commit, then
        the run's move in the index's slot (``index_status``)."""
        if self.cluster is None:
            await self._call(self._connect)
        if self.cluster:
            # The run into its slot's `unindexed` set with the commit; out once its sets moved.
            unindexed = self.keys.unindexed(key_slot(keys[0].encode()))
            marked = (keys[0], keys[1], unindexed)
            await self._cluster_commit(run_id, token, marked, [*args[:11], run_id], "commit_marked")
            await self._index_status(run_id, status, unindexed)
            return
        keys = (*keys[:2], *self.keys.status_sets(), *await self._chain_sets(run_id))
        args = [*args[:11], run_id]
        if self.wait_replicas:
            reply = await self._script("commit_status", keys, args)
        else:
            command = pack("EVALSHA", SCRIPTS["commit_status"].sha, len(keys), *keys, *args)
            reply = await self._on_pipe("commit_status", command, keys, args)
        self._check(reply, run_id, token, action="commit")

    async def _cluster_commit(
        self,
        run_id: str,
        token: int,
        keys: tuple[str, ...],
        args: list[str | bytes],
        script: str = "commit",
    ) -> None:
        if self.wait_replicas:
            await self._commits.submit(_Commit(run_id, token, keys, args, script=script))
            return
        # The run's slot, once per commit: the group and the connection are found by it.
        slot = key_slot(keys[0].encode())
        # One group per master: a batch waits only for its own master's round trip.
        master = self._cluster_fast.master_at(slot)
        group = self._per_master.get(master)
        if group is None:
            group = self._per_master[master] = InFlightGroup(self._send_to_masters)
        await group.submit(_Commit(run_id, token, keys, args, slot, script))

    async def _send_to_masters(self, commits: list[_Commit]) -> Outcomes:
        """On a cluster: the commits grouped by the master of their run's slot (the cluster
        client's map), each group as packed EVALSHAs on a bare connection to its master, the
        groups at once. A commit answered with a redirection (``MOVED``, ``ASK``, ``TRYAGAIN``,
        ``CLUSTERDOWN``, ``NOSCRIPT``) or whose connection failed goes again through the cluster
        client (:meth:`_commit_one`: it follows the redirection, retries within ``retry_for_s``
        and updates the map the next commits are routed by)."""
        if len(commits) == 1:  # one run at a time: nothing to group
            return await self._send_to_master(commits)
        masters = self._cluster_fast
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(commits):
            groups.setdefault(masters.master_at(c.slot), []).append(i)
        if len(groups) == 1:  # (the usual case: the batch of one master's group commit)
            return await self._send_to_master(commits)
        outcomes: Outcomes = [None] * len(commits)

        async def send(where: list[int]) -> None:
            done = await self._send_to_master([commits[i] for i in where])
            for i, outcome in zip(where, done, strict=True):
                outcomes[i] = outcome

        await asyncio.gather(*(send(where) for where in groups.values()))
        return outcomes

    async def _send_to_master(self, commits: list[_Commit]) -> Outcomes:
        """``commits`` (all in slots of one master, by the map) on a bare connection to it;
        see :meth:`_send_to_masters`."""
        # Looked up here, with no pause before the call: connections closed by another batch's
        # refresh are never handed out.
        lean = self._cluster_fast.at_slot(commits[0].slot)
        if lean is None:  # the client's map has no master for the slot now
            return await self._through_client(commits)
        command = [c.packed() for c in commits]
        try:
            replies = await lean.call(command, len(commits))
        except LOST:
            outcomes = await self._through_client(commits)
            await self._cluster_fast.refresh(lost=lean)
            return outcomes
        outcomes = []
        again: list[int] = []
        for i, (c, reply) in enumerate(zip(commits, replies, strict=True)):
            outcomes.append(None)
            try:
                if isinstance(reply, REDIRECTED):
                    again.append(i)
                elif isinstance(reply, rx.ResponseError):
                    raise self._refused(reply, c.keys[0])
                else:
                    self._check(reply, c.run_id, c.token, action="commit")
            except CheckpointError as exc:
                outcomes[i] = exc
        if again:
            redone = await self._through_client([commits[i] for i in again])
            for i, outcome in zip(again, redone, strict=True):
                outcomes[i] = outcome
            await self._cluster_fast.refresh()
        return outcomes

    async def _through_client(self, commits: list[_Commit]) -> Outcomes:
        """Each commit as its own script call through the client (retried, redirections
        followed)."""
        if len(commits) == 1:
            return [await self._commit_one(commits[0])]
        return list(await asyncio.gather(*(self._commit_one(c) for c in commits)))

    async def _commit_one(self, commit: _Commit) -> BaseException | None:
        try:
            reply = await self._script(commit.script, commit.keys, commit.args)
            self._check(reply, commit.run_id, commit.token, action="commit")
        except CheckpointError as exc:
            return exc
        return None

    def _check(self, reply: Any, run_id: str, token: int, *, action: str) -> None:
        if reply == 0:  # the commit script's "written"
            return
        code = reply[0]
        if code == 0:
            return
        if code == -1:
            raise not_found(run_id, self.url)
        if code == -2:
            raise fenced(run_id, token, int(reply[1]), action=action)
        if code == -3:
            raise finished(run_id, reply[1].decode())
        if code == -4:
            raise no_lease(run_id)
        raise CheckpointError(f"the Redis store {self.url} gave an unexpected reply {reply!r}")
