"""The Lua scripts of the Redis limiter. Each runs atomically inside Redis (EVALSHA).

Time is always Redis server time (``TIME``), never a client clock, so hosts with skewed clocks
agree on every lease. The scripts clean up after the dead themselves — no janitor process: a try
drops the holders whose lease ran out (and, when anyone waits, the tickets whose waiter stopped
refreshing them); a release does the same when anyone waits, before it wakes the next in line;
and every sorted set expires as a whole soon after its latest entry, so an abandoned key leaves
nothing behind.

Wake-ups: a script that frees a slot (or drops a dead holder or ticket) publishes the member of each
ticket now in reach to the channel of the limiter instance that owns the ticket. Waiters never
poll in a tight loop; they look again only when told, or after their ticket refresh interval.
"""

from __future__ import annotations

__all__ = ["FORGET", "RENEW", "SNAPSHOT", "TRY"]

_PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- Drop tickets whose waiter stopped refreshing them (it died); returns how many.
local function purge_tickets(q, qx, now)
  local dead = redis.call('ZRANGEBYSCORE', qx, '-inf', now)
  for _, m in ipairs(dead) do redis.call('ZREM', q, m) end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', qx, '-inf', now) end
  return #dead
end

-- How many tickets, from the head of the line, may take a slot now.
local function in_reach(limit, h, q, rated)
  local n = math.min(limit - redis.call('ZCARD', h), redis.call('ZCARD', q))
  if rated and n > 1 then n = 1 end  -- a rate is handed out in line order: head first
  return n
end

-- Tell the owners of the first n tickets (but not the caller) that a slot may be theirs.
local function wake(q, n, chan, skip)
  if n <= 0 then return end
  for _, m in ipairs(redis.call('ZRANGE', q, 0, n - 1)) do
    if m ~= skip then
      local inst = string.match(m, '^([^:]+):')
      if inst then redis.call('PUBLISH', chan .. inst, m) end
    end
  end
end

-- Let key k live at least ms more milliseconds (never shorter: another holder's lease may be
-- longer), so that a key whose every entry has lapsed vanishes by itself.
local function outlive(k, ms)
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, math.ceil(ms)) end
end
"""

TRY = (
    _PRELUDE
    + r"""
-- KEYS: holders, queue, tickets, rate, undone
-- ARGV: member, limit, lease_ms, rate_interval_ms (0: no rate), burst, wake channel prefix
-- Returns the integer 1 when granted (one reply line to read: the hot path), otherwise
-- {status, hint_ms, ahead, holders}: status 0: queued (wait for a wake-up, or hint_ms: when the
-- first lease or ticket would lapse); 2: queued behind the rate (retry in hint_ms); 3: this
-- acquisition was abandoned already (its undo overtook this call).
local h, q, qx, rk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local m, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local interval, burst, chan = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local rated = interval > 0
if redis.call('ZSCORE', KEYS[5], m) then return {3, 0, 0, 0} end
local now = now_ms()
-- drop holders whose lease ran out (their owner died) and, if anyone waits, dead tickets
local purged = redis.call('ZREMRANGEBYSCORE', h, '-inf', now)
local qlen = redis.call('ZCARD', q)
if qlen > 0 then
  local dead = purge_tickets(q, qx, now)
  purged, qlen = purged + dead, qlen - dead
end

if redis.call('ZSCORE', h, m) then  -- granted by an earlier call whose answer was lost
  redis.call('ZADD', h, now + ttl, m)
  outlive(h, ttl + 1)
  return 1
end

local held = redis.call('ZCARD', h)
local ahead, queued = qlen, false
if qlen > 0 then
  local rank = redis.call('ZRANK', q, m)
  if rank then ahead, queued = rank, true end
end

local status, hint = 0, 0
if ahead < limit - held then
  if not rated then
    status = 1
  elseif ahead == 0 then
    local tat = tonumber(redis.call('GET', rk)) or now
    if tat < now then tat = now end
    local allow_at = tat - (burst - 1) * interval
    if allow_at <= now then
      local next_tat = tat + interval
      redis.call('SET', rk, tostring(next_tat), 'PX', math.ceil(next_tat - now) + 1)
      status = 1
    else
      status, hint = 2, allow_at - now
    end
  end
