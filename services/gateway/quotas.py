"""Quotas and fairness per tenant (issue 9, part 3): running tasks, sandboxes, spend per day.

Each limit has a server default (GatewaySettings, DECKHANDS_TENANT_*) that the operator may
override per tenant (PUT /v1/admin/tenants/{id}/limits). A task is admitted when it is created,
and again when a user message resumes one that had ended (FINISHED, ERROR, REJECTED); over a
limit the gateway answers 429 with Retry-After and a body naming the limit.

The operator's limits are kept durably in the tenants bucket (`limits.<id>`, TenantRecords)
and cached in Redis (`deckhands:tenant:<id>:limits`, refilled from the bucket on a miss), so
a Redis that lost its data still applies them. The counts below are kept in Redis and settled
against the States; when Redis lost them (a marker key, `counts-complete`, is gone with them),
the first gateway to need them counts them again from the tenant's tasks (their durable records,
services.gateway.task_records, and their States, which the controller rebuilds from the log):
each live task running with its budget reserved, each tree that may hold a seat, and today's
spend (what today's ended tasks spent, what today's live ones reserved).

How each is counted, in Redis beside the tenant (`deckhands:tenant:<id>:...`):
- `running` HASH task id -> its Reservation: the tenant's tasks admitted and not yet seen to
  end. When it is full, an admission first settles the entries whose State has ended (or is
  gone), so the hash holds the running tasks; a Lua script adds the new one only while fewer
  than the limit are held, so two gateways admitting at once cannot both take the last place.
  Settling reads the States, so it is done when it can change the answer (the hash is full, or
  a daily spend limit needs what is left today), not on every admission. A task waiting for a
  person still runs: stop or delete it to free its place.
- Sandboxes: the count is the pool's own, per tenant: the seats (shared.admission, kept by the
  runtime) held by the tenant's tasks, roots and sub-tasks (each holds its own, and carries its
  root's tenant). A task holds its seat from its first sandbox until its sandbox is released,
  which is later than it stops running: a task waiting for input or a confirmation keeps it,
  and one that ended in ERROR keeps its sandbox for a user message to resume it. A soft limit:
  it refuses new tasks while the tenant's tasks hold that many; the tasks it has keep what they
  hold (a sub-task's sandbox is bounded by the depth and fan-out limits).
- `holders` HASH root task id -> Holder: the tenant's task trees that may hold sandboxes (the
  tasks to stop with the tenant). A tree leaves the hash once every task of it has ended and
  none holds a seat (a user message that resumes it puts it back).
- `spend:<UTC day>` a float: every task admitted that day reserves its budget there, and when
  it is seen to end its reservation is replaced by what it really spent (its sub-tasks' spend
  included, since the controller adds it to the root's). A task is admitted only if its budget
  fits what is left of the day's allowance, so the tenant's tasks cannot together spend more
  than the limit, whatever they do. With a daily limit, a task that names no budget (and has
  no default) gets what is left of the day's allowance as its budget.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.admission import WEIGHTS_KEY, seats_prefix
from shared.events import AgentState, utc_now
from shared.state import TaskState
from shared.state_store import TaskStateStore

from .errors import QuotaExceeded, StorageUnavailable
from .task_records import IndexRange, TaskRecords
from .tenant_records import TenantRecords

__all__ = ["Holder", "QuotaDefaults", "Quotas", "Reservation", "TenantLimits", "TenantQuotas"]

_PREFIX = "deckhands"
# A task no longer runs (for its tenant's count) in these states; a user message may resume
# FINISHED, ERROR and REJECTED ones, which are then admitted again.
_ENDED = frozenset({AgentState.FINISHED, AgentState.ERROR, AgentState.STOPPED, AgentState.REJECTED})
_RETRY_RUNNING_S = 30  # a running task ends when it ends: look again in a while
_SETTLE_GRACE_S = 120.0
_SPEND_KEPT_S = 3 * 86_400  # a day's counter outlives the day by a little, for settlements
_LIMITS_CACHED_S = 600  # a cache entry filled as the operator changed the limits lasts no longer
_RECOUNT_PAGE = 500
_RECOUNT_LOCK_S = 60  # one gateway counts again at a time; a dead one's turn passes after this
_RECOUNT_WAIT_S = 5.0  # another gateway counting: wait this long for it, then go on
_HOLDERS_SLACK = 64  # trees kept beyond twice the running tasks before the ended are let go


class TenantLimits(BaseModel):
    """What the operator set for one tenant; each field left out (null) is the server default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_tasks: int | None = Field(
        default=None, ge=0, le=100_000, description="Tasks running at once (0: none)."
    )
    max_sandboxes: int | None = Field(
        default=None, ge=0, le=100_000, description="Sandboxes the tenant's tasks hold at once."
    )
    max_spend_usd_per_day: float | None = Field(
        default=None, ge=0, le=1_000_000, description="LLM spend per UTC day, in USD."
    )
    default_max_budget_usd: float | None = Field(
        default=None, gt=0, le=10_000, description="Budget of a task that names none."
    )
    max_delegation_depth: int | None = Field(
        default=None, ge=0, le=16, description="How deep sub-tasks may nest (0: no delegation)."
    )
    max_sub_tasks: int | None = Field(
        default=None, ge=0, le=1000, description="Sub-tasks one task may delegate."
    )
    max_event_streams: int | None = Field(
        default=None, ge=1, le=100_000, description="Event streams (SSE) open at once."
    )
    allow_trajectory_tasks: bool | None = Field(
        default=None,
        description="Whether the tenant may create a task from a trajectory (replay): its "
        "recorded actions are reviewed like any other, but it steers the agent without an LLM.",
    )
    seat_weight: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="The tenant's share of the sandbox seats while tenants queue for them: "
        "seats go to the tenant furthest below weight / (sum of the weights of the tenants "
        "holding or wanting seats). 1 by default; a tenant alone uses every seat whatever it is.",
    )


