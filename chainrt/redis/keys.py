"""Every Redis key and pub/sub channel chainrt uses, built here and nowhere else.

``docs/redis-cluster.md`` ("Where the keys live") lists each one with its type and purpose;
``tests/test_redis_keys_doc.py`` checks that table against the builders of this module (every
builder documented, nothing documented that no builder makes). A ``{...}`` part is a hash tag:
keys with one tag live in one Redis Cluster slot, so one Lua script may write them together.

- The checkpoint store (:class:`StoreKeys`, default prefix ``chainrt``): a run's hash and its
  steps' hash share the ``{<run_id>}`` tag (with its signals); the listing indexes share a tag
  ``<ix>`` chosen in the slot of ``chainrt:runs`` (:attr:`StoreKeys.lists_tag`); on a cluster,
  each slot has an ``unindexed`` set (:func:`slot_tag`). The scripts that write them and the
  run hash's field names: ``chainrt.store._scripts``.
- The limiter (:func:`key_names`, default prefix ``chainrt:ck``): a concurrency key ``K``'s
  state shares the tag ``{K}``; a member is ``"<instance>:<n>:<holder>"``, and the scripts
  publish wake-ups on :func:`wake_channel` of the member's instance.
- The ``chainrt serve`` queue (:class:`QueueKeys`): every key shares ``{queue}``, so one
  ``XREADGROUP`` waits on all streams and one ``MULTI`` moves an entry, on a cluster too.
- The tool fence of a cancelled run (:func:`fence_key`), in the run's slot.
- Pub/sub channels between the runtimes of one fleet (:func:`cancel_channel` and the others):
  channels are not keys; a cluster delivers a message published on any node everywhere.

Nothing here imports redis-py at import time (a process on SQLite checks run ids with
:func:`check_run_id` and loads no Redis client).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from typing import NamedTuple, get_args

from .._errors import CheckpointError, ConcurrencyError
from .._records import RunStatus

__all__ = [
    "LIMITER_PREFIX",
    "MAX_RUN_ID_LEN",
    "PREFIX",
    "KeyNames",
    "QueueKeys",
    "StoreKeys",
    "cancel_channel",
    "check_prefix",
    "check_run_id",
    "events_channel",
    "fence_key",
    "key_names",
    "replay_channel",
    "run_statuses",
    "runs_channel",
    "slot_tag",
    "stream_key",
    "wake_channel",
    "wake_channel_prefix",
]

PREFIX = "chainrt"
"""The default prefix of the store's, the queue's, the fence's keys and of the bus channels."""

LIMITER_PREFIX = "chainrt:ck"
"""The default prefix of the limiter's keys."""

MAX_RUN_ID_LEN = 512
"""Run ids longer than this are refused: they end up in every key of the run."""


