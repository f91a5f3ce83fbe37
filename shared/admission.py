"""Sandbox seats: how many tasks hold a sandbox, across every runtime replica and restart, and
who gets the next free one.

A task needs a seat before its first action gets a sandbox, and keeps it until the task ends
(its sandbox is released). When every seat is taken, the task's order waits in Redis and holds
nothing else: no worker, no connection, no timer. When a seat frees, it goes to the tenant
furthest below its share, weighted fair queuing on seats held:

- each tenant with queued tasks is ranked by (seats it holds + 1) / its weight, the seat it
  would hold next divided by its share; the lowest takes the seat (ties: whose head task came
  first). A tenant alone takes every seat; a quiet tenant's share goes to those who wait.
- within a tenant, interactive tasks go first, then batch ones, each first come first served.

Seats are given at the pace sandboxes start (`max_starting`, 0 for no such limit): a task seated
but whose sandbox has not started yet is *starting*, and while `max_starting` tasks are, the
next waits in the queue even if seats are free. The engine starts a few sandboxes at once as
fast as many (and many at once all finish late), so this costs a burst nothing. A tenant with
no sandbox starting still takes a free seat past that pace (a start slot of its own): a tenant
that comes during another's flood waits for no start of the flood. A starting entry older than
`start_stale_s` (its replica died mid-start) stops counting.

Weights are the operator's (per tenant, `seat_weight` in the tenant's limits, 1 by default),
kept by the gateway in `deckhands:seat-weights` (HASH tenant -> weight); the scripts only read
them.

Everything that decides is one Lua script, so two replicas never give away the same seat. The
keys (per sandbox pool, under `deckhands:seats:<pool>`):

- `seats`     HASH  task -> unix time it was seated (the gateway counts a tenant's from it)
- `starting`  ZSET  task -> unix time it was seated, until its sandbox started (or failed to)
- `owner`     HASH  task -> tenant, for each task seated or queued
- `held`      HASH  tenant -> seats its tasks hold
- `queue`     ZSET  task -> ticket (a counter: arrival order), every queued task
- `q:<tenant>` ZSET task -> ticket, plus BATCH_OFFSET for a batch task: the tenant's own queue
- `waiting`   HASH  tenant -> tasks it has queued (only tenants with some)
- `queued_at` HASH  task -> unix time it joined the queue
- `ticket`    STRING the counter
- `orders`    HASH  task -> the order that waits (JSON), until it is handled after admission
- `admitted`  ZSET  task -> unix time admitted while its order still waits to be sent again
- `released`  LIST  unix times of the latest releases, newest first: the rate seats free at

The per-tenant queues are named inside the scripts, so these keys need one Redis (not a
cluster), which is what deckhands deploys. The runtime owns them; the gateway only reads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

__all__ = [
    "NO_TENANT",
    "WEIGHTS_KEY",
    "Admission",
    "QueuePlace",
    "SandboxSeats",
    "Seating",
    "queue_place",
    "queue_position",
    "seats_prefix",
]

# The weights of tenants (HASH tenant -> weight), written by the gateway for every pool.
WEIGHTS_KEY = "deckhands:seat-weights"
# The tenant of a task made before tasks named theirs (an order of an older controller).
NO_TENANT = "-"
# A batch task's rank is its ticket plus this: after every interactive one of its tenant. A
# ZSET score is a double, exact up to 2**53: tickets stay far below 2**40.
BATCH_OFFSET = 2**40
_RELEASES_KEPT = 100
_RATE_WINDOW_S = 600.0

# The choice of the next seated task, shared by the scripts. prefix: the pool's key prefix.
# Returns the task seated, or false when nobody waits.
_SEAT_NEXT = """
local function seat_next(prefix, weights, now, busy)
  local waiting = redis.call('HGETALL', prefix .. ':waiting')
  local best, best_rank, best_ticket = nil, nil, nil
  for i = 1, #waiting, 2 do
    local tenant = waiting[i]
    local weight = tonumber(redis.call('HGET', weights, tenant) or '1') or 1
    if weight <= 0 then weight = 1 end
    local held = tonumber(redis.call('HGET', prefix .. ':held', tenant) or '0')
    local rank = (held + 1) / weight
    local head = redis.call('ZRANGE', prefix .. ':q:' .. tenant, 0, 0)
    if #head == 0 then
      redis.call('HDEL', prefix .. ':waiting', tenant)
    elseif not (busy and busy[tenant]) then
      local ticket = tonumber(redis.call('ZSCORE', prefix .. ':queue', head[1]))
      if best == nil or rank < best_rank or (rank == best_rank and ticket < best_ticket) then
        best, best_rank, best_ticket = tenant, rank, ticket
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
  return task
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
-- count). Past that pace, a tenant with no sandbox starting still gets a free seat: a start
-- slot of its own, so that a tenant arriving during another's flood waits for no start of the
-- flood (the engine takes a few more starts at once as fast). Each task seated but `asking`
-- waits in `admitted` (due now) for its order to be sent again. Returns the entries
-- {task, tenant, waited} of the tasks seated, and whether `asking` was one.
local function seat_while_free(prefix, weights, now, max, asking, max_starting, stale_before)
  local seated, mine = {}, false
  local free = tonumber(max) - redis.call('HLEN', prefix .. ':seats')
  local room = free
  local busy = nil
  if tonumber(max_starting) > 0 then
    redis.call('ZREMRANGEBYSCORE', prefix .. ':starting', '-inf', '(' .. stale_before)
    room = tonumber(max_starting) - redis.call('ZCARD', prefix .. ':starting')
    busy = {}
    for _, starting in ipairs(redis.call('ZRANGE', prefix .. ':starting', 0, -1)) do
      busy[redis.call('HGET', prefix .. ':owner', starting) or ''] = true
    end
  end
  while free > 0 do
    local task
    if room > 0 then
      task = seat_next(prefix, weights, now, nil)
    else
      task = seat_next(prefix, weights, now, busy)
    end
    if not task then break end
    if busy then busy[redis.call('HGET', prefix .. ':owner', task) or ''] = true end
    free = free - 1
    room = room - 1
    table.insert(seated, seated_entry(prefix, task, now))
    if task == asking then
      mine = true
    else
      redis.call('ZADD', prefix .. ':admitted', now, task)
    end
  end
  return seated, mine
