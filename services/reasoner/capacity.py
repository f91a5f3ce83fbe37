"""An LLM's capacity, shared by every reasoner replica and granted fairly between tenants.

Per model (as the operator names it in DECKHANDS_LLM_CAPACITY), up to three limits hold across
the deployment: calls in flight at once, requests per minute and tokens per minute (sliding 60 s
windows). A call first takes a lease here; one Lua script decides, so two replicas never grant
the same room. When a provider answers 429, the model is paused for the whole deployment until
its Retry-After (`pause`), instead of every task retrying on its own, and capped for a while
at the calls it had in flight then, so that the waiting calls do not all rush at it again.

When room is scarce, tenants that want some are served by the seat weights
(shared.admission.WEIGHTS_KEY): the room goes to the wanting tenant with the lowest
(leases it held in the last minute + 1) / weight. Within a replica, a tenant's calls wait in
arrival order (an interactive call ahead of the tenant's batch ones), and only the first of
them asks Redis, so the polling is per tenant, not per call.

Keys, under `deckhands:llm:<model>`:
- `inflight` ZSET lease -> when it expires (a replica that died mid-call frees it then)
- `recent`   ZSET lease -> when it was granted (the last 60 s: requests per minute)
- `tokens`   HASH lease -> tokens (estimated at the grant, the real count at the release)
- `tenant`   HASH lease -> tenant, for every lease in `inflight` or `recent`
- `wanting`  HASH tenant -> when it last asked in vain (wanting for 2 s after that)
- `paused_until` STRING unix time: a provider's 429 asked to wait until then
- `learned`  STRING the calls in flight when the provider last refused one: a cap for 30 s
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.admission import NO_TENANT, WEIGHTS_KEY
from shared.events import TaskPriority

from .metrics import LLM_CAPACITY_WAIT, LLM_CAPACITY_WAITING, LLM_PAUSES, LLM_TOKENS_GRANTED
from .settings import ModelLimits

__all__ = ["CapacityGate", "CapacityWait", "Lease", "WaitNotice"]

log = logging.getLogger("deckhands.reasoner.capacity")

_WINDOW_S = 60.0
_WANTING_S = 2.0
# How often the first waiting call of a tenant asks again when nothing says when room frees
# (calls in flight, or another tenant's turn); a release on this replica wakes it sooner.
_POLL_S = 0.1
_MAX_SLEEP_S = 1.0  # asks again at least this often: its want must stay fresh
_LEARNED_S = 30  # how long a 429 caps the model at the calls it had in flight

# ARGV: prefix, weights key, lease, tenant, now, estimated tokens, max concurrent (0: none),
# requests per minute (0: none), tokens per minute (0: none), lease ttl, more (1: the tenant
# has more calls waiting here). Returns {granted (0|1), seconds to wait, why}.
_ACQUIRE = """
local prefix, weights, lease, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = tonumber(ARGV[5])
local estimate, max_conc = tonumber(ARGV[6]), tonumber(ARGV[7])
local rpm, tpm = tonumber(ARGV[8]), tonumber(ARGV[9])
local inflight, recent = prefix .. ':inflight', prefix .. ':recent'
local tokens, owners, wanting = prefix .. ':tokens', prefix .. ':tenant', prefix .. ':wanting'
redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', recent, '-inf', now - 60)) do
  redis.call('HDEL', tokens, old)
  if not redis.call('ZSCORE', inflight, old) then redis.call('HDEL', owners, old) end
end
redis.call('ZREMRANGEBYSCORE', recent, '-inf', now - 60)
local paused = tonumber(redis.call('GET', prefix .. ':paused_until') or '0')
if paused > now then return {0, tostring(paused - now), 'paused'} end
local learned = tonumber(redis.call('GET', prefix .. ':learned') or '0')
if learned > 0 and (max_conc == 0 or learned < max_conc) then max_conc = learned end
if max_conc == 0 and rpm == 0 and tpm == 0 then
  redis.call('ZADD', inflight, now + tonumber(ARGV[10]), lease)
  return {1, '0', ''}
end
local function want(wait, why)
  redis.call('HSET', wanting, tenant, now)
  return {0, tostring(wait), why}
end
if max_conc > 0 and redis.call('ZCARD', inflight) >= max_conc then
  return want(0, 'concurrent calls')
end
local oldest = redis.call('ZRANGE', recent, 0, 0, 'WITHSCORES')
local until_oldest = 0
if #oldest > 0 then until_oldest = tonumber(oldest[2]) + 60 - now end
if rpm > 0 and redis.call('ZCARD', recent) >= rpm then
  return want(until_oldest, 'requests per minute')