# -- the checkpoint store -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreKeys:
    """Builds the keys of the checkpoint store under one ``prefix``."""

    prefix: str = PREFIX

    def run(self, run_id: str) -> str:
        """The hash holding a run's record, progress, status, token and owner lease."""
        return f"{self.prefix}:{{{check_run_id(run_id)}}}:run"

    def steps(self, run_id: str) -> str:
        """The hash of a run's step records, step_id -> JSON."""
        return f"{self.prefix}:{{{check_run_id(run_id)}}}:steps"

    def run_and_steps(self, run_id: str) -> tuple[str, str]:
        """``(run(run_id), steps(run_id))``, the id checked once: the keys of every commit."""
        tag = f"{self.prefix}:{{{check_run_id(run_id)}}}:"
        return tag + "run", tag + "steps"

    def signal(self, run_id: str, name: str) -> str:
        """The string holding signal ``name`` of ``run_id``: in the run's slot (its hash tag),
        so one script reads the run's status and keeps the signal."""
        return f"{self.prefix}:{{{check_run_id(run_id)}}}:signal:{name}"

    def answer(self, key: str) -> str:
        """A cached answer of a ``degrade: [cache]`` step (``key``: its inputs' digest)."""
        return f"{self.prefix}:answer:{key}"

    @property
    def index(self) -> str:
        """The sorted set of all run ids, scored by ``created_at`` (newest = highest)."""
        return f"{self.prefix}:runs"

    @property
    def lists_tag(self) -> str:
        """A hash tag in the listing index's own cluster slot (for the status and chain sets)."""
        return _tag_of_slot_of(self.index)

    def by_status(self, status: str) -> str:
        """The sorted set of the run ids whose status is ``status``, scored by ``created_at``."""
        return f"{self.prefix}:{{{self.lists_tag}}}:status:{status}"

    def status_sets(self) -> tuple[str, ...]:
        """:meth:`by_status` of each run status, in the order of :func:`run_statuses`."""
        return tuple(self.by_status(status) for status in run_statuses())

    def by_chain_status(self, chain: str, status: str) -> str:
        """The sorted set of the run ids of ``chain`` whose status is ``status``, scored by
        ``created_at`` (a ``?chain=&status=`` page walks it alone). The status, from a fixed
        set of words, comes first: no chain name can make this a :meth:`by_chain` key."""
        return f"{self.prefix}:{{{self.lists_tag}}}:chain-status:{status}:{chain}"

    def chain_status_sets(self, chain: str) -> tuple[str, ...]:
        """:meth:`by_chain_status` of ``chain`` and each run status, in that order."""
        return tuple(self.by_chain_status(chain, status) for status in run_statuses())

    def by_chain(self, chain: str) -> str:
        """The sorted set of the run ids of ``chain``, scored by ``created_at``."""
        return f"{self.prefix}:{{{self.lists_tag}}}:chain:{chain}"

    @property
    def chains(self) -> str:
        """The set of the chain names that have a :meth:`by_chain` set (for the sweep)."""
        return f"{self.prefix}:{{{self.lists_tag}}}:chains"

    @property
    def lists_marker(self) -> str:
        """Set once the status, chain and chain-status sets hold every run (runs created before
        them were added by ``rebuild_list_indexes``). ``v1`` marked stores without the
        chain-status sets: their first filtered page indexes every run again."""
        return f"{self.prefix}:{{{self.lists_tag}}}:lists-v2"

    def unindexed(self, slot: int) -> str:
        """On a cluster: the set of run ids of hash slot ``slot`` whose index entry may be
        missing (written by ``create_run``'s script, emptied by the first commit and by
        ``list_runs``'s repair). Its key lives in ``slot``, beside those runs' keys."""
        return f"{self.prefix}:{{{slot_tag(slot)}}}:unindexed"


@cache
def run_statuses() -> tuple[str, ...]:
    """Every run status, in the order of :meth:`StoreKeys.status_sets` (the scripts' key order)."""
    return get_args(RunStatus)


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it can name a run; CheckpointError otherwise."""
    if not isinstance(run_id, str) or not run_id:
        raise CheckpointError(f"a run id must be a non-empty string, got {run_id!r}")
    if len(run_id) > MAX_RUN_ID_LEN:
        raise CheckpointError(
            f"run id {run_id[:40]!r}... is {len(run_id)} characters long; "
            f"the limit is {MAX_RUN_ID_LEN}"
        )
    return run_id


def slot_tag(slot: int) -> str:
    """A short hash tag whose Redis Cluster hash slot is ``slot`` (0 to 16383)."""
    return _slot_tags()[slot]


@cache
def _slot_tags() -> tuple[str, ...]:
    """The first ``ix<hex>`` tag of each slot, found once (about 300,000 CRC16s, 0.2 s; only a
    store on a cluster needs them)."""
    # Imported here: importing the redis package loads its OpenTelemetry hooks, which a process
    # on SQLite (these keys' module is shared) or with tracing off must not pay for.
    from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

    tags: dict[int, str] = {}
    i = 0
    while len(tags) < REDIS_CLUSTER_HASH_SLOTS:
        tag = f"ix{i:x}"
        tags.setdefault(key_slot(tag.encode()), tag)
        i += 1
    return tuple(tags[slot] for slot in range(REDIS_CLUSTER_HASH_SLOTS))


@cache
def _tag_of_slot_of(key: str) -> str:
    """The first ``ix<hex>`` tag whose cluster slot is ``key``'s (about 16,000 CRC16s, once)."""
    from redis.crc import key_slot  # see _slot_tags

    slot = key_slot(key.encode())
    i = 0
    while key_slot(f"ix{i:x}".encode()) != slot:
        i += 1
    return f"ix{i:x}"


# -- the limiter ----------------------------------------------------------------------------------


