"""Every Redis key the checkpoint store uses, built in one place (DESIGN §4).

Layout, with the default prefix ``chainrt``::

    chainrt:{<run_id>}:run      hash: the run (see the field names below)
    chainrt:{<run_id>}:steps    hash: step_id -> StepRecord JSON
    chainrt:runs                sorted set: run_id scored by created_at (listing index)

    chainrt:{<tag>}:unindexed   set (Redis Cluster only): run ids of the slot whose index entry
                                is not known to be written (``<tag>``: see :func:`slot_tag`)

The ``{<run_id>}`` hash tag puts all keys of one run in one Redis Cluster slot, so a Lua script
can write them atomically. The listing index spans runs and lives in a slot of its own: it is a
best-effort secondary structure, and readers tolerate entries whose run has expired. On one Redis
node the ``create`` script adds the run to the index in the same round trip. On a Redis Cluster a
script may only touch keys of one slot: ``create_run`` writes the run and adds its id to the
``unindexed`` set of the run's own slot (one atomic script), while the index entry is sent at the
same time to the index's master. The run's first commit takes the id out of that set again. A
process that dies between the two writes leaves the id in the set, and ``list_runs`` puts every
such run back into the index (``_cluster_index``): the set is what finds it again.

The limiter's keys (``chainrt.concurrency._keys``) and the service queue carry hash tags of their
own; ``docs/redis-cluster.md`` lists every key chainrt writes.

The Lua scripts that write these keys live here too, formatted from the same field names, so
the whole Redis layout reads in one file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

from .._errors import CheckpointError

__all__ = [
    "MAX_RUN_ID_LEN",
    "SCRIPTS",
    "RunFields",
    "Script",
    "StoreKeys",
    "check_run_id",
    "slot_tag",
]

MAX_RUN_ID_LEN = 512
"""Run ids longer than this are refused: they end up in every key of the run."""


class RunFields:
    """Field names of the run hash (the Lua scripts are formatted from these, not hand-written)."""

    RECORD = "record"  # RunRecord JSON as created: spec, input, budget total, trace ...
    PROGRESS = "progress"  # RunProgress JSON of the latest commit
    TOKEN = "token"  # noqa: S105 -- the fencing token (decimal), not a secret
    STATUS = "status"
    CREATED_AT = "created_at"
    UPDATED_AT = "updated_at"
    OWNER_HOST = "owner_host"
    OWNER_PID = "owner_pid"
    OWNER_EXPIRES_AT = "owner_expires_at"
    BUDGET_TOTAL_MS = "budget_total_ms"  # set by a commit that gives a new budget
    TRACE = "trace"  # JSON, set by a commit that gives new trace ids


@dataclass(frozen=True, slots=True)
class StoreKeys:
    """Builds the keys of the checkpoint store under one ``prefix``."""

    prefix: str = "chainrt"

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

    @property
    def index(self) -> str:
        """The sorted set of all run ids, scored by ``created_at`` (newest = highest)."""
        return f"{self.prefix}:runs"

    def unindexed(self, slot: int) -> str:
        """On a cluster: the set of run ids of hash slot ``slot`` whose index entry may be
        missing (written by ``create_run``'s script, emptied by the first commit and by
        ``list_runs``'s repair). Its key lives in ``slot``, beside those runs' keys."""
        return f"{self.prefix}:{{{slot_tag(slot)}}}:unindexed"


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


# Script replies: {0} done, {-1} no such run, {-2, token} fenced, {-3, status} completed,
# {-4} no owner lease, {-5} exists. Field names are formatted in from RunFields. Each script is
# safe to run twice (a retry after a lost reply): its second run finds its own write.

_INDEX_LINE = "redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])\n"

# KEYS run, steps, index. ARGV run_id, record, status, token, created_at, updated_at,
# has_owner, owner_host, owner_pid, owner_expires_at, ttl_ms (0: none).
_CREATE = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], '{RECORD}') == ARGV[2] then return {{0}} end
  return {{-5}}
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], '{RECORD}', ARGV[2], '{STATUS}', ARGV[3], '{TOKEN}', ARGV[4],
  '{CREATED_AT}', ARGV[5], '{UPDATED_AT}', ARGV[6])
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[1], '{OWNER_HOST}', ARGV[8], '{OWNER_PID}', ARGV[9],
    '{OWNER_EXPIRES_AT}', ARGV[10])
end
if ARGV[11] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[11]) end
"""
    + _INDEX_LINE
    + """return {{0}}
"""
)

