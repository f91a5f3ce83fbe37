"""The records behind a tenant's quotas: the operator's limits as Redis caches them, and the counts.

The operator's limits are kept durably in the tenants bucket (`limits.<id>`, TenantRecords)
and cached in Redis (`deckhands:tenant:<id>:limits`, refilled from the bucket on a miss), so
a Redis that lost its data still applies them. The counts below are kept in Redis and settled
against the States; when Redis lost them (a marker key, `counts-complete`, is gone with them),
the first gateway to need them counts them again from the tenant's tasks (their durable records,
services.gateway.tasks.records, and their States, which the controller rebuilds from the log):
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
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.admission import seats_prefix
from shared.events import AgentState, utc_now
from shared.state import TaskState
from shared.state_store import TaskStateStore

from ..tasks.records import IndexRange, TaskRecords
from .reservations import ENDED, SETTLE, SPEND_KEPT_S, UNHOLD, Holder, Reservation, as_text, utc_day

__all__ = ["AdmissionCounts", "QuotaRecords"]

_PREFIX = "deckhands"
_RECOUNT_PAGE = 500
_RECOUNT_LOCK_S = 60  # one gateway counts again at a time; a dead one's turn passes after this
_RECOUNT_WAIT_S = 5.0  # another gateway counting: wait this long for it, then go on
_HOLDERS_SLACK = 64  # trees kept beyond twice the running tasks before the ended are let go


@dataclass(frozen=True)
class AdmissionCounts:
    """A tenant's counts as an admission reads them (QuotaRecords.admission_counts)."""

    admitted: bool  # the task is counted as running already (a retried request)
    seats_held: int
    spent_usd: float  # today's, as counted (settled only when a limit needs it)
    holders: int
    running: int


class QuotaRecords:
    """The counts of a tenant's quotas in Redis (see the module's docstring): settled against the
    States, counted again from the tenant's tasks when Redis lost them. The base of TenantQuotas."""

    def __init__(
        self,
        store: TaskStateStore,
        pool_name: str = "default",
        prefix: str = _PREFIX,
    ) -> None:
        self.store = store
        self.redis: Redis = store.redis
        # The tenants' tasks, to count again what Redis lost; None: never counted again.
        self.tasks: TaskRecords | None = None
        self.prefix = prefix
        self._seats_key = f"{seats_prefix(pool_name)}:seats"
        self._held_key = f"{seats_prefix(pool_name)}:held"
        self._settle = self.redis.register_script(SETTLE)
        self._unhold = self.redis.register_script(UNHOLD)

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

    async def seats_held(self, tenant_id: str) -> int:
        """The sandbox seats the tenant's tasks hold (roots and sub-tasks), as the pool counts
        them (shared.admission)."""
        held = await self.redis.hget(self._held_key, tenant_id)
        return int(held or 0)

    async def admission_counts(self, tenant_id: str, task_id: str, day: str) -> AdmissionCounts:
        """What an admission reads, in one round trip (each a round trip of its own cost a
        POST about a millisecond of the gateway's CPU under a burst); the counts counted again
        first if Redis lost them."""
        for attempt in range(2):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.exists(self._counted_key(tenant_id))
                pipe.hexists(self._running_key(tenant_id), task_id)
                pipe.hget(self._held_key, tenant_id)
                pipe.get(self._spend_key(tenant_id, day))
                pipe.hlen(self._holders_key(tenant_id))
                pipe.hlen(self._running_key(tenant_id))
                counted, admitted, held, spent, holders, running = await pipe.execute()
            if counted or self.tasks is None or attempt == 1:
                break  # counted, or another gateway still counting: go on with what is there
            await self._ensure_counts(tenant_id)
        return AdmissionCounts(
            admitted=bool(admitted),
            seats_held=int(held or 0),
            spent_usd=float(spent or 0.0),
            holders=int(holders),
            running=int(running),
        )

    async def _prune_holders(self, counts: AdmissionCounts, tenant_id: str) -> None:
        """Let go of the trees that ended and hold nothing, once they are many: a walk over the
        tenant's trees now and then, not on every admission."""
        if counts.holders > 2 * counts.running + _HOLDERS_SLACK:
            await self._sandboxes(tenant_id)

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
        today = utc_day(now)
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
                    day = utc_day(state.created_at)
                    if state.agent_state not in ENDED:
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
                    if state.agent_state not in ENDED or state.agent_state is AgentState.ERROR:
                        holder = Holder(at=now, state_version=state.version)
                        pipe.hsetnx(self._holders_key(tenant_id), task_id, holder.model_dump_json())
                await pipe.execute()
            if len(batch) < _RECOUNT_PAGE:
                break
            where = IndexRange(after_member=batch[-1][1])
        if spend_lost and spent_today > 0:
            await self.redis.set(spend_key, repr(spent_today), ex=SPEND_KEPT_S, nx=True)

    async def _running(self, tenant_id: str) -> dict[str, TaskState | None]:
        """The tenant's running tasks with their States, after settling those that ended."""
        await self._ensure_counts(tenant_id)
        key = self._running_key(tenant_id)
        entries = {
            as_text(task): as_text(raw) for task, raw in (await self.redis.hgetall(key)).items()
        }
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
                args=[task_id, entries[task_id], repr(charge), SPEND_KEPT_S],
            )
        return running

    async def _sandboxes(self, tenant_id: str) -> int:
        """Seats held by the tenant's task trees, roots and sub-tasks (whose ids their States
        list); a tree that has ended and holds none is let go."""
        await self._ensure_counts(tenant_id)
        key = self._holders_key(tenant_id)
        entries = {
            as_text(task): as_text(raw) for task, raw in (await self.redis.hgetall(key)).items()
        }
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
                ended[root] = ended[root] and state.agent_state in ENDED
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
