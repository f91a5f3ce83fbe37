"""Quotas and safe defaults through the real gateway process (issue 9, parts 3 and 4): 429 with
Retry-After and a body naming the limit, the operator's per-tenant limits, the default budget
and delegation limits in the task's State, replays allowed per tenant, trusted hosts, event
streams per tenant."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_doubles import StorageDouble, controller_inbox, make_as_controller
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from shared.events import AgentState, new_id
from shared.state_store import TaskStateStore
from tools.api_access import auth_headers, issue_key


def _admin(gateway_url: str, admin_key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=gateway_url, headers=auth_headers(admin_key), timeout=15)


async def _tenant(gateway_url: str, admin_key: str, **limits: Any) -> tuple[str, httpx.AsyncClient]:
    tenant = f"q-{new_id()[:10]}"
    key = issue_key(gateway_url, admin_key, tenant)
    if limits:
        async with _admin(gateway_url, admin_key) as admin:
            answer = await admin.put(f"/v1/admin/tenants/{tenant}/limits", json=limits)
        assert answer.status_code == 200, answer.text
    return tenant, httpx.AsyncClient(base_url=gateway_url, headers=auth_headers(key), timeout=15)


async def test_past_the_running_tasks_limit_a_new_task_is_429_and_nothing_is_queued(
    gateway_url: str, admin_key: str, nc: NatsClient, redis: Redis
) -> None:
    _, http = await _tenant(gateway_url, admin_key, max_running_tasks=1)
    async with http:
        first = await http.post("/v1/tasks", json={"task": "one"})
        assert first.status_code == 202
        key = {"Idempotency-Key": new_id()}
        refused = await http.post("/v1/tasks", json={"task": "two"}, headers=key)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "30"
        body = refused.json()
        assert (body["limit"], body["limit_value"], body["current"]) == ("max_running_tasks", 1, 1)
        assert body["detail"].startswith("quota max_running_tasks reached: the tenant has 1")
        listed = (await http.get("/v1/tasks")).json()["tasks"]
        assert [t["id"] for t in listed] == [first.json()["id"]]  # nothing of it was stored

        # The first task ends: the same request (same key) goes through now.
        store = TaskStateStore(redis)
        state = await make_as_controller(redis, first.json()["id"])
        await store.save(state.model_copy(update={"agent_state": AgentState.FINISHED}))
        again = await http.post("/v1/tasks", json={"task": "two"}, headers=key)
        assert again.status_code == 202, again.text
        assert len(await controller_inbox(nc, again.json()["id"], 1)) == 1

        usage = (await http.get("/v1/quotas")).json()
        assert usage["limits"]["max_running_tasks"] == 1
        assert usage["own"]["max_running_tasks"] == 1 and usage["own"]["max_sandboxes"] is None
        assert usage["usage"]["running_tasks"] == 1


async def test_past_the_daily_spend_a_task_is_429_until_midnight(
    gateway_url: str, admin_key: str
) -> None:
    _, http = await _tenant(gateway_url, admin_key, max_spend_usd_per_day=1.0)
    async with http:
        assert (await http.post("/v1/tasks", json={"task": "a", "max_budget_usd": 0.75})).is_success
        refused = await http.post("/v1/tasks", json={"task": "b", "max_budget_usd": 0.5})
        assert refused.status_code == 429
        body = refused.json()
        assert body["limit"] == "max_spend_usd_per_day" and body["current"] == 0.75
        assert 0 < int(refused.headers["retry-after"]) <= 86_400
        # What is left fits; with no budget asked, the task gets what is left.
        fits = await http.post("/v1/tasks", json={"task": "c"})
        assert fits.status_code == 202
        task = (await http.get(f"/v1/tasks/{fits.json()['id']}")).json()
        assert task["max_budget_usd"] == pytest.approx(0.25)


async def test_a_task_carries_the_default_budget_and_the_tenants_delegation_limits(
    gateway_url: str, admin_key: str, redis: Redis
) -> None:
    _, http = await _tenant(
        gateway_url, admin_key, default_max_budget_usd=2.5, max_delegation_depth=1
    )
    async with http:
        created = (await http.post("/v1/tasks", json={"task": "x"})).json()
    state = await make_as_controller(redis, created["id"])
    assert (state.max_budget_usd, state.initial_budget_usd) == (2.5, 2.5)
    assert (state.max_delegation_depth, state.max_sub_tasks, state.delegation_depth) == (1, 10, 0)


async def test_a_trajectory_task_needs_the_operators_leave(
    gateway_url: str, admin_key: str, nc: NatsClient
) -> None:
    tenant, http = await _tenant(gateway_url, admin_key)
    async with http:
        refused = await http.post("/v1/tasks", json={"task": "replay", "trajectory": []})
        assert refused.status_code == 403
        assert "may not create a task from a trajectory" in refused.json()["detail"]
        assert (await http.get("/v1/tasks")).json()["tasks"] == []
        async with _admin(gateway_url, admin_key) as admin:
            allowed = await admin.put(
                f"/v1/admin/tenants/{tenant}/limits", json={"allow_trajectory_tasks": True}
            )
        assert allowed.json()["limits"]["allow_trajectory_tasks"] is True
        created = await http.post("/v1/tasks", json={"task": "replay", "trajectory": []})
        assert created.status_code == 202


async def test_limits_are_the_admins_and_checked(
    gateway_url: str, admin_key: str, api_key: str
) -> None:
    tenant, http = await _tenant(gateway_url, admin_key)
    await http.aclose()
    path = f"/v1/admin/tenants/{tenant}/limits"
    async with _admin(gateway_url, admin_key) as admin:
        as_tenant = await admin.put(
            path, json={"max_running_tasks": 1000}, headers=auth_headers(api_key)
        )
        assert as_tenant.status_code == 401
        bad = await admin.put(path, json={"max_running_tasks": -1})
        assert bad.status_code == 422
        typo = await admin.put(path, json={"max_runing_tasks": 5})
        assert typo.status_code == 422
        missing = await admin.get(f"/v1/admin/tenants/nobody-{new_id()[:6]}/limits")
    assert missing.status_code == 404


async def test_event_streams_are_limited_per_tenant(
    gateway_url: str, admin_key: str, storage: StorageDouble
) -> None:
    _, http = await _tenant(gateway_url, admin_key, max_event_streams=1)
    async with http:
        task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
        async with http.stream("GET", f"/v1/tasks/{task_id}/events/stream") as first:
            assert first.status_code == 200
            second = await http.get(f"/v1/tasks/{task_id}/events/stream")
            assert second.status_code == 429 and second.headers["retry-after"] == "5"
            assert second.json()["limit"] == "max_event_streams"


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.nip.io", ""])
async def test_an_unknown_host_is_refused_but_the_probes_answer(
    gateway_url: str, api_key: str, host: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=15) as http:
        headers = {**auth_headers(api_key), "Host": host}
        refused = await http.get("/v1/tasks", headers=headers)
        assert refused.status_code == 400
        assert "DECKHANDS_TRUSTED_HOSTS" in refused.json()["detail"]
        created = await http.post("/v1/tasks", json={"task": "rebound"}, headers=headers)
        assert created.status_code == 400
        assert (await http.get("/healthz", headers={"Host": host})).status_code == 200
        assert (await http.get("/v1/tasks", headers=auth_headers(api_key))).status_code == 200
