"""Sandbox seats: how many tasks hold a sandbox, across every runtime replica and restart.

A task needs a seat before its first action gets a sandbox, and keeps it until the task ends
(its sandbox is released). When every seat is taken, the task's order waits in Redis, in a
first-come-first-served queue, and holds nothing else: no worker, no connection, no timer. When a
seat frees, the task at the head of the queue takes it and its order is sent again.

Everything that decides is one Lua script, so two replicas never give away the same seat. The
keys (per sandbox pool):

- `seats`   HASH  task -> unix time it was seated
- `queue`   ZSET  task -> ticket (a counter: arrival order)
- `ticket`  STRING the counter
- `orders`  HASH  task -> the order that waits (JSON), until it is handled after admission
- `admitted` ZSET task -> unix time admitted while its order still waits to be sent again

The runtime owns these keys; the gateway only reads a task's position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

__all__ = ["Admission", "SandboxSeats", "queue_position", "seats_prefix"]


def seats_prefix(pool_name: str) -> str:
    return f"deckhands:seats:{pool_name}"


# KEYS: seats, queue, ticket, orders. ARGV: task, now, max, order json ('' when none).
# Returns {'seated', 0} or {'queued', position (1-based)}.
_ADMIT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'seated', 0} end
local free = tonumber(ARGV[3]) - redis.call('HLEN', KEYS[1])
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank then rank = redis.call('ZCARD', KEYS[2]) end
if rank < free then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'seated', 0}
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) == false then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], ARGV[1], ARGV[4]) end
return {'queued', rank + 1}
"""

# KEYS: seats, queue, orders, admitted. ARGV: now, max, resend_after_s.
# Seats the head of the queue while seats are free; returns the orders to send again: those of
# the tasks just seated, and those seated a while ago whose order was never handled (the
# replica that seated them died before sending them).
_PUMP = """
local out = {}
local free = tonumber(ARGV[2]) - redis.call('HLEN', KEYS[1])
while free > 0 do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #head == 0 then break end
  local task = head[1]
  redis.call('ZREM', KEYS[2], task)
  redis.call('HSET', KEYS[1], task, ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[1], task)
  free = free - 1
end
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1])
for _, task in ipairs(due) do
  local order = redis.call('HGET', KEYS[3], task)
  if order then
    table.insert(out, order)
    redis.call('ZADD', KEYS[4], tonumber(ARGV[1]) + tonumber(ARGV[3]), task)
  else
    redis.call('ZREM', KEYS[4], task)
  end
end
return out
"""

# KEYS: seats, queue, orders, admitted. ARGV: task.
_RELEASE = """
local held = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return held
"""


@dataclass(frozen=True)
class Admission:
    seated: bool
    position: int  # 1-based place in the queue; 0 when seated


class SandboxSeats:
    def __init__(self, redis: Redis, pool_name: str, max_seats: int) -> None:
        self.redis = redis
        self.pool_name = pool_name
        self.max_seats = max_seats
        prefix = seats_prefix(pool_name)
        self.seats_key = f"{prefix}:seats"
        self.queue_key = f"{prefix}:queue"
        self.ticket_key = f"{prefix}:ticket"
        self.orders_key = f"{prefix}:orders"
        self.admitted_key = f"{prefix}:admitted"
        self._admit = redis.register_script(_ADMIT)
        self._pump = redis.register_script(_PUMP)
        self._release = redis.register_script(_RELEASE)

    async def admit(self, task_id: str, order_json: str = "") -> Admission:
        """Seat the task if a seat is free and nobody queued before it; otherwise queue it
        (keeping `order_json` to send again once it is seated)."""
        outcome, position = await self._admit(
            keys=[self.seats_key, self.queue_key, self.ticket_key, self.orders_key],
            args=[task_id, repr(time.time()), self.max_seats, order_json],
        )
        seated = (outcome.decode() if isinstance(outcome, bytes) else outcome) == "seated"
        return Admission(seated=seated, position=int(position))

    async def pump(self, resend_after_s: float = 10.0) -> list[str]:
        """Seat queued tasks while seats are free; the orders to send again, oldest first."""
        orders = await self._pump(
            keys=[self.seats_key, self.queue_key, self.orders_key, self.admitted_key],
            args=[repr(time.time()), self.max_seats, resend_after_s],
        )
        return [o.decode() if isinstance(o, bytes) else str(o) for o in orders]

    async def handled(self, task_id: str) -> None:
        """The task's waiting order reached a runtime after it was seated: forget it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(self.orders_key, task_id)
        pipe.zrem(self.admitted_key, task_id)
        await pipe.execute()

    async def hold(self, task_id: str) -> None:
        """Count a task that holds a sandbox already (adopted after a restart), max or not."""
        await self.redis.hsetnx(self.seats_key, task_id, repr(time.time()))

    async def release(self, task_id: str) -> bool:
        """The task no longer holds a sandbox (or no longer wants one): free its seat."""
        held = await self._release(
            keys=[self.seats_key, self.queue_key, self.orders_key, self.admitted_key],
            args=[task_id],
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

    async def position(self, task_id: str) -> int | None:
        """The task's 1-based place in the queue, or None when it is not waiting."""
        rank = await self.redis.zrank(self.queue_key, task_id)
        return rank + 1 if isinstance(rank, int) else None


async def queue_position(redis: Redis, pool_name: str, task_id: str) -> int | None:
    """A task's 1-based place in its pool's queue for a seat, or None when it is not waiting."""
    rank = await redis.zrank(f"{seats_prefix(pool_name)}:queue", task_id)
    return rank + 1 if isinstance(rank, int) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
