"""A pool's sandbox seats in Redis: its keys, and the Lua scripts that change them.

Everything that decides who gets a seat (shared/admission.py says how) is one Lua script, so two
replicas never give away the same seat. The keys (per sandbox pool, under
`deckhands:seats:<pool>`):

- `seats`     HASH  task -> unix time it was seated (the gateway counts a tenant's from it)
- `starting`  ZSET  task -> unix time it was seated, until its sandbox started (or failed to)
- `owner`     HASH  task -> tenant, for each task seated or queued
- `held`      HASH  tenant -> seats its tasks hold
- `queue`     ZSET  task -> ticket (a counter: arrival order), every queued task
- `q:<tenant>` ZSET task -> ticket, plus BATCH_OFFSET (below) for a batch task:
               the tenant's own queue
- `waiting`   HASH  tenant -> tasks it has queued (only tenants with some)
- `queued_at` HASH  task -> unix time it joined the queue
- `ticket`    STRING the counter
- `orders`    HASH  task -> the order that waits (JSON), until it is handled after admission
- `admitted`  ZSET  task -> unix time admitted while its order still waits to be sent again
- `released`  LIST  unix times of the latest releases, newest first: the rate seats free at
- `batch`     SET   tasks seated as batch ones, until released: with `owner`, a starting
               task's kind (its tenant's interactive or batch tasks)
- `leaves_warm` SET  tasks seated while one of their kind still started, or in arrival order
               while younger ones still queued (a burst's rest, a backlog's head): their
               sandboxes leave the pool's last warm ones to whoever comes next (another
               tenant's task, an interactive one), until the task ends
- `max_seats` STRING the pool's seats, said by each replica (SandboxSeats.announce): whether a
               task the runtime has not seen yet will be seated (shared/seat_states.py)

The per-tenant queues are named inside the scripts, so these keys need one Redis (not a
cluster), which is what deckhands deploys. The runtime owns them; the gateway only reads.
"""

from __future__ import annotations

from redis.asyncio import Redis

__all__ = ["BATCH_OFFSET", "SeatScripts", "seats_prefix"]


# A batch task's rank is its ticket plus this: after every interactive one of its tenant. A
# ZSET score is a double, exact up to 2**53: tickets stay far below 2**40.
BATCH_OFFSET = 2**40


def seats_prefix(pool_name: str) -> str:
    return f"deckhands:seats:{pool_name}"