@dataclass(frozen=True)
class QuotaDefaults:
    """The server's defaults (GatewaySettings): what a tenant gets unless the operator says."""

    max_running_tasks: int = 1000
    max_sandboxes: int = 1000
    max_spend_usd_per_day: float | None = None
    default_max_budget_usd: float | None = 10.0
    max_delegation_depth: int = 3
    max_sub_tasks: int = 10
    max_event_streams: int = 64
    allow_trajectory_tasks: bool = False
    seat_weight: float = 1.0


class Quotas(BaseModel):
    """A tenant's limits in force: its own where the operator set them, else the defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_tasks: int
    max_sandboxes: int
    max_spend_usd_per_day: float | None
    default_max_budget_usd: float | None
    max_delegation_depth: int
    max_sub_tasks: int
    max_event_streams: int
    allow_trajectory_tasks: bool
    seat_weight: float

    @classmethod
    def of(cls, limits: TenantLimits, defaults: QuotaDefaults) -> Quotas:
        own = limits.model_dump(exclude_none=True)
        return cls(**{**defaults.__dict__, **own})


class Reservation(BaseModel):
    """A running task's entry: the day it was admitted, the budget it reserved on that day, and
    what it had spent before (a resumed task is charged only what it spends after)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    day: str
    reserved_usd: float = Field(ge=0)
    spent_before_usd: float = Field(default=0.0, ge=0)
    at: datetime = Field(default_factory=utc_now)
    state_version: int = Field(
        default=0, ge=0, description="The State's version when admitted (0: not made yet)."
    )

    def settles(self, state: TaskState | None, now: datetime) -> bool:
        """Whether the task is seen to have ended since its admission. Its State is read as
        ended only once the controller has written it since (a resumed task still reads
        FINISHED until the controller takes the message), or after a grace period (the
        message was never queued, or the task was deleted)."""
        if state is not None and state.agent_state not in _ENDED:
            return False
        if state is not None and state.version > self.state_version:
            return True
        return (now - self.at).total_seconds() > _SETTLE_GRACE_S