end
if tpm > 0 then
  local used = 0
  for _, n in ipairs(redis.call('HVALS', tokens)) do used = used + tonumber(n) end
  if used > 0 and used + estimate > tpm then return want(until_oldest, 'tokens per minute') end
end
-- Room: is it this tenant's turn?
local others = redis.call('HGETALL', wanting)
if #others > 0 then
  local usage = {}
  for i, value in ipairs(redis.call('HVALS', owners)) do
    usage[value] = (usage[value] or 0) + 1
  end
  local function key(t)
    local w = tonumber(redis.call('HGET', weights, t) or '1') or 1
    if w <= 0 then w = 1 end
    return ((usage[t] or 0) + 1) / w
  end
  local mine = key(tenant)
  for i = 1, #others, 2 do
    local t, since = others[i], tonumber(others[i + 1])
    if since < now - 2 then
      redis.call('HDEL', wanting, t)
    elseif t ~= tenant and key(t) < mine then
      return want(0, 'other tenants first')
    end
  end
end
if ARGV[11] == '1' then
  redis.call('HSET', wanting, tenant, now)
else
  redis.call('HDEL', wanting, tenant)
end
redis.call('ZADD', inflight, now + tonumber(ARGV[10]), lease)
redis.call('ZADD', recent, now, lease)
redis.call('HSET', tokens, lease, estimate)
redis.call('HSET', owners, lease, tenant)
return {1, '0', ''}
"""

# ARGV: prefix, lease, tokens used (-1: unknown, keep the estimate).
_RELEASE = """
local prefix, lease = ARGV[1], ARGV[2]
redis.call('ZREM', prefix .. ':inflight', lease)
if redis.call('ZSCORE', prefix .. ':recent', lease) then
  if tonumber(ARGV[3]) >= 0 then redis.call('HSET', prefix .. ':tokens', lease, ARGV[3]) end
else
  redis.call('HDEL', prefix .. ':tenant', lease)
  redis.call('HDEL', prefix .. ':tokens', lease)
end
return 1
"""

# ARGV: prefix, until (unix time), wait, now, learned ttl. Never shortens a pause another
# replica set. The calls in flight when the provider refused one are what it takes at once:
# the model is capped at that many (at least one) for `learned ttl`, so that the calls waiting
# out the pause do not all rush at it again when it ends.
_PAUSE = """
local prefix = ARGV[1]
redis.call('ZREMRANGEBYSCORE', prefix .. ':inflight', '-inf', tonumber(ARGV[4]))
local running = math.max(1, redis.call('ZCARD', prefix .. ':inflight'))
local learned = tonumber(redis.call('GET', prefix .. ':learned') or '0')
if learned == 0 or running < learned then
  redis.call('SET', prefix .. ':learned', running, 'EX', tonumber(ARGV[5]))
end
local current = tonumber(redis.call('GET', prefix .. ':paused_until') or '0')
if tonumber(ARGV[2]) > current then
  redis.call('SET', prefix .. ':paused_until', ARGV[2], 'EX', math.ceil(tonumber(ARGV[3])) + 60)
  return 1