end

if status == 1 then
  redis.call('ZADD', h, now + ttl, m)
  outlive(h, ttl + 1)
  if queued then
    redis.call('ZREM', q, m)
    redis.call('ZREM', qx, m)
  end
  -- a new head of a rated key must learn its rate wait; purged entries may have freed slots
  if purged > 0 or (queued and rated) then wake(q, in_reach(limit, h, q, rated), chan, m) end
  return 1
end

if queued then
  redis.call('ZADD', qx, now + ttl, m)  -- refresh: this waiter is alive
else
  local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
  local ticket = 1
  if #last > 0 then ticket = tonumber(last[2]) + 1 end
  redis.call('ZADD', q, ticket, m)
  redis.call('ZADD', qx, now + ttl, m)
end
outlive(q, ttl + 1)
outlive(qx, ttl + 1)
if purged > 0 then wake(q, in_reach(limit, h, q, rated), chan, m) end

if status == 0 then
  -- look again when the first lease or ticket would lapse, in case its owner died
  hint = ttl
  local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
  if #first > 0 then hint = math.min(hint, tonumber(first[2]) - now) end
  local tfirst = redis.call('ZRANGE', qx, 0, 0, 'WITHSCORES')
  if #tfirst > 0 and tfirst[1] ~= m then hint = math.min(hint, tonumber(tfirst[2]) - now) end
end
return {status, math.ceil(hint), ahead, held}
"""
)

FORGET = (
    _PRELUDE
    + r"""
-- KEYS: holders, queue, tickets, undone
-- ARGV: member, undo (1/0), limit, rated (1/0), wake channel prefix, lease_ms
-- Drops the member's slot and ticket (release, timeout, cancellation) and wakes the next in line.
-- An undo that finds nothing may have overtaken the member's try (sent on another connection
-- just before a cancellation): it leaves a mark, for one lease TTL, that refuses that try.
local h, q, qx, gone = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local m, undo, limit, rated, chan = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3]), ARGV[4] == '1', ARGV[5]
local removed = redis.call('ZREM', h, m)
local qlen = redis.call('ZCARD', q)
if qlen > 0 and redis.call('ZREM', q, m) == 1 then
  redis.call('ZREM', qx, m)
  removed, qlen = removed + 1, qlen - 1
end
if undo and removed == 0 then
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  redis.call('ZADD', gone, now + tonumber(ARGV[6]), m)
  outlive(gone, tonumber(ARGV[6]) + 1)
end
if qlen > 0 then  -- someone waits: clear out the dead, then wake whoever is now in reach
  local now = now_ms()
  local purged = redis.call('ZREMRANGEBYSCORE', h, '-inf', now) + purge_tickets(q, qx, now)
  if removed + purged > 0 then wake(q, in_reach(limit, h, q, rated), chan, m) end
end
return removed
"""
)

RENEW = (
    _PRELUDE
    + r"""
-- KEYS: holders.  ARGV: lease_ms, member...
-- Extends the leases of live members; returns the members whose lease was already gone.
local h, ttl = KEYS[1], tonumber(ARGV[1])
local now = now_ms()
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', h, ARGV[i]) then
    redis.call('ZADD', h, 'XX', now + ttl, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
outlive(h, ttl + 1)
return lost
"""
)

SNAPSHOT = (
    _PRELUDE
    + r"""
-- KEYS: holders, queue, tickets.  Read-only: {live holders, live tickets in line order}.
local h, q, qx = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local holders = redis.call('ZRANGEBYSCORE', h, '(' .. now, '+inf')
local waiting = {}
for _, m in ipairs(redis.call('ZRANGE', q, 0, -1)) do
  local exp = redis.call('ZSCORE', qx, m)
  if exp and tonumber(exp) > now then waiting[#waiting + 1] = m end
end
return {holders, waiting}
"""
)