class Holder(BaseModel):
    """A task tree that may hold sandboxes: when its root was admitted (again), and the root's
    State version then."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: datetime = Field(default_factory=utc_now)
    state_version: int = Field(default=0, ge=0)

    def done(self, root: TaskState | None, tree_ended: bool, now: datetime) -> bool:
        """Whether a tree that holds no seat now never will again short of a new admission:
        every task of it has ended since the root was admitted (or its State is gone, after a
        grace period)."""
        if root is not None:
            return tree_ended and root.version > self.state_version
        return (now - self.at).total_seconds() > _SETTLE_GRACE_S


# KEYS: running, spend counter of today, holders. ARGV: task, reservation json, max running,
# reserved usd, spend limit ('' when none), spend ttl, holder json.
# Returns {'ok'} or {limit name, current}.
_RESERVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'ok'} end
local running = redis.call('HLEN', KEYS[1])
if running >= tonumber(ARGV[3]) then return {'max_running_tasks', tostring(running)} end
local spent = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[5] ~= '' and spent + tonumber(ARGV[4]) > tonumber(ARGV[5]) + 1e-9 then
  return {'max_spend_usd_per_day', tostring(spent)}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[7])
redis.call('INCRBYFLOAT', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return {'ok'}
"""

# KEYS: running, spend counter of the reservation's day. ARGV: task, reservation json as read,
# charge (what it spent less what it reserved), spend ttl. Only the settler that removes the
# very entry it read charges the day, so two gateways never settle one task twice.
_SETTLE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCRBYFLOAT', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""


# KEYS: holders. ARGV: task, holder json as read. Only the entry read is removed, so a tree
# admitted again meanwhile (a user message resumed it) stays.
_UNHOLD = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