# The choice of the next seated task, shared by the scripts. prefix: the pool's key prefix.
# Returns the task seated, or false when nobody waits. A task's kind is its tenant and whether
# it is batch: the start slots past the pace are per kind.
_SEAT_NEXT = (
    f"""
local BATCH_OFFSET = {BATCH_OFFSET}
"""
    + """
local function kind_of(prefix, task)
  local tenant = redis.call('HGET', prefix .. ':owner', task) or ''
  if redis.call('SISMEMBER', prefix .. ':batch', task) == 1 then return tenant .. '|b' end
  return tenant .. '|i'
end

local function seat_next(prefix, weights, now, busy)
  local waiting = redis.call('HGETALL', prefix .. ':waiting')
  local best, best_rank, best_ticket, best_batch = nil, nil, nil, false
  for i = 1, #waiting, 2 do
    local tenant = waiting[i]
    local weight = tonumber(redis.call('HGET', weights, tenant) or '1') or 1
    if weight <= 0 then weight = 1 end
    local held = tonumber(redis.call('HGET', prefix .. ':held', tenant) or '0')
    local rank = (held + 1) / weight
    local head = redis.call('ZRANGE', prefix .. ':q:' .. tenant, 0, 0, 'WITHSCORES')
    if #head == 0 then
      redis.call('HDEL', prefix .. ':waiting', tenant)
    else
      local batch = tonumber(head[2]) >= BATCH_OFFSET
      local kind = tenant .. (batch and '|b' or '|i')
      if not (busy and busy[kind]) then
        local ticket = tonumber(redis.call('ZSCORE', prefix .. ':queue', head[1]))
        if best == nil or rank < best_rank or (rank == best_rank and ticket < best_ticket) then
          best, best_rank, best_ticket, best_batch = tenant, rank, ticket, batch
        end
      end
    end
  end
  if best == nil then return false end
  local task = redis.call('ZRANGE', prefix .. ':q:' .. best, 0, 0)[1]
  redis.call('ZREM', prefix .. ':q:' .. best, task)
  redis.call('ZREM', prefix .. ':queue', task)
  if redis.call('HINCRBY', prefix .. ':waiting', best, -1) <= 0 then
    redis.call('HDEL', prefix .. ':waiting', best)
  end
  redis.call('HSET', prefix .. ':seats', task, now)
  redis.call('ZADD', prefix .. ':starting', now, task)
  redis.call('HINCRBY', prefix .. ':held', best, 1)
  if best_batch then redis.call('SADD', prefix .. ':batch', task) end
  return task, best_ticket
end

local function seated_entry(prefix, task, now)
  local since = redis.call('HGET', prefix .. ':queued_at', task)
  redis.call('HDEL', prefix .. ':queued_at', task)
  local waited = 0
  if since then waited = tonumber(now) - tonumber(since) end
  return {task, redis.call('HGET', prefix .. ':owner', task) or '', tostring(waited)}
end

-- Seats the fairest while seats are free and fewer than `max_starting` (0: no limit) seated
-- tasks wait for their sandbox to start (entries seated before `stale_before` no longer
-- count). Past that pace, a kind (a tenant's interactive or batch tasks) with no sandbox
-- starting still gets a free seat: a start slot of its own, so that a tenant arriving during
-- another's flood, or an interactive task during its tenant's batch, waits for no start of the
-- flood (the engine takes a few more starts at once as fast). Each task seated but `asking`
-- waits in `admitted` (due now) for its order to be sent again. Returns the entries
-- {task, tenant, waited} of the tasks seated, and whether `asking` was one.
local function seat_while_free(prefix, weights, now, max, asking, max_starting, stale_before)
  local seated, mine = {}, false
  local free = tonumber(max) - redis.call('HLEN', prefix .. ':seats')
  local room = free
  redis.call('ZREMRANGEBYSCORE', prefix .. ':starting', '-inf', '(' .. stale_before)
  if tonumber(max_starting) > 0 then
    room = tonumber(max_starting) - redis.call('ZCARD', prefix .. ':starting')
  end
  -- The kinds with a sandbox starting: the pace's, and who leaves the warm sandboxes.
  local busy = {}
  for _, starting in ipairs(redis.call('ZRANGE', prefix .. ':starting', 0, -1)) do
    busy[kind_of(prefix, starting)] = true
  end
  local leaves = {}
  while free > 0 do
    local task, ticket
    if room > 0 or tonumber(max_starting) <= 0 then
      task, ticket = seat_next(prefix, weights, now, nil)
    else
      task, ticket = seat_next(prefix, weights, now, busy)
    end
    if not task then break end
    local kind = kind_of(prefix, task)
    leaves[task] = {ticket, busy[kind] == true}
    busy[kind] = true
    free = free - 1
    room = room - 1
    table.insert(seated, seated_entry(prefix, task, now))
    if task == asking then
      mine = true
    else
      redis.call('ZADD', prefix .. ':admitted', now, task)
    end
  end
  -- A task seated while one of its kind still starts (the rest of a burst), or in arrival
  -- order ahead of a backlog (every task still queued came later), leaves the pool's last
  -- warm sandboxes to whoever comes next: another tenant's task, an interactive one.
  local oldest = redis.call('ZRANGE', prefix .. ':queue', 0, 0, 'WITHSCORES')
  for task, why in pairs(leaves) do
    if why[2] or (#oldest > 0 and why[1] < tonumber(oldest[2])) then
      redis.call('SADD', prefix .. ':leaves_warm', task)
    end
  end
  return seated, mine
end
"""
)

# KEYS: none. ARGV: prefix, weights key, task, tenant, now, max, order json ('' when none),
# batch (0|1), batch offset, max starting, stale before, weak (0|1: an order that does not
# replace one kept already, a PrepareSandbox's beside an action's). Queues the task (once),
# then seats the fairest while seats are free.
# Returns {outcome, seated}: outcome 'seated' or 'queued' for this task; seated: for each task
# seated now, {task, tenant, seconds waited}. Another task seated here waits in `admitted`
# (due now) for its order to be sent again.
_ADMIT = (
    _SEAT_NEXT
    + """
local prefix, weights, task, tenant, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('HEXISTS', prefix .. ':seats', task) == 1 then
  if ARGV[7] ~= '' and redis.call('HGET', prefix .. ':orders', task) == ARGV[7] then
    -- Its own order, sent again once it was seated, is handled now: never again.
    redis.call('HDEL', prefix .. ':orders', task)
    redis.call('ZREM', prefix .. ':admitted', task)
  end
  return {'seated', {}}
end
if redis.call('ZSCORE', prefix .. ':queue', task) == false then
  local ticket = redis.call('INCR', prefix .. ':ticket')
  local rank = ticket
  if ARGV[8] == '1' then rank = ticket + tonumber(ARGV[9]) end
  redis.call('ZADD', prefix .. ':queue', ticket, task)
  redis.call('ZADD', prefix .. ':q:' .. tenant, rank, task)
  redis.call('HINCRBY', prefix .. ':waiting', tenant, 1)
  redis.call('HSET', prefix .. ':owner', task, tenant)
  redis.call('HSET', prefix .. ':queued_at', task, now)
end
local weak = ARGV[12] == '1'
if ARGV[7] ~= '' and (not weak or redis.call('HEXISTS', prefix .. ':orders', task) == 0) then
  redis.call('HSET', prefix .. ':orders', task, ARGV[7])
end
local seated, mine = seat_while_free(prefix, weights, now, ARGV[6], task, ARGV[10], ARGV[11])
if mine then
  if weak then
    -- Its own order is handled now; an action's kept before it is sent again by the pump.
    if redis.call('HGET', prefix .. ':orders', task) == ARGV[7] then
      redis.call('HDEL', prefix .. ':orders', task)
    elseif redis.call('HEXISTS', prefix .. ':orders', task) == 1 then
      redis.call('ZADD', prefix .. ':admitted', now, task)
    end
  end
  return {'seated', seated}
end
return {'queued', seated}
"""
)

