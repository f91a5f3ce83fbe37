"""A task's egress policy through the real gateway process (issue 27): its rules and presets
within the operator's bound (DECKHANDS_EGRESS_ALLOW, EGRESS_ALLOW here) or the tenant's own,
a 422 naming what is refused, the policy in the creation request, the State and the view."""

from __future__ import annotations

from typing import Any

import httpx
from gateway_doubles import EGRESS_ALLOW, controller_inbox, make_as_controller
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from shared.events import new_id
from tools.api_access import auth_headers, issue_key


async def _tenant(gateway_url: str, admin_key: str, **limits: Any) -> httpx.AsyncClient:
    """A new tenant's client, once the operator set its `limits`."""
    tenant = f"egress-{new_id()[:10]}"
    key = issue_key(gateway_url, admin_key, tenant)
    if limits:
        async with httpx.AsyncClient(
            base_url=gateway_url, headers=auth_headers(admin_key), timeout=15
        ) as admin:
            answer = await admin.put(f"/v1/admin/tenants/{tenant}/limits", json=limits)
        assert answer.status_code == 200, answer.text
        assert answer.json()["limits"]["egress_allow"] == limits["egress_allow"]
    return httpx.AsyncClient(base_url=gateway_url, headers=auth_headers(key), timeout=15)


async def test_a_task_gets_its_rules_and_presets_within_the_bound(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    network = {"allow": ["API.github.com:443", "203.0.113.7"], "presets": ["python"]}
    created = await http.post("/v1/tasks", json={"task": "pip install", "network": network})
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]
    policy = ["api.github.com:443", "203.0.113.7", "pypi.org", "files.pythonhosted.org"]
    # The creation request carries it: the task's first log entry records it.
    [queued] = await controller_inbox(nc, task_id, expect=1)
    assert (
        queued["network"] == {"allow": policy, "between_actions": []}
        and queued["network_egress"] is False
    )
    state = await make_as_controller(redis, task_id)
    assert state.network is not None and list(state.network.allow) == policy
    assert not state.network_egress  # through the egress proxy, never the plain network
    task = (await http.get(f"/v1/tasks/{task_id}")).json()
    assert (
        task["network"] == {"allow": policy, "between_actions": []}
        and task["network_egress"] is False
    )
    # No rule at all: no network.
    empty = await http.post("/v1/tasks", json={"task": "x", "network": {"allow": []}})
    assert (await http.get(f"/v1/tasks/{empty.json()['id']}")).json()["network"] is None


async def test_a_policy_wider_than_the_bound_a_bad_rule_or_an_unknown_preset_is_a_422(
    http: httpx.AsyncClient,
) -> None:
    for network, named in [
        ({"allow": ["pypi.org", "github.com"]}, "the rule 'github.com' is outside"),
        ({"allow": ["api.github.com"]}, "the rule 'api.github.com' is outside"),  # any port
        ({"allow": ["10.0.0.0/8"]}, "the rule '10.0.0.0/8' is outside"),
        ({"allow": ["*"]}, "the rule '*' is outside"),
        ({"presets": ["python", "node"]}, "unknown preset 'node'"),
    ]:
        resp = await http.post("/v1/tasks", json={"task": "x", "network": network})
        assert resp.status_code == 422, (network, resp.text)
        assert named in resp.json()["detail"], resp.text
    resp = await http.post("/v1/tasks", json={"task": "x", "network": {"allow": ["a b.org"]}})
    assert resp.status_code == 422
    assert "network.allow.0" in resp.json()["message"]
    assert "'a b.org' is not a host name" in resp.json()["message"]
    resp = await http.post("/v1/tasks", json={"task": "x", "network": {"deny": ["pypi.org"]}})
    assert resp.status_code == 422 and "network.deny" in resp.json()["message"]
    assert (await http.get("/v1/tasks", params={"limit": 1})).status_code == 200