end
return 0
"""


@dataclass(frozen=True)
class CapacityWait:
    """Why a call waits for the model, and about how long (0: unknown, soon)."""

    why: str
    wait_s: float


# Told once a call has waited past the notice threshold, and after each provider pause.
WaitNotice = Callable[[CapacityWait], Awaitable[None]]


class CapacityGate:
    """The leases of one model, for this replica's calls."""

    def __init__(
        self, redis: Redis, model: str, limits: ModelLimits | None, lease_ttl_s: float
    ) -> None:
        self.redis = redis
        self.model = model
        self.limits = limits or ModelLimits()
        self.prefix = f"deckhands:llm:{model}"
        self.lease_ttl_s = lease_ttl_s
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._pause = redis.register_script(_PAUSE)
        self._queues: dict[tuple[str, TaskPriority], asyncio.Lock] = {}
        self._lines: dict[tuple[str, TaskPriority], int] = {}  # calls waiting in each queue
        self._waiting: dict[str, int] = {}
        self._freed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lease(
        self,
        tenant_id: str | None,
        estimated_tokens: int,
        notice: WaitNotice | None = None,
        notice_after_s: float = 1.0,
        priority: TaskPriority = TaskPriority.INTERACTIVE,
    ) -> AsyncIterator[Lease]:
        """Hold room for one call; the caller sets `used_tokens` on the lease when known."""
        tenant = tenant_id or NO_TENANT
        lease = Lease(id=uuid.uuid4().hex, tenant=tenant, priority=priority)
        started = time.monotonic()
        await self._take(lease, estimated_tokens, started, notice, notice_after_s)
        waited = time.monotonic() - started
        LLM_CAPACITY_WAIT.labels(self.model, tenant).observe(waited)
        try:
            yield lease
        finally:
            used = lease.used_tokens
            LLM_TOKENS_GRANTED.labels(self.model, tenant).inc(
                max(0, estimated_tokens if used is None else used)
            )
            try:
                await self._release(
                    keys=[],
                    args=[
                        self.prefix,
                        lease.id,
                        -1 if lease.used_tokens is None else lease.used_tokens,
                    ],
                )
            except Exception as exc:  # it expires on its own after the lease's time
                log.warning("LLM lease %s not released: %s", lease.id, exc)
            self._freed.set()

    async def _take(
        self,
        lease: Lease,
        estimated_tokens: int,
        started: float,
        notice: WaitNotice | None,
        notice_after_s: float,
    ) -> None:
        tenant, line = lease.tenant, (lease.tenant, lease.priority)
        queue = self._queues.setdefault(line, asyncio.Lock())
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        self._lines[line] = self._lines.get(line, 0) + 1
        LLM_CAPACITY_WAITING.labels(self.model, tenant).inc()
        noticed = False
        try:
            # This replica's calls of one tenant and priority, in arrival order; the first of
            # them asks Redis, and a batch one only while no interactive one of its tenant waits.
            async with queue:
                while True:
                    if self._behind_interactive(lease):
                        await self._sleep(_POLL_S)
                        continue
                    granted, wait = await self._ask(lease, estimated_tokens)
                    if granted:
                        return
                    assert wait is not None
                    waited = time.monotonic() - started
                    if (
                        notice is not None
                        and not noticed
                        and waited + wait.wait_s >= notice_after_s
                    ):
                        noticed = True
                        await notice(wait)
                    await self._sleep(wait.wait_s)
        finally:
            self._waiting[tenant] -= 1
            if not self._waiting[tenant]:
                del self._waiting[tenant]
            self._lines[line] -= 1
            if not self._lines[line]:
                del self._lines[line]
                if not queue.locked():
                    self._queues.pop(line, None)
            LLM_CAPACITY_WAITING.labels(self.model, tenant).dec()

    def _behind_interactive(self, lease: Lease) -> bool:
        return lease.priority is TaskPriority.BATCH and (
            self._lines.get((lease.tenant, TaskPriority.INTERACTIVE), 0) > 0
        )

    async def _ask(self, lease: Lease, estimated_tokens: int) -> tuple[bool, CapacityWait | None]:
        lim = self.limits
        granted, wait_s, why = await self._acquire(
            keys=[],
            args=[
                self.prefix,
                WEIGHTS_KEY,
                lease.id,
                lease.tenant,
                repr(time.time()),
                estimated_tokens,
                lim.max_concurrent or 0,
                lim.requests_per_minute or 0,
                lim.tokens_per_minute or 0,
                self.lease_ttl_s,
                1 if self._waiting.get(lease.tenant, 0) > 1 else 0,
            ],
        )
        if int(granted):
            return True, None
        reason = why.decode() if isinstance(why, bytes) else str(why)
        return False, CapacityWait(why=reason, wait_s=max(0.0, float(wait_s)))

    async def _sleep(self, wait_s: float) -> None:
        """Until the room should be there, at most _MAX_SLEEP_S; a release here wakes it."""
        self._freed.clear()
        delay = min(max(wait_s, _POLL_S), _MAX_SLEEP_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._freed.wait(), delay)

    async def pause(self, wait_s: float) -> None:
        """The provider answered 429: nobody calls this model for `wait_s`."""
        until = time.time() + wait_s
        LLM_PAUSES.labels(self.model).inc()
        await self._pause(
            keys=[], args=[self.prefix, repr(until), wait_s, repr(time.time()), _LEARNED_S]
        )

    async def paused_for(self) -> float:
        raw = await self.redis.get(f"{self.prefix}:paused_until")
        return 0.0 if raw is None else max(0.0, float(raw) - time.time())


@dataclass
class Lease:
    id: str
    tenant: str
    priority: TaskPriority = TaskPriority.INTERACTIVE
    used_tokens: int | None = None