# KEYS: none. ARGV: prefix, weights key, now, max, resend_after_s, max starting, stale before.
# Seats the fairest queued tasks while seats are free; returns {orders, seated}: the orders to
# send again (of the tasks just seated, and of those seated a while ago whose order was never
# handled: the replica that seated them died before sending them), and the tasks seated now
# as in _ADMIT.
_PUMP = (
    _SEAT_NEXT
    + """
local prefix, weights, now = ARGV[1], ARGV[2], ARGV[3]
local seated = seat_while_free(prefix, weights, now, ARGV[4], '', ARGV[6], ARGV[7])
local orders = {}
local due = redis.call('ZRANGEBYSCORE', prefix .. ':admitted', '-inf', now)
for _, task in ipairs(due) do
  local order = redis.call('HGET', prefix .. ':orders', task)
  if order then
    table.insert(orders, order)
    redis.call('ZADD', prefix .. ':admitted', tonumber(now) + tonumber(ARGV[5]), task)
  else
    redis.call('ZREM', prefix .. ':admitted', task)
  end
end
return {orders, seated}
"""
)

# Leaves the queue, if queued (the task's tenant from `owner`).
_UNQUEUE = """
local function unqueue(prefix, task)
  if redis.call('ZREM', prefix .. ':queue', task) == 0 then return end
  local tenant = redis.call('HGET', prefix .. ':owner', task)
  if tenant then
    redis.call('ZREM', prefix .. ':q:' .. tenant, task)
    if redis.call('HINCRBY', prefix .. ':waiting', tenant, -1) <= 0 then
      redis.call('HDEL', prefix .. ':waiting', tenant)
    end
  end
  redis.call('HDEL', prefix .. ':queued_at', task)
end
"""

# ARGV: prefix, task, tenant, now. Counts a task that holds a sandbox already, max or not.
_HOLD = (
    _UNQUEUE
    + """
local prefix, task, tenant, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
redis.call('ZREM', prefix .. ':starting', task)
if redis.call('HEXISTS', prefix .. ':seats', task) == 1 then return 0 end
unqueue(prefix, task)
redis.call('HSET', prefix .. ':seats', task, now)
redis.call('HSET', prefix .. ':owner', task, tenant)
redis.call('HINCRBY', prefix .. ':held', tenant, 1)
return 1
"""
)

# ARGV: prefix, task, order json. Forgets the task's kept order if it is this one.
_FORGET_ORDER = """
if redis.call('HGET', ARGV[1] .. ':orders', ARGV[2]) == ARGV[3] then
  redis.call('HDEL', ARGV[1] .. ':orders', ARGV[2])
  redis.call('ZREM', ARGV[1] .. ':admitted', ARGV[2])
  return 1
end
return 0
"""

# ARGV: prefix, task, now, releases kept. Returns 1 when the task held a seat.
_RELEASE = (
    _UNQUEUE
    + """
local prefix, task = ARGV[1], ARGV[2]
unqueue(prefix, task)
local held = redis.call('HDEL', prefix .. ':seats', task)
local tenant = redis.call('HGET', prefix .. ':owner', task)
if held == 1 then
  if tenant and redis.call('HINCRBY', prefix .. ':held', tenant, -1) <= 0 then
    redis.call('HDEL', prefix .. ':held', tenant)
  end
  redis.call('LPUSH', prefix .. ':released', ARGV[3])
  redis.call('LTRIM', prefix .. ':released', 0, tonumber(ARGV[4]) - 1)
end
redis.call('HDEL', prefix .. ':owner', task)
redis.call('HDEL', prefix .. ':orders', task)
redis.call('ZREM', prefix .. ':admitted', task)
redis.call('ZREM', prefix .. ':starting', task)
redis.call('SREM', prefix .. ':leaves_warm', task)
redis.call('SREM', prefix .. ':batch', task)
return held
"""
)


class SeatScripts:
    """The scripts, registered on a Redis to run on one pool's keys: those under `prefix`,
    which each call passes as its first argument (ARGV[1])."""

    def __init__(self, redis: Redis, pool_name: str) -> None:
        self.prefix = seats_prefix(pool_name)
        self.admit = redis.register_script(_ADMIT)
        self.pump = redis.register_script(_PUMP)
        self.hold = redis.register_script(_HOLD)
        self.release = redis.register_script(_RELEASE)
        self.forget_order = redis.register_script(_FORGET_ORDER)