# Redis Cluster (the index lives in another slot): the run id goes into its slot's `unindexed`
# set instead, atomically with the run. KEYS run, steps, unindexed.
_CREATE_RUN = _CREATE.replace(_INDEX_LINE, "redis.call('SADD', KEYS[3], ARGV[1])\n")

# KEYS run, steps[, unindexed]. ARGV token, status, progress, updated_at, budget_total_ms
# ('' = keep), trace ('' = keep), release_owner, has_step, step_id, step, ttl_ms (0: final status
# not reached)[, run_id]. The third key (a run's first commit on a cluster, see _CREATE_RUN) takes
# the run out of its slot's `unindexed` set: create_run had both writes acknowledged by then.
_COMMIT = """
local cur = redis.call('HMGET', KEYS[1], '{TOKEN}', '{STATUS}')
if not cur[1] then return {{-1}} end
if cur[1] ~= ARGV[1] then return {{-2, cur[1]}} end
redis.call('HSET', KEYS[1], '{STATUS}', ARGV[2], '{PROGRESS}', ARGV[3], '{UPDATED_AT}', ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], '{BUDGET_TOTAL_MS}', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], '{TRACE}', ARGV[6]) end
if ARGV[7] == '1' then
  redis.call('HDEL', KEYS[1], '{OWNER_HOST}', '{OWNER_PID}', '{OWNER_EXPIRES_AT}')
end
if ARGV[8] == '1' then redis.call('HSET', KEYS[2], ARGV[9], ARGV[10]) end
if ARGV[11] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[11])
  redis.call('PEXPIRE', KEYS[2], ARGV[11])
elseif cur[2] ~= 'running' then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
if KEYS[3] then redis.call('SREM', KEYS[3], ARGV[12]) end
return 0
"""

# KEYS run, steps. ARGV expected_token, new_token, owner_host, owner_pid, owner_expires_at,
# updated_at.
_CLAIM = """
local cur = redis.call('HMGET', KEYS[1], '{TOKEN}', '{STATUS}', '{OWNER_HOST}', '{OWNER_PID}',
  '{OWNER_EXPIRES_AT}')
if not cur[1] then return {{-1}} end
if cur[1] == ARGV[2] and cur[3] == ARGV[3] and cur[4] == ARGV[4] and cur[5] == ARGV[5] then
  return {{0}}
end
if cur[2] == 'completed' then return {{-3, cur[2]}} end
if cur[1] ~= ARGV[1] then return {{-2, cur[1]}} end
redis.call('HSET', KEYS[1], '{TOKEN}', ARGV[2], '{OWNER_HOST}', ARGV[3], '{OWNER_PID}', ARGV[4],
  '{OWNER_EXPIRES_AT}', ARGV[5], '{STATUS}', 'running', '{UPDATED_AT}', ARGV[6])
redis.call('PERSIST', KEYS[1])
redis.call('PERSIST', KEYS[2])
return {{0}}
"""

# KEYS run. ARGV token, owner_expires_at.
_RENEW = """
local cur = redis.call('HMGET', KEYS[1], '{TOKEN}', '{OWNER_HOST}')
if not cur[1] then return {{-1}} end
if cur[1] ~= ARGV[1] then return {{-2, cur[1]}} end
if not cur[2] then return {{-4}} end
redis.call('HSET', KEYS[1], '{OWNER_EXPIRES_AT}', ARGV[2])
return {{0}}
"""


class Script:
    """A Lua script run by EVALSHA (and loaded on NOSCRIPT, after a restart or a failover)."""

    def __init__(self, template: str) -> None:
        names = {k: v for k, v in vars(RunFields).items() if k.isupper()}
        self.source = template.format(**names)
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()


SCRIPTS = {
    name: Script(template)
    for name, template in (
        ("create", _CREATE),
        ("create_run", _CREATE_RUN),
        ("commit", _COMMIT),
        ("claim", _CLAIM),
        ("renew", _RENEW),
    )
}
"""The store's scripts by name; each checks the fencing token before it writes anything."""
