"""A tenant's quotas (issue 9, part 3) on a real Redis: running tasks, sandboxes held, spend per
day with running tasks' budgets reserved, and what the operator overrides."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from services.gateway.errors import QuotaExceeded
from services.gateway.quotas.limits import QuotaDefaults, TenantLimits
from services.gateway.quotas.service import TenantQuotas
from shared.admission import SandboxSeats
from shared.egress_usage import ALLOWANCES_KEY, egress_bytes_key, utc_day
from shared.events import AgentState, new_id
from shared.state import TaskState, TaskUsage
from shared.state_store import TaskStateStore

POOL = "quota-tests"


def _quotas(redis: Redis, **defaults: object) -> TenantQuotas:
    return TenantQuotas(TaskStateStore(redis), QuotaDefaults(**defaults), POOL)  # type: ignore[arg-type]


async def _task(store: TaskStateStore, **fields: object) -> str:
    task_id = new_id()
    await store.create(TaskState(task_id=task_id, task="t", max_iterations=5, **fields))  # type: ignore[arg-type]
    return task_id


async def _end(store: TaskStateStore, task_id: str, cost_usd: float = 0.0) -> None:
    state = await store.load(task_id)
    assert state is not None
    await store.save(
        state.model_copy(
            update={"agent_state": AgentState.FINISHED, "usage": TaskUsage(cost_usd=cost_usd)}
        )
    )


async def test_running_tasks_are_bounded_and_an_ended_task_frees_its_place(redis: Redis) -> None:
    quotas = _quotas(redis, max_running_tasks=2)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    first, second = await _task(store), await _task(store)
    for task_id in (first, second):
        assert await quotas.admit(tenant, task_id, None, limits) == 10.0  # the default
    assert await quotas.admit(tenant, first, None, limits) == 10.0  # again: counted once
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit(tenant, await _task(store), None, limits)
    error = refused.value
    assert error.status_code == 429 and error.headers == {"Retry-After": "30"}
    assert error.extra == {"limit": "max_running_tasks", "limit_value": 2, "current": 2}
    assert "the tenant has 2 running tasks, the most it may (2)" in error.detail

    await _end(store, first)
    third = await _task(store)
    await quotas.admit(tenant, third, None, limits)
    assert (await quotas.usage(tenant))[0] == 2


async def test_spend_per_day_reserves_budgets_and_settles_at_the_real_cost(redis: Redis) -> None:
    quotas = _quotas(redis, max_spend_usd_per_day=1.0)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    first = await _task(store)
    assert await quotas.admit(tenant, first, 0.6, limits) == 0.6
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit(tenant, await _task(store), 0.6, limits)
    error = refused.value
    assert error.extra is not None and error.extra["limit"] == "max_spend_usd_per_day"
    now = datetime.now(UTC)
    to_midnight = 86_400 - (now.hour * 3600 + now.minute * 60 + now.second)
    assert error.headers is not None
    assert abs(int(error.headers["Retry-After"]) - to_midnight) <= 2
    assert "left of the tenant's spend for today ($0.4000 of $1.0000" in error.detail

    # No budget asked: the default ($10), capped at what is left of the day's.
    assert await quotas.admit(tenant, await _task(store), None, limits) == pytest.approx(0.4)
    assert (await quotas.usage(tenant))[2] == pytest.approx(1.0)
    with pytest.raises(QuotaExceeded):  # nothing left
        await quotas.admit(tenant, await _task(store), None, limits)

    await _end(store, first, cost_usd=0.1)  # it spent 0.1 of its 0.6
    assert (await quotas.usage(tenant))[2] == pytest.approx(0.5)
    assert await quotas.admit(tenant, await _task(store), 0.5, limits) == 0.5


async def test_a_resumed_task_is_admitted_again_and_charged_what_it_spends_after(
    redis: Redis,
) -> None:
    quotas = _quotas(redis, max_running_tasks=1, max_spend_usd_per_day=1.0)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    task_id = await _task(store, max_budget_usd=0.5, initial_budget_usd=0.5)
    await quotas.admit(tenant, task_id, 0.5, limits)
    await _end(store, task_id, cost_usd=0.5)  # it hit its budget
    other = await _task(store)
    await quotas.admit(tenant, other, 0.2, limits)  # the place is free again
    state = await store.load(task_id)
    assert state is not None
    with pytest.raises(QuotaExceeded, match="max_running_tasks"):
        await quotas.readmit(tenant, state, limits)
    await _end(store, other, cost_usd=0.2)
    with pytest.raises(QuotaExceeded, match="max_spend_usd_per_day"):  # 0.7 spent, 0.5 asked
        await quotas.readmit(tenant, state, limits)
    await quotas.set_limits(tenant, TenantLimits(max_spend_usd_per_day=2.0))
    await quotas.readmit(tenant, state, await quotas.quotas(tenant))
    # Until the controller takes the message its State still reads FINISHED: it counts.
    assert await quotas.usage(tenant) == (1, 0, pytest.approx(1.2))
    await _end(store, task_id, cost_usd=0.6)  # resumed, spent 0.1 more, ended
    assert await quotas.usage(tenant) == (0, 0, pytest.approx(0.8))


async def test_sandboxes_held_by_a_tenants_tasks_and_sub_tasks_are_bounded(redis: Redis) -> None:
    quotas = _quotas(redis, max_sandboxes=2)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    child = await _task(store)
    root = await _task(store, sub_tasks=[child])
    await quotas.admit(tenant, root, None, limits)
    seats = SandboxSeats(redis, POOL, max_seats=100)
    for task in (root, child):  # the runtime seats both, each as the tenant's
        await seats.hold(task, tenant)
    try:
        with pytest.raises(QuotaExceeded) as refused:
            await quotas.admit(tenant, await _task(store), None, limits)
        assert refused.value.extra == {"limit": "max_sandboxes", "limit_value": 2, "current": 2}
    finally:
        for task in (root, child):
            await seats.release(task)


async def _set(store: TaskStateStore, task_id: str, agent_state: AgentState) -> None:
    state = await store.load(task_id)
    assert state is not None
    await store.save(state.model_copy(update={"agent_state": agent_state}))


async def test_sandboxes_count_what_the_tenants_tasks_hold_not_what_runs(redis: Redis) -> None:
    """A task waiting for input holds its sandbox; one that ended in ERROR keeps it (a user
    message may resume it) though it no longer runs; a sub-task holds its own after its root
    ended. Each counts until the pool frees its seat."""
    quotas = _quotas(redis, max_sandboxes=3, max_running_tasks=10)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    seats = SandboxSeats(redis, POOL, max_seats=100)
    waiting, failed = await _task(store), await _task(store)
    child = await _task(store)
    parent = await _task(store, sub_tasks=[child])
    for task_id in (waiting, failed, parent):
        await quotas.admit(tenant, task_id, None, limits)
    for task in (waiting, failed, child):
        await seats.hold(task, tenant)
    try:
        await _set(store, waiting, AgentState.AWAITING_USER_INPUT)
        await _set(store, failed, AgentState.ERROR)
        await _set(store, parent, AgentState.FINISHED)  # its sub-task still runs
        # Two of the three no longer run; all three trees hold a sandbox.
        assert (await quotas.usage(tenant))[:2] == (1, 3)
        with pytest.raises(QuotaExceeded) as refused:
            await quotas.admit(tenant, await _task(store), None, limits)
        assert refused.value.extra == {"limit": "max_sandboxes", "limit_value": 3, "current": 3}

        # The pool frees the sub-task's seat (it ended): the parent's tree is let go.
        await _set(store, child, AgentState.FINISHED)
        await seats.release(child)
        assert (await quotas.usage(tenant))[1] == 2
        holders = f"deckhands:tenant:{tenant}:holders"
        assert set(await redis.hkeys(holders)) == {waiting.encode(), failed.encode()}  # type: ignore[misc]
        newcomer = await _task(store)
        await quotas.admit(tenant, newcomer, None, limits)

        # The ERROR task's sandbox was given away while others queued: no seat, let go; a user
        # message resuming it counts its tree again.
        await seats.release(failed)
        assert (await quotas.usage(tenant))[1] == 1
        assert failed.encode() not in await redis.hkeys(holders)  # type: ignore[misc]
        state = await store.load(failed)
        assert state is not None
        await quotas.readmit(tenant, state, limits)
        await seats.hold(failed, tenant)
        assert (await quotas.usage(tenant))[1] == 2
    finally:
        for task in (waiting, failed, child):
            await seats.release(task)


async def test_the_operators_limits_override_the_defaults_field_by_field(redis: Redis) -> None:
    quotas = _quotas(redis, max_running_tasks=5, max_sub_tasks=3)
    tenant = f"t-{new_id()[:8]}"
    await quotas.set_limits(tenant, TenantLimits(max_running_tasks=0, allow_trajectory_tasks=True))
    limits = await quotas.quotas(tenant)
    assert (limits.max_running_tasks, limits.max_sub_tasks) == (0, 3)
    assert limits.allow_trajectory_tasks
    with pytest.raises(QuotaExceeded, match="max_running_tasks"):
        await quotas.admit(tenant, await _task(quotas.store), None, limits)


async def test_a_released_admission_gives_back_its_place_and_budget(redis: Redis) -> None:
    quotas = _quotas(redis, max_running_tasks=1, max_spend_usd_per_day=1.0)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    task_id = await _task(store)
    await quotas.admit(tenant, task_id, 1.0, limits)
    await quotas.release(tenant, task_id)
    assert await quotas.usage(tenant) == (0, 0, pytest.approx(0.0))


async def test_a_deleted_task_frees_its_place_and_keeps_its_budget_charged(
    redis: Redis,
) -> None:
    quotas = _quotas(redis, max_running_tasks=1, max_spend_usd_per_day=1.0)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    task_id = await _task(store)
    await quotas.admit(tenant, task_id, 0.5, limits)
    await store.delete(task_id)
    await quotas.forget(tenant, task_id)
    # What it spent went with its State: its whole budget stays spent for the day.
    assert await quotas.usage(tenant) == (0, 0, pytest.approx(0.5))


async def test_egress_bytes_per_day_refuse_only_tasks_with_a_network_policy(redis: Redis) -> None:
    """Issue 27, item 5: the allowance is published for the egress proxies; once the bytes
    they counted today reach it, a task with a policy is refused, one without is not."""
    quotas = _quotas(redis, max_egress_bytes_per_day=5000)
    store, tenant = quotas.store, f"t-{new_id()[:8]}"
    limits = await quotas.quotas(tenant)
    await quotas.admit(tenant, await _task(store), None, limits, egress=True)
    assert await redis.hget(ALLOWANCES_KEY, tenant) == b"5000"
    day = utc_day(datetime.now(UTC))
    await redis.incrby(egress_bytes_key(tenant, day), 5000)  # as the proxies count
    assert await quotas.egress_bytes(tenant) == 5000
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.admit(tenant, await _task(store), None, limits, egress=True)
    assert refused.value.extra == {
        "limit": "max_egress_bytes_per_day",
        "limit_value": 5000,
        "current": 5000,
    }
    assert "moved 5000 bytes" in refused.value.detail
    await quotas.admit(tenant, await _task(store), None, limits)  # no policy: admitted
    # The operator's own limit for the tenant wins, and reaches the proxies at once.
    await quotas.set_limits(tenant, TenantLimits(max_egress_bytes_per_day=10_000))
    assert await redis.hget(ALLOWANCES_KEY, tenant) == b"10000"
    await quotas.admit(tenant, await _task(store), None, await quotas.quotas(tenant), egress=True)
    await quotas.set_limits(tenant, TenantLimits())
    assert await redis.hget(ALLOWANCES_KEY, tenant) == b"5000"  # the server's default again
