"""Quotas and fairness per tenant (issue 9, part 3): running tasks, sandboxes, spend per day.

Each limit has a server default (GatewaySettings, DECKHANDS_TENANT_*) that the operator may
override per tenant (PUT /v1/admin/tenants/{id}/limits). A task is admitted when it is created,
and again when a user message resumes one that had ended (FINISHED, ERROR, REJECTED); over a
limit the gateway answers 429 with Retry-After and a body naming the limit.

How each is counted: quotas/records.py.
"""

from __future__ import annotations

from datetime import datetime

from redis.exceptions import RedisError

from shared.admission import WEIGHTS_KEY
from shared.egress_policy import EgressPolicy, policy_outside
from shared.events import AgentState, utc_now
from shared.state import TaskState
from shared.state_store import TaskStateStore

from ..errors import EgressPolicyRefused, QuotaExceeded, StorageUnavailable
from ..tenants.records import TenantRecords
from .egress_allowance import (
    check_egress_allowance,
    egress_bytes_today,
    publish_egress_allowance,
)
from .limits import QuotaDefaults, Quotas, TenantLimits
from .models import QuotasView, QuotaUsage
from .records import QuotaRecords
from .reservations import (
    ENDED,
    RESERVE,
    SPEND_KEPT_S,
    Holder,
    Reservation,
    as_text,
    seconds_to_next_day,
    utc_day,
)

__all__ = ["TenantQuotas", "quotas_view"]

_PREFIX = "deckhands"
_RETRY_RUNNING_S = 30  # a running task ends when it ends: look again in a while
_LIMITS_CACHED_S = 600  # a cache entry filled as the operator changed the limits lasts no longer


class TenantQuotas(QuotaRecords):
    def __init__(
        self,
        store: TaskStateStore,
        defaults: QuotaDefaults,
        pool_name: str = "default",
        prefix: str = _PREFIX,
    ) -> None:
        super().__init__(store, pool_name, prefix)
        # The durable copy of the operator's limits; None: Redis alone (unit tests).
        self.records: TenantRecords | None = None
        self.defaults = defaults
        self._reserve = self.redis.register_script(RESERVE)

    # -- the operator's settings

    async def limits(self, tenant_id: str) -> TenantLimits:
        try:
            raw = await self.redis.get(self._limits_key(tenant_id))
            if raw is None and self.records is not None:
                raw = await self.records.get(f"limits.{tenant_id}") or b"{}"
                await self.redis.set(self._limits_key(tenant_id), raw, ex=_LIMITS_CACHED_S)
                # Redis may have lost the weights with the cache: the runtime reads them there
                # (and the egress proxies the allowance).
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
        allowance = self.quotas_of(limits).max_egress_bytes_per_day
        await publish_egress_allowance(self.redis, tenant_id, allowance)

    async def quotas(self, tenant_id: str) -> Quotas:
        return self.quotas_of(await self.limits(tenant_id))

    def quotas_of(self, limits: TenantLimits) -> Quotas:
        return Quotas.of(limits, self.defaults)

    async def set_limits(self, tenant_id: str, limits: TenantLimits) -> None:
        """Keep the operator's limits for the tenant; an egress bound wider than the server's
        is refused (422 naming the first rule outside it)."""
        if limits.egress_allow is not None:
            outside = policy_outside(
                EgressPolicy(allow=limits.egress_allow),
                EgressPolicy(allow=self.defaults.egress_allow),
            )
            if outside is not None:
                raise EgressPolicyRefused(
                    f"egress_allow: the rule {outside!r} is outside what this server allows "
                    "(DECKHANDS_EGRESS_ALLOW)"
                )
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
        return list(dict.fromkeys([*running, *(as_text(h) for h in holders)]))

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
            spent = await self.redis.get(self._spend_key(tenant_id, utc_day(utc_now())))
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return len(running), sandboxes, float(spent or 0.0)

    async def egress_bytes(self, tenant_id: str) -> int:
        """What the tenant's sandboxes moved through the egress proxy today."""
        try:
            return await egress_bytes_today(self.redis, tenant_id, utc_now())
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc

    async def admit(
        self,
        tenant_id: str,
        task_id: str,
        asked_usd: float | None,
        quotas: Quotas,
        egress: bool = False,
    ) -> float | None:
        """Count the task as one of the tenant's running tasks, its budget reserved on today's
        spend; the budget it may spend: what it asked for, else the tenant's default, which a
        daily limit caps at what is left of the day's allowance. Over a limit: QuotaExceeded,
        and nothing is counted. `egress`: the task has a network policy, held to the tenant's
        egress bytes per day too.

        A few Redis calls however many tasks the tenant runs: the tasks that ended are settled
        (their States read) only when a limit would refuse the task, or, with a daily spend
        limit, to work out what is left of the day's allowance; the sandboxes held are the
        pool's own count per tenant."""
        budget_usd = asked_usd if asked_usd is not None else quotas.default_max_budget_usd
        now = utc_now()
        today = utc_day(now)
        try:
            counts = await self.admission_counts(tenant_id, task_id, today)
            if counts.admitted:
                return budget_usd  # admitted already (a retried request)
            if egress:
                await check_egress_allowance(self.redis, tenant_id, quotas, now)
            sandboxes = counts.seats_held
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
            spent = counts.spent_usd
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
            await self._prune_holders(counts, tenant_id)
        except RedisError as exc:
            raise StorageUnavailable(f"quota store (Redis) unavailable: {exc}") from exc
        return budget_usd

    async def readmit(self, tenant_id: str, state: TaskState, quotas: Quotas) -> None:
        """A user message resumes a task that had ended: it runs again, and may spend again
        what the controller will allow it (its remaining budget, or its initial one again)."""
        if state.agent_state not in ENDED or state.agent_state is AgentState.STOPPED:
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
                day=utc_day(now),
                reserved_usd=may_spend,
                spent_before_usd=spent_before,
                at=now,
                state_version=state.version,
            )
            spent = float(await self.redis.get(self._spend_key(tenant_id, utc_day(now))) or 0.0)
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
                    args=[task_id, as_text(raw), "0", SPEND_KEPT_S],
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
                    args=[task_id, as_text(raw), repr(-reservation.reserved_usd), SPEND_KEPT_S],
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
                SPEND_KEPT_S,
                holder.model_dump_json(),
            ],
        )
        verdict = [as_text(part) for part in answer]
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
            seconds_to_next_day(now),
            f"the task's budget (${asked:.4f}) does not fit what is left of the tenant's spend "
            f"for today (${left:.4f} of ${limit:.4f}, running tasks' budgets reserved); ask "
            "for a smaller max_budget_usd, or retry after midnight UTC",
        )


async def quotas_view(quotas: TenantQuotas, tenant_id: str) -> QuotasView:
    own = await quotas.limits(tenant_id)
    running, sandboxes, spent = await quotas.usage(tenant_id)
    egress_bytes = await quotas.egress_bytes(tenant_id)
    return QuotasView(
        tenant_id=tenant_id,
        limits=quotas.quotas_of(own),
        own=own,
        usage=QuotaUsage(
            running_tasks=running,
            sandboxes=sandboxes,
            spend_usd_today=spent,
            egress_bytes_today=egress_bytes,
        ),
    )
