"""API keys and tenants through the real gateway process: the admin API, which routes need a
key, and that a task is its tenant's alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_doubles import StorageDouble, controller_inbox
from nats.aio.client import Client as NatsClient

from services.gateway.main import build_app
from services.gateway.settings import GatewaySettings
from services.gateway.tenants.api_keys import issue_api_key
from shared.events import new_id
from tools.api_access import auth_headers, issue_key

TASK_ROUTES = [
    ("GET", "/v1/tasks/{id}", None),
    ("GET", "/v1/tasks/{id}/events", None),
    ("GET", "/v1/tasks/{id}/events/stream", None),
    ("GET", "/v1/tasks/{id}/trajectory", None),
    ("GET", "/v1/tasks/{id}/blobs/" + "0" * 64, None),
    ("POST", "/v1/tasks/{id}/messages", {"content": "hi"}),
    ("POST", "/v1/tasks/{id}/stop", None),
    ("POST", "/v1/tasks/{id}/pause", None),
    ("POST", "/v1/tasks/{id}/resume", None),
    ("POST", "/v1/tasks/{id}/confirmation", {"action_id": "a", "approve": True}),
    ("DELETE", "/v1/tasks/{id}", None),
]


@pytest.fixture
async def admin(gateway_url: str, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=gateway_url, headers=auth_headers(admin_key), timeout=15
    ) as client:
        yield client


@pytest.fixture
async def anonymous(gateway_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=15) as client:
        yield client


async def test_the_admin_api_makes_tenants_and_keys(admin: httpx.AsyncClient) -> None:
    tenant = f"t-{new_id()[:12]}"
    created = await admin.post("/v1/admin/tenants", json={"id": tenant, "name": "Team T"})
    assert created.status_code == 201, created.text
    assert created.json()["id"] == tenant and created.json()["name"] == "Team T"
    again = await admin.post("/v1/admin/tenants", json={"id": tenant})
    assert again.status_code == 409
    assert tenant in [t["id"] for t in (await admin.get("/v1/admin/tenants")).json()["tenants"]]
    assert (await admin.get(f"/v1/admin/tenants/{tenant}")).json()["name"] == "Team T"
    assert (await admin.get("/v1/admin/tenants/nobody-here")).status_code == 404

    issued = await admin.post(f"/v1/admin/tenants/{tenant}/keys", json={"name": "ci"})
    assert issued.status_code == 201, issued.text
    body = issued.json()
    key, prefix = body["key"], body["prefix"]
    assert key.startswith(prefix + "_") and body["revoked_at"] is None
    listed = (await admin.get(f"/v1/admin/tenants/{tenant}/keys")).json()["keys"]
    assert [(k["prefix"], k["name"]) for k in listed] == [(prefix, "ci")]
    assert "key" not in listed[0]  # shown once, at creation only
    assert key not in (await admin.get(f"/v1/admin/tenants/{tenant}/keys")).text

    revoked = await admin.delete(f"/v1/admin/tenants/{tenant}/keys/{prefix}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    missing = await admin.delete(f"/v1/admin/tenants/{tenant}/keys/dh_000000000000")
    assert missing.status_code == 404
    bad = await admin.post("/v1/admin/tenants", json={"id": "Not A Valid Id"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "id"


async def test_the_admin_api_wants_the_admin_key(
    anonymous: httpx.AsyncClient, api_key: str
) -> None:
    for headers in ({}, auth_headers(api_key), auth_headers("x" * 64)):
        for method, path in [
            ("GET", "/v1/admin/tenants"),
            ("POST", "/v1/admin/tenants/tests/keys"),
            ("GET", "/v1/admin/tenants/tests/keys"),
        ]:
            answer = await anonymous.request(method, path, headers=headers, json={})
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"


async def test_no_admin_key_set_means_no_admin_api(gateway_settings: GatewaySettings) -> None:
    settings = gateway_settings.model_copy(update={"admin_api_key": None})
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            answer = await http.get("/v1/admin/tenants", headers=auth_headers(""))
            assert answer.status_code == 401
            assert "DECKHANDS_ADMIN_API_KEY is not set" in answer.json()["detail"]


def test_a_short_admin_key_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="at least 32 characters"):
        GatewaySettings(admin_api_key="short")
    assert GatewaySettings(admin_api_key="").admin_api_key is None


async def test_every_task_route_wants_a_key_and_the_probes_do_not(
    anonymous: httpx.AsyncClient, http: httpx.AsyncClient, storage: StorageDouble
) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "mine"})).json()["id"]
    routes = [("POST", "/v1/tasks", {"task": "x"}), ("GET", "/v1/tasks", None)] + [
        (method, path.format(id=task_id), body) for method, path, body in TASK_ROUTES
    ]
    for headers in (
        {},
        auth_headers(issue_api_key().key),  # well formed, never issued
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        auth_headers("not-a-key"),
    ):
        for method, path, body in routes:
            answer = await anonymous.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
            assert "API key" in answer.json()["detail"]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await anonymous.get(path)).status_code == 200, path


async def test_another_tenants_task_is_not_found_on_every_route(
    http: httpx.AsyncClient,
    gateway_url: str,
    admin_key: str,
    nc: NatsClient,
    storage: StorageDouble,
) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "mine"})).json()["id"]
    other_key = issue_key(gateway_url, admin_key, f"other-{new_id()[:8]}")
    async with httpx.AsyncClient(
        base_url=gateway_url, headers=auth_headers(other_key), timeout=15
    ) as other:
        for method, path, body in TASK_ROUTES:
            answer = await other.request(method, path.format(id=task_id), json=body)
            assert answer.status_code == 404, (method, path, answer.text)
            # Word for word what a task that does not exist gets.
            assert answer.json()["detail"] == f"task {task_id!r} not found"
    # Nothing of theirs reached the controller: only the owner's creation request.
    queued = await controller_inbox(nc, task_id, expect=1, settle_s=1.0)
    assert [q["kind"] for q in queued] == ["task_created"]
    assert (await http.get(f"/v1/tasks/{task_id}")).status_code == 200


async def test_idempotency_keys_are_per_tenant(
    http: httpx.AsyncClient, gateway_url: str, admin_key: str
) -> None:
    key = {"Idempotency-Key": new_id()}
    mine = (await http.post("/v1/tasks", json={"task": "same"}, headers=key)).json()["id"]
    other_key = issue_key(gateway_url, admin_key, f"other-{new_id()[:8]}")
    async with httpx.AsyncClient(
        base_url=gateway_url, headers=auth_headers(other_key), timeout=15
    ) as other:
        theirs = await other.post("/v1/tasks", json={"task": "same"}, headers=key)
        assert theirs.status_code == 202
        assert "idempotent-replayed" not in theirs.headers
        assert theirs.json()["id"] != mine


async def _new_tenant(admin: httpx.AsyncClient) -> tuple[str, str]:
    tenant = f"t-{new_id()[:12]}"
    assert (await admin.post("/v1/admin/tenants", json={"id": tenant})).status_code == 201
    issued = await admin.post(f"/v1/admin/tenants/{tenant}/keys", json={"name": "first"})
    assert issued.status_code == 201, issued.text
    return tenant, str(issued.json()["key"])


async def test_a_disabled_tenant_is_told_why_and_a_deleted_one_is_gone(
    admin: httpx.AsyncClient, anonymous: httpx.AsyncClient, gateway_url: str
) -> None:
    tenant, key = await _new_tenant(admin)
    mine = auth_headers(key)
    created = await anonymous.post("/v1/tasks", json={"task": "live"}, headers=mine)
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]

    disabled = await admin.post(
        f"/v1/admin/tenants/{tenant}/disable", json={"reason": "invoice 42 unpaid"}
    )
    assert disabled.status_code == 200 and disabled.json()["disabled_at"] is not None
    for method, path in [
        ("GET", "/v1/tasks"),
        ("GET", f"/v1/tasks/{task_id}"),
        ("GET", "/v1/keys"),
    ]:
        answer = await anonymous.request(method, path, headers=mine)
        assert answer.status_code == 403, answer.text
        assert "disabled" in answer.json()["detail"]
        assert "invoice 42 unpaid" in answer.json()["detail"]
    enabled = await admin.post(f"/v1/admin/tenants/{tenant}/enable")
    assert enabled.status_code == 200 and enabled.json()["disabled_at"] is None
    assert (await anonymous.get("/v1/tasks", headers=mine)).status_code == 200

    # A live task: refused without force (nothing changes), with force it is asked to stop.
    refused = await admin.delete(f"/v1/admin/tenants/{tenant}")
    assert refused.status_code == 409 and task_id in refused.json()["detail"]
    assert (await anonymous.get("/v1/tasks", headers=mine)).status_code == 200
    deleted = await admin.delete(f"/v1/admin/tenants/{tenant}", params={"force": "true"})
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": tenant, "keys_revoked": 1, "tasks_stopped": 1}
    assert (await anonymous.get("/v1/tasks", headers=mine)).status_code == 401
    assert (await admin.get(f"/v1/admin/tenants/{tenant}")).status_code == 404
    again = await admin.post("/v1/admin/tenants", json={"id": tenant})
    assert again.status_code == 409 and "was deleted" in again.json()["detail"]
    assert (await admin.delete("/v1/admin/tenants/nobody-here")).status_code == 404


async def test_a_tenant_manages_its_own_keys(
    admin: httpx.AsyncClient, anonymous: httpx.AsyncClient, api_key: str
) -> None:
    tenant, key = await _new_tenant(admin)
    mine = auth_headers(key)
    made = await anonymous.post("/v1/keys", json={"name": "ci"}, headers=mine)
    assert made.status_code == 201, made.text
    second, second_prefix = made.json()["key"], made.json()["prefix"]
    assert made.json()["tenant_id"] == tenant
    first_prefix = key[: len("dh_") + 12]
    assert made.json()["created_by"] == first_prefix
    assert (await anonymous.get("/v1/tasks", headers=auth_headers(second))).status_code == 200

    listed = await anonymous.get("/v1/keys", headers=mine)
    assert listed.status_code == 200
    keys = listed.json()["keys"]
    assert [(k["prefix"], k["name"]) for k in keys] == [
        (first_prefix, "first"),
        (second_prefix, "ci"),
    ]
    assert all(k["last_used_at"] is not None for k in keys)
    assert key not in listed.text and second not in listed.text
    # Another tenant's keys are not listed to it, nor can it revoke them.
    assert (
        second_prefix not in (await anonymous.get("/v1/keys", headers=auth_headers(api_key))).text
    )
    other = await anonymous.delete(f"/v1/keys/{second_prefix}", headers=auth_headers(api_key))
    assert other.status_code == 404

    revoked = await anonymous.delete(f"/v1/keys/{first_prefix}", headers=auth_headers(second))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert (await anonymous.get("/v1/tasks", headers=mine)).status_code == 401
    last = await anonymous.delete(f"/v1/keys/{second_prefix}", headers=auth_headers(second))
    assert last.status_code == 409 and "last working key" in last.json()["detail"]
    assert (await anonymous.get("/v1/tasks", headers=auth_headers(second))).status_code == 200
    forced = await anonymous.delete(
        f"/v1/keys/{second_prefix}", params={"force": "true"}, headers=auth_headers(second)
    )
    assert forced.status_code == 200
    assert (await anonymous.get("/v1/tasks", headers=auth_headers(second))).status_code == 401