def _day(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d")


def _seconds_to_next_day(now: datetime) -> int:
    tomorrow = (now.astimezone(UTC) + timedelta(days=1)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return max(1, math.ceil((tomorrow - now).total_seconds()))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class TenantQuotas:
    def __init__(
        self,
        store: TaskStateStore,
        defaults: QuotaDefaults,
        pool_name: str = "default",
        prefix: str = _PREFIX,
    ) -> None:
        self.store = store
        self.redis: Redis = store.redis
        # The durable copy of the operator's limits; None: Redis alone (unit tests).
        self.records: TenantRecords | None = None
        # The tenants' tasks, to count again what Redis lost; None: never counted again.
        self.tasks: TaskRecords | None = None
        self.defaults = defaults
        self.prefix = prefix
        self._seats_key = f"{seats_prefix(pool_name)}:seats"
        self._held_key = f"{seats_prefix(pool_name)}:held"
        self._reserve = self.redis.register_script(_RESERVE)
        self._settle = self.redis.register_script(_SETTLE)
        self._unhold = self.redis.register_script(_UNHOLD)

    def _limits_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:limits"

    def _running_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:running"

    def _holders_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:holders"

    def _spend_key(self, tenant_id: str, day: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:spend:{day}"

    def _counted_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:counts-complete"

    # -- the operator's settings

    async def limits(self, tenant_id: str) -> TenantLimits:
        try:
            raw = await self.redis.get(self._limits_key(tenant_id))
            if raw is None and self.records is not None:
                raw = await self.records.get(f"limits.{tenant_id}") or b"{}"
                await self.redis.set(self._limits_key(tenant_id), raw, ex=_LIMITS_CACHED_S)
                # Redis may have lost the weights with the cache: the runtime reads them there.
                await self._publish_weight(tenant_id, TenantLimits.model_validate_json(raw))
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return TenantLimits() if raw is None else TenantLimits.model_validate_json(raw)

    async def _publish_weight(self, tenant_id: str, limits: TenantLimits) -> None:
        """The tenant's seat weight where the runtime's fair queue reads it (shared.admission);
        the server default is not written: a tenant missing there weighs 1, and so should
        every tenant the operator did not weigh, whatever the default."""
        weight = limits.seat_weight if limits.seat_weight is not None else self.defaults.seat_weight
        if weight == 1.0:
            await self.redis.hdel(WEIGHTS_KEY, tenant_id)
        else:
            await self.redis.hset(WEIGHTS_KEY, tenant_id, repr(weight))

    async def quotas(self, tenant_id: str) -> Quotas:
        return self.quotas_of(await self.limits(tenant_id))

    def quotas_of(self, limits: TenantLimits) -> Quotas:
        return Quotas.of(limits, self.defaults)

    async def set_limits(self, tenant_id: str, limits: TenantLimits) -> None:
        raw = limits.model_dump_json()
        if self.records is not None:
            await self.records.put(f"limits.{tenant_id}", raw.encode())
        try:
            await self.redis.set(self._limits_key(tenant_id), raw)
            await self._publish_weight(tenant_id, limits)
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    # -- use

    async def stoppable_tasks(self, tenant_id: str) -> list[str]:
        """The tenant's running tasks (settled), and the trees that may hold a sandbox."""
        try:
            running = await self._running(tenant_id)
            holders = await self.redis.hkeys(self._holders_key(tenant_id))
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return list(dict.fromkeys([*running, *(_text(h) for h in holders)]))

    async def live_tasks(self, tenant_id: str) -> list[str]:
        """The tenant's running tasks, after settling those that ended."""
        try:
            return list(await self._running(tenant_id))
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    async def usage(self, tenant_id: str) -> tuple[int, int, float]:
        """(running tasks, sandboxes held, spend today in USD), after settling ended tasks."""
        try:
            running = await self._running(tenant_id)
            await self._sandboxes(tenant_id)  # lets go of the trees that ended, holding none
            sandboxes = await self.seats_held(tenant_id)
            spent = await self.redis.get(self._spend_key(tenant_id, _day(utc_now())))
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return len(running), sandboxes, float(spent or 0.0)

    async def admit(
        self, tenant_id: str, task_id: str, asked_usd: float | None, quotas: Quotas
    ) -> float | None:
        """Count the task as one of the tenant's running tasks, its budget reserved on today's
        spend; the budget it may spend: what it asked for, else the tenant's default, which a
        daily limit caps at what is left of the day's allowance. Over a limit: QuotaExceeded,
        and nothing is counted.

        A few Redis calls however many tasks the tenant runs: the tasks that ended are settled
        (their States read) only when a limit would refuse the task, or, with a daily spend
        limit, to work out what is left of the day's allowance; the sandboxes held are the
        pool's own count per tenant."""
        budget_usd = asked_usd if asked_usd is not None else quotas.default_max_budget_usd
        now = utc_now()
        today = _day(now)
        try:
            await self._ensure_counts(tenant_id)
            if await self.redis.hexists(self._running_key(tenant_id), task_id):
                return budget_usd  # admitted already (a retried request)
            sandboxes = await self.seats_held(tenant_id)
            if sandboxes >= quotas.max_sandboxes:
                raise QuotaExceeded(
                    "max_sandboxes",
                    quotas.max_sandboxes,
                    sandboxes,
                    _RETRY_RUNNING_S,
                    f"the tenant's tasks hold {sandboxes} sandboxes, the most it may "
                    f"({quotas.max_sandboxes}); retry when one of its tasks ends",
                )
            limit = quotas.max_spend_usd_per_day
            if limit is not None:
                await self._running(tenant_id)  # today's spend: what ended tasks really spent
            spent = float(await self.redis.get(self._spend_key(tenant_id, today)) or 0.0)
            if limit is not None and asked_usd is None:
                # No budget asked: the default, or less when less is left today.
                left = limit - spent
                budget_usd = left if budget_usd is None else min(budget_usd, left)
            if limit is not None and (budget_usd is None or budget_usd <= 0):
                raise self._spend_exceeded(limit, spent, 0.0, now)
            reservation = Reservation(day=today, reserved_usd=budget_usd or 0.0, at=now)
            try:
                await self._admit(tenant_id, task_id, reservation, quotas, now, spent)
            except QuotaExceeded as exc:
                if (exc.extra or {}).get("limit") != "max_running_tasks":
                    raise
                await self._running(tenant_id)  # those that ended give their places back
                await self._admit(tenant_id, task_id, reservation, quotas, now, spent)
            await self._prune_holders(tenant_id)
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return budget_usd

    async def seats_held(self, tenant_id: str) -> int:
        """The sandbox seats the tenant's tasks hold (roots and sub-tasks), as the pool counts
        them (shared.admission)."""
        held = await self.redis.hget(self._held_key, tenant_id)
        return int(held or 0)

    async def _prune_holders(self, tenant_id: str) -> None:
        """Let go of the trees that ended and hold nothing, once they are many: a walk over the
        tenant's trees now and then, not on every admission."""
        holders = await self.redis.hlen(self._holders_key(tenant_id))
        running = await self.redis.hlen(self._running_key(tenant_id))
        if holders > 2 * running + _HOLDERS_SLACK:
            await self._sandboxes(tenant_id)

    async def readmit(self, tenant_id: str, state: TaskState, quotas: Quotas) -> None:
        """A user message resumes a task that had ended: it runs again, and may spend again
        what the controller will allow it (its remaining budget, or its initial one again)."""
        if state.agent_state not in _ENDED or state.agent_state is AgentState.STOPPED:
            return  # running (counted already), or never to run again
        now = utc_now()
        spent_before = state.total_usage().cost_usd
        budget, initial = state.max_budget_usd, state.initial_budget_usd
        may_spend = 0.0
        if budget is not None:
            may_spend = budget - spent_before
            if may_spend <= 0:
                may_spend = initial or budget  # the controller raises a budget that was hit
        try:
            # Its tree may take seats again, whether or not it still counts as running.
            holder = Holder(at=now, state_version=state.version)
            await self.redis.hset(
                self._holders_key(tenant_id), state.task_id, holder.model_dump_json()
            )
            running = await self._running(tenant_id)
            if state.task_id in running:
                return
            reservation = Reservation(
                day=_day(now),
                reserved_usd=may_spend,
                spent_before_usd=spent_before,
                at=now,
                state_version=state.version,
            )
            spent = float(await self.redis.get(self._spend_key(tenant_id, _day(now))) or 0.0)
            await self._admit(tenant_id, state.task_id, reservation, quotas, now, spent)
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    async def forget(self, tenant_id: str, task_id: str) -> None:
        """A deleted task runs no more: its place is free at once, its reservation stays
        charged to its day (what it spent is gone with its State)."""
        try:
            await self.redis.hdel(self._holders_key(tenant_id), task_id)
            raw = await self.redis.hget(self._running_key(tenant_id), task_id)
            if raw is not None:
                day = Reservation.model_validate_json(raw).day
                await self._settle(
                    keys=[self._running_key(tenant_id), self._spend_key(tenant_id, day)],
                    args=[task_id, _text(raw), "0", _SPEND_KEPT_S],
                )
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    async def release(self, tenant_id: str, task_id: str) -> None:
        """A task refused after its admission (nothing was created): give its place back."""
        try:
            await self.redis.hdel(self._holders_key(tenant_id), task_id)
            raw = await self.redis.hget(self._running_key(tenant_id), task_id)
            if raw is not None:
                reservation = Reservation.model_validate_json(raw)
                await self._settle(
                    keys=[
                        self._running_key(tenant_id),
                        self._spend_key(tenant_id, reservation.day),
                    ],
                    args=[task_id, _text(raw), repr(-reservation.reserved_usd), _SPEND_KEPT_S],
                )
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    # -- parts

    async def _admit(
        self,
        tenant_id: str,
        task_id: str,
        reservation: Reservation,
        quotas: Quotas,
        now: datetime,
        spent: float,
    ) -> None:
        limit = quotas.max_spend_usd_per_day
        holder = Holder(at=reservation.at, state_version=reservation.state_version)
        answer = await self._reserve(
            keys=[
                self._running_key(tenant_id),
                self._spend_key(tenant_id, reservation.day),
                self._holders_key(tenant_id),
            ],
            args=[
                task_id,
                reservation.model_dump_json(),
                quotas.max_running_tasks,
                repr(reservation.reserved_usd),
                "" if limit is None else repr(limit),
                _SPEND_KEPT_S,
                holder.model_dump_json(),
            ],
        )
        verdict = [_text(part) for part in answer]
        if verdict[0] == "max_running_tasks":
            running = int(verdict[1])
            raise QuotaExceeded(
                "max_running_tasks",
                quotas.max_running_tasks,
                running,
                _RETRY_RUNNING_S,
                f"the tenant has {running} running tasks, the most it may "
                f"({quotas.max_running_tasks}); retry when one ends, or stop or delete one",
            )
        if verdict[0] == "max_spend_usd_per_day":
            assert limit is not None
            raise self._spend_exceeded(limit, float(verdict[1]), reservation.reserved_usd, now)

    @staticmethod
    def _spend_exceeded(limit: float, spent: float, asked: float, now: datetime) -> QuotaExceeded:
        left = max(limit - spent, 0.0)
        return QuotaExceeded(
            "max_spend_usd_per_day",
            limit,
            round(spent, 6),
            _seconds_to_next_day(now),
            f"the task's budget (${asked:.4f}) does not fit what is left of the tenant's spend "
            f"for today (${left:.4f} of ${limit:.4f}, running tasks' budgets reserved); ask "
            "for a smaller max_budget_usd, or retry after midnight UTC",
        )

    async def _ensure_counts(self, tenant_id: str) -> None:
        """Count again what Redis lost, once (see the module's docstring)."""
        if self.tasks is None or await self.redis.exists(self._counted_key(tenant_id)):
            return
        lock = f"{self.prefix}:tenant:{tenant_id}:counts-complete:lock"
        if not await self.redis.set(lock, "1", nx=True, ex=_RECOUNT_LOCK_S):
            for _ in range(int(_RECOUNT_WAIT_S / 0.1)):
                await asyncio.sleep(0.1)
                if await self.redis.exists(self._counted_key(tenant_id)):
                    return
            return  # still counting: go on with what is there, counted again next time
        try:
            await self._recount(tenant_id, self.tasks)
            await self.redis.set(self._counted_key(tenant_id), "1")
        finally:
            await self.redis.delete(lock)

    async def _recount(self, tenant_id: str, tasks: TaskRecords) -> None:
        """Put back each live task's reservation and each tree that may hold a seat (where
        missing), and today's spend (unless counted since)."""
        now = utc_now()
        today = _day(now)
        spend_key = self._spend_key(tenant_id, today)
        spend_lost = not await self.redis.exists(spend_key)
        spent_today = 0.0
        await tasks.ensure_index(tenant_id)
        where = IndexRange()
        while True:
            batch = await tasks.page(tenant_id, where, _RECOUNT_PAGE)
            states = await self.store.load_many([task_id for task_id, _ in batch])
            async with self.redis.pipeline(transaction=False) as pipe:
                for (task_id, _), state in zip(batch, states, strict=True):
                    if state is None:
                        continue
                    day = _day(state.created_at)
                    if state.agent_state not in _ENDED:
                        reserved = state.max_budget_usd or 0.0
                        reservation = Reservation(
                            day=day, reserved_usd=reserved, at=now, state_version=state.version
                        )
                        pipe.hsetnx(
                            self._running_key(tenant_id), task_id, reservation.model_dump_json()
                        )
                        spent_today += reserved if day == today else 0.0
                    elif day == today:
                        spent_today += state.total_usage().cost_usd
                    if state.agent_state not in _ENDED or state.agent_state is AgentState.ERROR:
                        holder = Holder(at=now, state_version=state.version)
                        pipe.hsetnx(self._holders_key(tenant_id), task_id, holder.model_dump_json())
                await pipe.execute()
            if len(batch) < _RECOUNT_PAGE:
                break
            where = IndexRange(after_member=batch[-1][1])
        if spend_lost and spent_today > 0:
            await self.redis.set(spend_key, repr(spent_today), ex=_SPEND_KEPT_S, nx=True)

    async def _running(self, tenant_id: str) -> dict[str, TaskState | None]:
        """The tenant's running tasks with their States, after settling those that ended."""
        await self._ensure_counts(tenant_id)
        key = self._running_key(tenant_id)
        entries = {_text(task): _text(raw) for task, raw in (await self.redis.hgetall(key)).items()}
        if not entries:
            return {}
        ids = list(entries)
        states = await self.store.load_many(ids)
        running: dict[str, TaskState | None] = {}
        now = utc_now()
        for task_id, state in zip(ids, states, strict=True):
            reservation = Reservation.model_validate_json(entries[task_id])
            if not reservation.settles(state, now):
                running[task_id] = state  # None: admitted, its State about to be made
                continue
            # A task with no State left (deleted) keeps its whole reservation as spent: what
            # it spent is unknown, and deleting a task must not give its spend back.
            charge = 0.0
            if state is not None:
                spent = state.total_usage().cost_usd
                charge = max(spent - reservation.spent_before_usd, 0.0) - reservation.reserved_usd
            await self._settle(
                keys=[key, self._spend_key(tenant_id, reservation.day)],
                args=[task_id, entries[task_id], repr(charge), _SPEND_KEPT_S],
            )
        return running

    async def _sandboxes(self, tenant_id: str) -> int:
        """Seats held by the tenant's task trees, roots and sub-tasks (whose ids their States
        list); a tree that has ended and holds none is let go."""
        await self._ensure_counts(tenant_id)
        key = self._holders_key(tenant_id)
        entries = {_text(task): _text(raw) for task, raw in (await self.redis.hgetall(key)).items()}
        if not entries:
            return 0
        roots = list(entries)
        root_states = await self.store.load_many(roots)
        tree_of: dict[str, str] = {}  # task -> its root
        ended = {root: True for root in roots}
        level: list[tuple[str, TaskState]] = []
        for root, state in zip(roots, root_states, strict=True):
            tree_of[root] = root
            if state is not None:
                level.append((root, state))
        while level and len(tree_of) < 10_000:
            subs: list[tuple[str, str]] = []
            for root, state in level:
                ended[root] = ended[root] and state.agent_state in _ENDED
                subs += [(root, sub) for sub in state.sub_tasks if sub not in tree_of]
            for root, sub in subs:
                tree_of[sub] = root
            sub_states = await self.store.load_many([sub for _, sub in subs])
            level = [
                (root, state)
                for (root, _), state in zip(subs, sub_states, strict=True)
                if state is not None
            ]
        tasks = list(tree_of)
        held = await self.redis.hmget(self._seats_key, tasks)
        per_root = dict.fromkeys(roots, 0)
        for task, seat in zip(tasks, held, strict=True):
            if seat is not None:
                per_root[tree_of[task]] += 1
        now = utc_now()
        for root, state in zip(roots, root_states, strict=True):
            holder = Holder.model_validate_json(entries[root])
            if per_root[root] == 0 and holder.done(state, ended[root], now):
                await self._unhold(keys=[key], args=[root, entries[root]])
        return sum(per_root.values())
