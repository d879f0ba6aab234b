"""The Lua scripts of the Redis checkpoint store, and the run hash's field names they use.

The keys they write are built by :class:`chainrt.redis.keys.StoreKeys` (every Redis key chainrt
uses is built in that one module; ``docs/redis-cluster.md`` lists them). Layout, with the default
prefix ``chainrt``::

    chainrt:{<run_id>}:run      hash: the run (see the field names below)
    chainrt:{<run_id>}:steps    hash: step_id -> StepRecord JSON
    chainrt:runs                sorted set: run_id scored by created_at (listing index)
    chainrt:{<ix>}:status:<s>   sorted set: the run ids whose status is <s>, by created_at
    chainrt:{<ix>}:chain:<name> sorted set: the run ids of chain <name>, by created_at
    chainrt:{<ix>}:chain-status:<s>:<name>
                                sorted set: the run ids of chain <name> whose status is <s>
    chainrt:{<ix>}:chains       set: the chain names that have a chain set (for the sweep)
    chainrt:{<ix>}:lists-v2     string: set once every run is in the three indexes above

``<ix>`` is a hash tag of the listing index's own Redis Cluster slot
(:attr:`chainrt.redis.keys.StoreKeys.lists_tag`), so that the indexes can be written together by
one script on a cluster too. On one node the
scripts that change a run's status (``create``, ``claim``, a commit to another status than
``running``) move the run between the status sets, and between its chain's chain-status sets,
in the same script; a step commit (status
``running`` again) leaves them alone. On a cluster the run's script cannot reach the index's slot:
the index script follows it (``index_run``, ``index_status``), and a reader drops an entry whose
run has another status (or has expired) as it meets it. The run's own script (``claim_marked``,
``commit_marked``) puts the run into its slot's ``unindexed`` set atomically with the change of
status; the store takes it out once ``index_status`` is acknowledged, and a process killed in
between leaves it there for the repair, which puts the run into the sets of the status it has.

    chainrt:{<tag>}:unindexed   set (Redis Cluster only): run ids of the slot whose index entry,
                                or whose move between the status sets, is not known to be
                                written (``<tag>``: see :func:`chainrt.redis.keys.slot_tag`)

The ``{<run_id>}`` hash tag puts all keys of one run in one Redis Cluster slot, so a Lua script
can write them atomically. The listing index spans runs and lives in a slot of its own: it is a
best-effort secondary structure, and readers tolerate entries whose run has expired. On one Redis
node the ``create`` script adds the run to the index in the same round trip. On a Redis Cluster a
script may only touch keys of one slot: ``create_run`` writes the run and adds its id to the
``unindexed`` set of the run's own slot (one atomic script), while the index entry is sent at the
same time to the index's master. The run's first commit takes the id out of that set again. A
process that dies between the two writes leaves the id in the set, and ``list_runs`` puts every
such run back into the index (``_cluster_index``): the set is what finds it again.

The scripts are formatted from the field names of :class:`RunFields`, so the whole run hash
reads in one file.
"""

from __future__ import annotations

import hashlib
from typing import get_args

from .._records import RunStatus

__all__ = ["SCRIPTS", "STATUSES", "RunFields", "Script"]

STATUSES: tuple[str, ...] = get_args(RunStatus)
"""Every run status, in the order of ``StoreKeys.status_sets`` (the scripts' key order)."""


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


# Script replies: {0} done, {-1} no such run, {-2, token} fenced, {-3, status} completed,
# {-4} no owner lease, {-5} exists. Field names are formatted in from RunFields. Each script is
# safe to run twice (a retry after a lost reply): its second run finds its own write.

# The run also goes into the set of its status, that of its chain and that of both (one node:
# one script).
_INDEX_LINE = """redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
redis.call('SADD', KEYS[6], ARGV[12])
redis.call('ZADD', KEYS[7], ARGV[5], ARGV[1])
"""

# KEYS run, steps, index, by_status(status), by_chain(chain), chains, by_chain_status(chain,
# status). ARGV run_id, record, status, token, created_at, updated_at, has_owner, owner_host,
# owner_pid, owner_expires_at, ttl_ms (0: none), chain.
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

# Moves the run ARGV[n] (created at `at`) from the status set of `old` into that of `new`; the
# status sets are KEYS[first], KEYS[first + 1] ... in the order of STATUSES.
_STATUS_ORDER = "{{" + ", ".join(f"['{s}'] = {i}" for i, s in enumerate(STATUSES)) + "}}"
_MOVE = (
    """
local function move(first, old, new, at, run_id)
  local order = """
    + _STATUS_ORDER
    + """
  if old and order[old] then redis.call('ZREM', KEYS[first + order[old]], run_id) end
  if order[new] then redis.call('ZADD', KEYS[first + order[new]], at, run_id) end
end
"""
)
_N = len(STATUSES)
# After the status sets at KEYS[first]: the run's chain's chain-status sets, when the caller gave
# them (it knows the run's chain; one whose record it could not read gives none).
_MOVE_IN_CHAIN = (
    "if #KEYS >= {first} + 2 * "
    + str(_N)
    + " - 1 then move({first} + "
    + str(_N)
    + ", {args}) end\n"
)


