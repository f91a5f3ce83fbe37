"""Attacks on the fair share (issue 25), on the whole running system: a tenant that tries to
claim another tenant's name or a bigger share for its tasks, or a priority that does not exist,
is refused with a 422 that names the field, and nothing is created; it cannot raise its own seat
weight; its tasks, sub-tasks included, count against its own share whatever it sends."""

from __future__ import annotations

import time

import httpx
import redis
from conftest import Tenant

from shared.admission import WEIGHTS_KEY
from shared.state import TaskState
from tools.api_access import auth_headers
from tools.stack import Stack


def _state(stack: Stack, task_id: str) -> TaskState:
    client = redis.Redis(**stack.redis_login())
    try:
        deadline = time.monotonic() + 10
        while (raw := client.hget(f"deckhands:task:{task_id}", "state")) is None:
            assert time.monotonic() < deadline, f"no State for {task_id}"
            time.sleep(0.1)
        return TaskState.model_validate_json(raw)  # type: ignore[arg-type]
    finally:
        client.close()


def test_a_task_cannot_claim_another_tenant_or_a_bigger_share(beta: Tenant) -> None:
    before = beta.http.get("/v1/tasks", params={"limit": 100}).json()["tasks"]
    for forged in (
        {"tenant_id": "alpha"},
        {"seat_weight": 1000},
        {"priority": "urgent"},
        {"priority": "interactive", "weight": 50},
    ):
        answer = beta.http.post("/v1/tasks", json={"task": "count: forged", **forged})
        assert answer.status_code == 422, (forged, answer.text)
        named = [".".join(map(str, e["loc"])) for e in answer.json()["detail"]]
        assert any(name in " ".join(named) for name in forged), (forged, named)
    after = beta.http.get("/v1/tasks", params={"limit": 100}).json()["tasks"]
    assert len(after) == len(before)  # nothing created


def test_a_tenant_cannot_raise_its_own_seat_weight(beta: Tenant, stack: Stack) -> None:
    for headers in (auth_headers(beta.key), {}):
        answer = httpx.put(
            f"{stack.config.gateway_url}/v1/admin/tenants/{beta.name}/limits",
            json={"seat_weight": 1000},
            headers=headers,
            timeout=30,
        )
        assert answer.status_code == 401, answer.text
    client = redis.Redis(**stack.redis_login())
    try:
        assert client.hget(WEIGHTS_KEY, beta.name) is None  # still the default weight
    finally:
        client.close()
    limits = beta.http.get("/v1/quotas").json()["limits"]
    assert limits["seat_weight"] == 1.0


def test_a_tasks_share_is_its_own_tenants_whatever_it_asks(beta: Tenant, stack: Stack) -> None:
    batch = beta.create(task="count: batch work", priority="batch")
    urgent = beta.create(task="count: urgent work")
    try:
        for task_id, priority in ((batch, "batch"), (urgent, "interactive")):
            state = _state(stack, task_id)
            assert (state.tenant_id, state.priority.value) == (beta.name, priority)
            assert beta.view(task_id)["priority"] == priority
        # The runtime counts the seat it takes against the tenant's share, not another's.
        client = redis.Redis(**stack.redis_login())
        try:
            deadline = time.monotonic() + 60
            owners: set[str] = set()
            while time.monotonic() < deadline:
                seated = client.hgetall(f"deckhands:seats:{stack.config.pool_name}:owner")
                owners = {
                    v.decode()
                    for k, v in seated.items()  # type: ignore[union-attr]
                    if k.decode() in (batch, urgent)
                }
                if owners:
                    break
                time.sleep(0.2)
            assert owners == {beta.name}, owners
        finally:
            client.close()
    finally:
        for task_id in (batch, urgent):
            beta.http.post(f"/v1/tasks/{task_id}/stop")