end
"""

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

# ARGV: prefix, task, now, releases kept. Returns 1 when the task held a seat.
# ARGV: prefix, task, order json. Forgets the task's kept order if it is this one.
_FORGET_ORDER = """
if redis.call('HGET', ARGV[1] .. ':orders', ARGV[2]) == ARGV[3] then
  redis.call('HDEL', ARGV[1] .. ':orders', ARGV[2])
  redis.call('ZREM', ARGV[1] .. ':admitted', ARGV[2])
  return 1
end
return 0
"""

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
return held
"""
)


@dataclass(frozen=True)
class Seating:
    """A task given a seat from the queue: whose, and how long it waited (for the metrics)."""

    task_id: str
    tenant_id: str
    waited_s: float


@dataclass(frozen=True)
class Admission:
    seated: bool
    position: int  # 1-based place in the queue; 0 when seated
    seatings: tuple[Seating, ...] = ()  # every task seated by this admission, this one too


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued task stands: `position` is 1 + the tasks to be seated before it if every
    tenant kept the seats it holds (a seat its own tenant frees moves it up sooner), and
    `estimate_s` is that many seats at the rate seats freed lately (None: none freed lately)."""

    position: int
    estimate_s: float | None


class SandboxSeats:
    def __init__(
        self,
        redis: Redis,
        pool_name: str,
        max_seats: int,
        max_starting: int = 0,
        start_stale_s: float = 120.0,
    ) -> None:
        self.redis = redis
        self.pool_name = pool_name
        self.max_seats = max_seats
        self.max_starting = max_starting
        self.start_stale_s = start_stale_s
        self.prefix = seats_prefix(pool_name)
        self.seats_key = f"{self.prefix}:seats"
        self.queue_key = f"{self.prefix}:queue"
        self._admit = redis.register_script(_ADMIT)
        self._pump = redis.register_script(_PUMP)
        self._hold = redis.register_script(_HOLD)
        self._release = redis.register_script(_RELEASE)
        self._forget_order = redis.register_script(_FORGET_ORDER)

    async def admit(
        self,
        task_id: str,
        order_json: str = "",
        *,
        tenant_id: str | None = None,
        batch: bool = False,
        weak: bool = False,
    ) -> Admission:
        """Seat the task if a seat is free and the fair order puts it first; otherwise queue it
        (keeping `order_json` to send again once it is seated; a `weak` one, a PrepareSandbox,
        never replaces an order kept already, and is forgotten when the task is seated now).
        Seats freed meanwhile go to whoever the fair order names: their orders are sent again by
        the next `pump`."""
        outcome, seated = await self._admit(
            keys=[],
            args=[
                self.prefix,
                WEIGHTS_KEY,
                task_id,
                tenant_id or NO_TENANT,
                repr(time.time()),
                self.max_seats,
                order_json,
                1 if batch else 0,
                BATCH_OFFSET,
                *self._start_limits(),
                1 if weak else 0,
            ],
        )
        seatings = tuple(_seating(entry) for entry in seated)
        if _text(outcome) == "seated":
            return Admission(seated=True, position=0, seatings=seatings)
        place = await queue_place(self.redis, self.pool_name, task_id)
        return Admission(seated=False, position=place.position if place else 1, seatings=seatings)

    async def pump(self, resend_after_s: float = 10.0) -> tuple[list[str], list[Seating]]:
        """Seat queued tasks while seats are free: the orders to send again (oldest first) and
        the tasks seated now."""
        orders, seated = await self._pump(
            keys=[],
            args=[
                self.prefix,
                WEIGHTS_KEY,
                repr(time.time()),
                self.max_seats,
                resend_after_s,
                *self._start_limits(),
            ],
        )
        return [_text(o) for o in orders], [_seating(entry) for entry in seated]

    def _start_limits(self) -> tuple[int, str]:
        return self.max_starting, repr(time.time() - self.start_stale_s)

    async def started(self, task_id: str) -> bool:
        """The task's sandbox started (or failed to): it no longer counts as starting. True when
        it did, so a start slot is free for the next queued task (`pump`)."""
        return bool(await self.redis.zrem(f"{self.prefix}:starting", task_id))

    async def starting(self) -> int:
        """Tasks seated whose sandbox has not started yet."""
        return int(await self.redis.zcard(f"{self.prefix}:starting"))

    async def census(self) -> tuple[int, int, int]:
        """(seats taken, tasks queued, seated tasks whose sandbox is still starting)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.seats_key)
        pipe.zcard(self.queue_key)
        pipe.zcard(f"{self.prefix}:starting")
        taken, queued, starting = await pipe.execute()
        return int(taken), int(queued), int(starting)

    async def handled(self, task_id: str) -> None:
        """The task's waiting order reached a runtime after it was seated: forget it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(f"{self.prefix}:orders", task_id)
        pipe.zrem(f"{self.prefix}:admitted", task_id)
        await pipe.execute()

    async def handled_order(self, task_id: str, order_json: str) -> None:
        """`order_json`, if it is the order kept for the task, reached a runtime that had
        nothing to do with it (a preparation whose sandbox runs already): forget it, or the
        pump sends it again every resend_after_s for as long as the task runs. Another order
        kept (an action's) stays."""
        await self._forget_order(keys=[], args=[self.prefix, task_id, order_json])

    async def hold(self, task_id: str, tenant_id: str | None = None) -> None:
        """Count a task that holds a sandbox already (adopted after a restart), max or not."""
        await self._hold(
            keys=[], args=[self.prefix, task_id, tenant_id or NO_TENANT, repr(time.time())]
        )

    async def release(self, task_id: str) -> bool:
        """The task no longer holds a sandbox (or no longer wants one): free its seat."""
        held = await self._release(
            keys=[], args=[self.prefix, task_id, repr(time.time()), _RELEASES_KEPT]
        )
        return bool(held)

    async def seated(self) -> dict[str, float]:
        raw = await self.redis.hgetall(self.seats_key)
        return {_text(k): float(_text(v)) for k, v in raw.items()}

    async def counts(self) -> tuple[int, int]:
        """(seats taken, tasks queued)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.seats_key)
        pipe.zcard(self.queue_key)
        taken, queued = await pipe.execute()
        return int(taken), int(queued)

    async def tenants(self) -> dict[str, tuple[int, int]]:
        """Per tenant: (seats held, tasks queued)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(f"{self.prefix}:held")
        pipe.hgetall(f"{self.prefix}:waiting")
        held, waiting = await pipe.execute()
        out: dict[str, tuple[int, int]] = {}
        for tenant, count in held.items():
            out[_text(tenant)] = (int(count), 0)
        for tenant, count in waiting.items():
            seats, _ = out.get(_text(tenant), (0, 0))
            out[_text(tenant)] = (seats, int(count))
        return out

    async def position(self, task_id: str) -> int | None:
        """The task's 1-based place in the fair order, or None when it is not waiting."""
        place = await queue_place(self.redis, self.pool_name, task_id)
        return None if place is None else place.position


def seats_prefix(pool_name: str) -> str:
    return f"deckhands:seats:{pool_name}"


async def queue_place(redis: Redis, pool_name: str, task_id: str) -> QueuePlace | None:
    """Where a queued task stands in its pool's fair order (None when it is not waiting).

    Seats go, one by one, to the tenant whose next seat is lowest in (held + 1) / weight; so
    the k-th queued task of a tenant holding h seats has key (h + k) / w, and the tasks ahead of
    one are those with a lower key (or the same key and an earlier head)."""
    prefix = seats_prefix(pool_name)
    pipe = redis.pipeline(transaction=False)
    pipe.hget(f"{prefix}:owner", task_id)
    pipe.zscore(f"{prefix}:queue", task_id)
    pipe.hgetall(f"{prefix}:waiting")
    pipe.hgetall(f"{prefix}:held")
    pipe.hgetall(WEIGHTS_KEY)
    pipe.lrange(f"{prefix}:released", 0, -1)
    owner, ticket, waiting_raw, held_raw, weights_raw, released = await pipe.execute()
    if owner is None or ticket is None:
        return None
    own = _text(owner)
    rank = await redis.zrank(f"{prefix}:q:{own}", task_id)
    if not isinstance(rank, int):
        return None
    waiting = {_text(t): int(n) for t, n in waiting_raw.items()}
    held = {_text(t): int(n) for t, n in held_raw.items()}
    weights = {_text(t): _weight(w) for t, w in weights_raw.items()}

    def key(tenant: str, k: int) -> float:
        return (held.get(tenant, 0) + k) / weights.get(tenant, 1.0)

    mine = key(own, rank + 1)
    ahead = rank
    for tenant, queued in waiting.items():
        if tenant == own or queued <= 0:
            continue
        # Its k-th task comes first when (held + k) / w < mine, i.e. k < x; at k == x (a tie)
        # the earlier ticket does.
        x = mine * weights.get(tenant, 1.0) - held.get(tenant, 0)
        tied = round(x)
        if abs(x - tied) < 1e-9:
            ahead += max(0, min(queued, tied - 1))
            if 1 <= tied <= queued and await _ticket_of(redis, prefix, tenant, tied) < float(
                ticket
            ):
                ahead += 1
        else:
            ahead += max(0, min(queued, math.ceil(x) - 1))
    position = ahead + 1
    return QueuePlace(position=position, estimate_s=_estimate(position, released))


async def queue_position(redis: Redis, pool_name: str, task_id: str) -> int | None:
    """A task's 1-based place in its pool's fair order for a seat, or None when not waiting."""
    place = await queue_place(redis, pool_name, task_id)
    return None if place is None else place.position


async def _ticket_of(redis: Redis, prefix: str, tenant: str, k: int) -> float:
    """The arrival ticket of the tenant's k-th queued task (infinity: gone meanwhile)."""
    tasks = await redis.zrange(f"{prefix}:q:{tenant}", k - 1, k - 1)
    head = tasks[0] if tasks else None
    score = await redis.zscore(f"{prefix}:queue", head) if isinstance(head, bytes | str) else None
    return math.inf if score is None else float(score)


def _estimate(position: int, released: list[bytes | str]) -> float | None:
    """Seconds until `position` seats have freed, at the rate of the recent releases."""
    now = time.time()
    times = [t for t in (float(_text(r)) for r in released) if now - t <= _RATE_WINDOW_S]
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    if span <= 0:
        return None
    rate = (len(times) - 1) / span
    return round(position / rate, 1)


def _seating(entry: list[bytes | str]) -> Seating:
    task, tenant, waited = (_text(part) for part in entry)
    return Seating(task_id=task, tenant_id=tenant, waited_s=max(0.0, float(waited)))


def _weight(raw: bytes | str) -> float:
    try:
        weight = float(_text(raw))
    except ValueError:
        return 1.0
    return weight if weight > 0 else 1.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