class KeyNames(NamedTuple):
    """The Redis keys behind one concurrency key, in the order the Lua scripts expect them."""

    holders: str
    """Sorted set: member -> lease expiry (ms, Redis server time)."""
    queue: str
    """Sorted set: member -> ticket number (first come, first served)."""
    tickets: str
    """Sorted set: member -> ticket expiry (ms); a dead waiter's ticket lapses."""
    rate: str
    """String: the GCRA theoretical arrival time (ms)."""
    undone: str
    """Sorted set: member -> expiry (ms) of abandoned acquisitions (a try still in flight for
    one of them must not take a slot)."""


def check_prefix(prefix: str) -> str:
    """Refuse a limiter prefix that would break the hash tags (braces) or blur the layout."""
    if not prefix or "{" in prefix or "}" in prefix or prefix.endswith(":"):
        raise ConcurrencyError(
            "limiter key prefix must be non-empty, without braces or a trailing ':', "
            f"got {prefix!r}"
        )
    return prefix


@lru_cache(maxsize=4096)
def key_names(prefix: str, key: str) -> KeyNames:
    """Names of the Redis keys behind concurrency key ``key``."""
    base = f"{prefix}:{{{key}}}"
    return KeyNames(*(f"{base}:{part}" for part in KeyNames._fields))


def wake_channel_prefix(prefix: str) -> str:
    """A limiter instance's wake-up channel minus the instance id (the scripts append the id
    they read from the member)."""
    return f"{prefix}:wake:"


def wake_channel(prefix: str, instance: str) -> str:
    """The pub/sub channel limiter ``instance`` hears its wake-ups on."""
    return wake_channel_prefix(prefix) + instance


# -- the serve queue and the tool fence ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every Redis key of the ``chainrt serve`` queue, under one ``prefix``. All carry the hash
    tag ``{queue}``: one slot on a Redis Cluster, so one ``XREADGROUP`` waits on all streams and
    one ``MULTI`` moves an entry between them."""

    prefix: str = PREFIX

    def stream(self, priority: str, chain: str | None = None) -> str:
        """The stream of one priority class; with ``chain``, that chain's own stream (a runner
        reads only the chain streams of the chains it serves). Chain names are
        ``[a-z0-9_-]+``, so they need no escaping."""
        base = f"{self.prefix}:{{queue}}:{priority}"
        return base if not chain else f"{base}:chain:{chain}"

    @property
    def dead(self) -> str:
        """The dead-letter stream: entries whose handling failed for good, with the reason."""
        return f"{self.prefix}:{{queue}}:dead"

    @property
    def runners(self) -> str:
        """Hash: consumer name -> JSON ``{"chains": [...], "expires_at": unix s}`` of each
        live runner (what lets a run that no live runner serves be seen as such)."""
        return f"{self.prefix}:{{queue}}:runners"

    @property
    def chains(self) -> str:
        """Set: every chain some runner announced (whose chain streams ``depth`` looks at)."""
        return f"{self.prefix}:{{queue}}:chains"


def stream_key(priority: str, prefix: str = PREFIX, chain: str | None = None) -> str:
    """The stream of one priority class (and chain); see :meth:`QueueKeys.stream`."""
    return QueueKeys(prefix).stream(priority, chain)


def fence_key(run_id: str, prefix: str = PREFIX) -> str:
    """The key of ``run_id``'s tool fence (in the run's own cluster slot): a cancelled run's
    abandoned sync tools still running on its owner."""
    return f"{prefix}:tool-fence:{{{run_id}}}"


# -- pub/sub channels -----------------------------------------------------------------------------


def cancel_channel(prefix: str = PREFIX) -> str:
    """The channel cancels are announced on (a run id per message)."""
    return f"{prefix}:cancel"


def events_channel(run_id: str, prefix: str = PREFIX) -> str:
    """The channel a run's owner publishes its live events on."""
    return f"{prefix}:events:{run_id}"


def replay_channel(prefix: str = PREFIX) -> str:
    """The channel a late watcher asks a run's owner on for the run's in-flight events."""
    return f"{prefix}:events-replay"


def runs_channel(prefix: str = PREFIX) -> str:
    """The channel runners announce runs-list changes on (a run created, started, ended)."""
    return f"{prefix}:run-changes"