async def test_a_tenants_bound_is_within_the_servers_and_bounds_its_tasks(
    gateway_url: str, admin_key: str
) -> None:
    async with httpx.AsyncClient(
        base_url=gateway_url, headers=auth_headers(admin_key), timeout=15
    ) as admin:
        tenant = f"egress-{new_id()[:10]}"
        issue_key(gateway_url, admin_key, tenant)
        path = f"/v1/admin/tenants/{tenant}/limits"
        wider = await admin.put(path, json={"egress_allow": ["pypi.org", "*.example.com"]})
        assert wider.status_code == 422, wider.text
        assert "the rule '*.example.com' is outside" in wider.json()["detail"]
        assert (await admin.get(path)).json()["own"]["egress_allow"] is None
        bad = await admin.put(path, json={"egress_allow": ["pypi.org:99999"]})
        assert bad.status_code == 422 and "port 99999 is out of range" in bad.text

    async with await _tenant(gateway_url, admin_key, egress_allow=["pypi.org"]) as http:
        resp = await http.post("/v1/tasks", json={"task": "x", "network": {"presets": ["python"]}})
        assert resp.status_code == 422
        assert "'files.pythonhosted.org' is outside" in resp.json()["detail"]
        assert "its egress_allow" in resp.json()["detail"]
        created = await http.post("/v1/tasks", json={"task": "x", "network_egress": True})
        assert created.status_code == 202, created.text
        task = (await http.get(f"/v1/tasks/{created.json()['id']}")).json()
        assert task["network"] == {"allow": ["pypi.org"], "between_actions": []}
        assert (await http.get("/v1/quotas")).json()["limits"]["egress_allow"] == ["pypi.org"]

    # A tenant given no egress gets none: its task's network_egress is refused.
    async with await _tenant(gateway_url, admin_key, egress_allow=[]) as http:
        resp = await http.post("/v1/tasks", json={"task": "x", "network_egress": True})
        assert resp.status_code == 403 and "its egress_allow is empty" in resp.json()["detail"]
        resp = await http.post("/v1/tasks", json={"task": "x", "network": {"allow": ["pypi.org"]}})
        assert resp.status_code == 422


async def test_network_egress_asks_for_the_whole_bound(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/tasks", json={"task": "x", "network_egress": True})
    task = (await http.get(f"/v1/tasks/{created.json()['id']}")).json()
    assert task["network"] == {"allow": EGRESS_ALLOW, "between_actions": []}
    assert (await http.get("/v1/quotas")).json()["limits"]["egress_allow"] == EGRESS_ALLOW


async def test_a_message_widens_a_tasks_policy_within_its_bound(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    created = await http.post(
        "/v1/tasks", json={"task": "pip install", "network": {"allow": ["pypi.org"]}}
    )
    task_id = created.json()["id"]
    await controller_inbox(nc, task_id, expect=1)
    await make_as_controller(redis, task_id)
    sent = await http.post(
        f"/v1/tasks/{task_id}/messages",
        json={"content": "wheels too", "network": {"presets": ["python"]}},
    )
    assert sent.status_code == 202, sent.text
    [message] = await controller_inbox(nc, task_id, expect=1)
    # The rules travel with the message, which the controller logs and applies.
    assert message["kind"] == "message"
    assert message["network"] == {
        "allow": ["pypi.org", "files.pythonhosted.org"],
        "between_actions": [],
    }
    outside = await http.post(
        f"/v1/tasks/{task_id}/messages",
        json={"content": "everything", "network": {"allow": ["evil.example.com"]}},
    )
    assert outside.status_code == 422 and "evil.example.com" in outside.text, outside.text
    # A task made without network access has no way out to widen.
    closed = (await http.post("/v1/tasks", json={"task": "no network"})).json()["id"]
    await controller_inbox(nc, closed, expect=1)
    await make_as_controller(redis, closed)
    refused = await http.post(
        f"/v1/tasks/{closed}/messages",
        json={"content": "go online", "network": {"allow": ["pypi.org"]}},
    )
    assert refused.status_code == 422 and "without network access" in refused.text