def _move_in_chain(first: int, args: str) -> str:
    return _MOVE_IN_CHAIN.replace("{first}", str(first)).replace("{args}", args)


# KEYS run, steps[, unindexed]. ARGV token, status, progress, updated_at, budget_total_ms
# ('' = keep), trace ('' = keep), release_owner, has_step, step_id, step, ttl_ms (0: final status
# not reached)[, run_id]. The third key (a run's first commit on a cluster, see _CREATE_RUN) takes
# the run out of its slot's `unindexed` set: create_run had both writes acknowledged by then.
_COMMIT = """
local cur = redis.call('HMGET', KEYS[1], '{TOKEN}', '{STATUS}')
if not cur[1] then return {{-1}} end
if cur[1] ~= ARGV[1] then return {{-2, cur[1]}} end
if cur[2] ~= ARGV[2] and cur[2] ~= 'running' and cur[2] ~= 'queued' and cur[2] ~= 'waiting' then
  return {{-3, cur[2]}}
end
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
_UNINDEXED_LINE = "if KEYS[3] then redis.call('SREM', KEYS[3], ARGV[12]) end\n"

# One node, a commit to another status than `running` (a run ends, is cancelled ...): the commit,
# and the run moves between the status sets and between its chain's chain-status sets. KEYS run,
# steps, the status sets (STATUSES order)[, the chain-status sets of the run's chain (the same
# order)]. ARGV those of the commit, then the run id (12th).
_COMMIT_STATUS = _MOVE + _COMMIT.replace(
    _UNINDEXED_LINE,
    "if cur[2] ~= ARGV[2] then\n"
    "  local at = redis.call('HGET', KEYS[1], '{CREATED_AT}')\n"
    "  move(3, cur[2], ARGV[2], at, ARGV[12])\n  "
    + _move_in_chain(3, "cur[2], ARGV[2], at, ARGV[12]")
    + "end\n",
)

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
_CLAIMED_LINE = "redis.call('PERSIST', KEYS[2])\nreturn {{0}}\n"

# One node: the claim, and the run moves into the `running` sets. KEYS run, steps, the status
# sets[, the chain-status sets of the run's chain]. ARGV those of the claim, then the run id (7th).
_CLAIM_STATUS = _MOVE + _CLAIM.replace(
    _CLAIMED_LINE,
    "redis.call('PERSIST', KEYS[2])\n"
    "local at = redis.call('HGET', KEYS[1], '{CREATED_AT}')\n"
    "move(3, cur[2], 'running', at, ARGV[7])\n"
    + _move_in_chain(3, "cur[2], 'running', at, ARGV[7]")
    + "return {{0}}\n",
)

# Redis Cluster, a commit to another status than `running`: the commit, and the run id into its
# slot's `unindexed` set, atomically (the sets' move, `index_status`, goes to another slot next;
# acknowledged, it takes the id out again; cut short, the repair moves the run from the set).
# KEYS run, steps, unindexed. ARGV those of the commit, then the run id (12th).
_COMMIT_MARKED = _COMMIT.replace(_UNINDEXED_LINE, "redis.call('SADD', KEYS[3], ARGV[12])\n")

# Redis Cluster: the claim, and the run id into its slot's `unindexed` set (as _COMMIT_MARKED).
# KEYS run, steps, unindexed. ARGV those of the claim, then the run id (7th).
_CLAIM_MARKED = _CLAIM.replace(
    _CLAIMED_LINE,
    "redis.call('PERSIST', KEYS[2])\nredis.call('SADD', KEYS[3], ARGV[7])\nreturn {{0}}\n",
)

# On a cluster, beside the run's own script (in the index's slot), and to index the runs created
# before the status and chain sets: KEYS index, by_chain(chain), chains, the status sets, then the
# chain's chain-status sets. ARGV run_id, created_at, status, chain. It only adds: a run whose
# status changed meanwhile may stay in the sets of the status read before, which readers skip
# (they check each run's status).
_INDEX_RUN = (
    _MOVE
    + """
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[4])
move(4, nil, ARGV[3], ARGV[2], ARGV[1])
"""
    + _move_in_chain(4, "nil, ARGV[3], ARGV[2], ARGV[1]")
    + """return 0
"""
)

# On a cluster, after a script that changed a run's status: out of every other status set, into
# that of its status (scored by its index entry; nothing if the run has none), and the same in
# its chain's chain-status sets. KEYS index, the status sets[, the chain's chain-status sets].
# ARGV run_id, status.
_INDEX_STATUS = (
    _MOVE
    + """
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not at then return 0 end
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
move(2, nil, ARGV[2], at, ARGV[1])
"""
    + _move_in_chain(2, "nil, ARGV[2], at, ARGV[1]")
    + """return 0
"""
)

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
        ("commit_status", _COMMIT_STATUS),
        ("commit_marked", _COMMIT_MARKED),
        ("claim", _CLAIM),
        ("claim_status", _CLAIM_STATUS),
        ("claim_marked", _CLAIM_MARKED),
        ("index_run", _INDEX_RUN),
        ("index_status", _INDEX_STATUS),
        ("renew", _RENEW),
    )
}
"""The store's scripts by name; each checks the fencing token before it writes anything."""
