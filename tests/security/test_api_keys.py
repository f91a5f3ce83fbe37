"""Attacks on authentication: every request with no key, a wrong key or a revoked key is 401,
and nothing it asked for happens (no task, no LLM call)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from conftest import Tenant

from services.gateway.tenants.api_keys import issue_api_key, key_prefix_of
from shared.events import new_id
from tools.api_access import auth_headers, issue_key
from tools.stack import Stack

pytestmark = pytest.mark.docker


def _routes(task_id: str) -> list[tuple[str, str, dict[str, object] | None]]:
    return [
        ("GET", f"/v1/tasks/{task_id}", None),
        ("GET", f"/v1/tasks/{task_id}/events", None),
        ("GET", f"/v1/tasks/{task_id}/events/stream", None),
        ("GET", f"/v1/tasks/{task_id}/trajectory", None),
        ("POST", f"/v1/tasks/{task_id}/messages", {"content": "hi"}),
        ("POST", f"/v1/tasks/{task_id}/stop", None),
        ("POST", f"/v1/tasks/{task_id}/pause", None),
        ("POST", f"/v1/tasks/{task_id}/resume", None),
        ("POST", f"/v1/tasks/{task_id}/confirmation", {"action_id": "a", "approve": True}),
    ]


def _refused_everywhere(
    anonymous: httpx.Client,
    headers: dict[str, str],
    alpha: Tenant,
    llm_requests: Callable[[str], int],
    *,
    admin_key: bool = False,
) -> None:
    """Creating, reading and steering are all 401; the task made by no one never ran, and the
    victim's task is untouched."""
    victim = alpha.create(task=f"victim {new_id()}")
    alpha.wait(victim, "FINISHED")
    before = alpha.log(victim)
    text = f"made without a valid key {new_id()}"
    answer = anonymous.post("/v1/tasks", json={"task": text}, headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.headers["www-authenticate"] == "Bearer"
    routes = _routes(victim)
    if not admin_key:
        routes.append(("GET", "/v1/admin/tenants", None))
    for method, path, body in routes:
        answer = anonymous.request(method, path, json=body, headers=headers)
        assert answer.status_code == 401, (method, path, answer.text)
        assert "id" not in answer.json() and "events" not in answer.json()
    assert llm_requests(text) == 0  # no agent ever stepped on it
    assert alpha.log(victim) == before
    assert alpha.view(victim)["state"] == "FINISHED"


def test_no_key_is_401(
    anonymous: httpx.Client, alpha: Tenant, llm_requests: Callable[[str], int]
) -> None:
    _refused_everywhere(anonymous, {}, alpha, llm_requests)


@pytest.mark.parametrize(
    "wrong",
    [
        "never-issued",
        "malformed",
        "admin key as a tenant key",
        "other scheme",
    ],
)
def test_a_wrong_key_is_401(
    wrong: str,
    anonymous: httpx.Client,
    alpha: Tenant,
    stack: Stack,
    llm_requests: Callable[[str], int],
) -> None:
    headers = {
        "never-issued": auth_headers(issue_api_key().key),
        "malformed": auth_headers("dh_" + "0" * 60),
        "admin key as a tenant key": auth_headers(stack.admin_api_key),
        "other scheme": {"Authorization": f"Basic {alpha.key}"},
    }[wrong]
    admin_key = wrong == "admin key as a tenant key"
    _refused_everywhere(anonymous, headers, alpha, llm_requests, admin_key=admin_key)


def test_a_tenant_key_is_not_an_admin_key(anonymous: httpx.Client, alpha: Tenant) -> None:
    for method, path in [
        ("GET", "/v1/admin/tenants"),
        ("POST", "/v1/admin/tenants/alpha/keys"),
        ("GET", "/v1/admin/tenants/alpha/keys"),
    ]:
        answer = anonymous.request(method, path, json={}, headers=auth_headers(alpha.key))
        assert answer.status_code == 401, (method, path, answer.text)


def test_a_revoked_key_is_401(
    anonymous: httpx.Client, alpha: Tenant, stack: Stack, llm_requests: Callable[[str], int]
) -> None:
    key = issue_key(stack.config.gateway_url, stack.admin_api_key, "alpha", name="to revoke")
    headers = auth_headers(key)
    mine = anonymous.post("/v1/tasks", json={"task": "before revocation"}, headers=headers)
    assert mine.status_code == 202, mine.text
    prefix = key_prefix_of(key)
    revoked = anonymous.delete(
        f"/v1/admin/tenants/alpha/keys/{prefix}", headers=auth_headers(stack.admin_api_key)
    )
    assert revoked.status_code == 200, revoked.text
    _refused_everywhere(anonymous, headers, alpha, llm_requests)
    # The task it made stays the tenant's, reachable with its other keys.
    assert alpha.view(mine.json()["id"])["id"] == mine.json()["id"]


def _admin(stack: Stack) -> dict[str, str]:
    return auth_headers(stack.admin_api_key)


def test_a_disabled_tenants_key_is_403_naming_why_and_nothing_runs(
    anonymous: httpx.Client,
    new_tenant: Callable[..., Tenant],
    stack: Stack,
    llm_requests: Callable[[str], int],
) -> None:
    tenant = new_tenant()
    url = f"/v1/admin/tenants/{tenant.name}"
    disabled = anonymous.post(
        f"{url}/disable", json={"reason": "security review"}, headers=_admin(stack)
    )
    assert disabled.status_code == 200, disabled.text
    text = f"made by a disabled tenant {new_id()}"
    for method, path, body in [
        ("POST", "/v1/tasks", {"task": text}),
        ("GET", "/v1/tasks", None),
        ("POST", "/v1/keys", {"name": "a way back in"}),
        ("GET", "/v1/quotas", None),
    ]:
        answer = tenant.http.request(method, path, json=body)
        assert answer.status_code == 403, (method, path, answer.text)
        assert f"tenant {tenant.name!r} is disabled" in answer.json()["detail"]
        assert "security review" in answer.json()["detail"]
    assert llm_requests(text) == 0
    keys = anonymous.get(f"{url}/keys", headers=_admin(stack)).json()["keys"]
    assert len(keys) == 1  # no key was made
    assert anonymous.post(f"{url}/enable", headers=_admin(stack)).status_code == 200
    assert tenant.http.get("/v1/tasks").status_code == 200


def test_a_deleted_tenants_key_is_401_and_its_id_cannot_be_taken_over(
    anonymous: httpx.Client, new_tenant: Callable[..., Tenant], stack: Stack
) -> None:
    tenant = new_tenant()
    task_id = tenant.create(task=f"before deletion {new_id()}")
    tenant.wait(task_id, "FINISHED")
    url = f"/v1/admin/tenants/{tenant.name}"
    deleted = anonymous.delete(url, headers=_admin(stack))
    assert deleted.status_code == 200, deleted.text
    assert tenant.http.get(f"/v1/tasks/{task_id}").status_code == 401
    # Whoever makes a tenant of the same id would inherit its tasks: refused.
    again = anonymous.post("/v1/admin/tenants", json={"id": tenant.name}, headers=_admin(stack))
    assert again.status_code == 409 and "was deleted" in again.json()["detail"]
    assert anonymous.post(f"{url}/keys", json={}, headers=_admin(stack)).status_code == 404


def test_a_tenants_key_cannot_list_or_revoke_another_tenants_keys(
    alpha: Tenant, beta: Tenant, stack: Stack
) -> None:
    theirs = beta.http.post("/v1/keys", json={"name": "beta's"})
    assert theirs.status_code == 201, theirs.text
    prefix = theirs.json()["prefix"]
    assert prefix not in alpha.http.get("/v1/keys").text
    answer = alpha.http.delete(f"/v1/keys/{prefix}", params={"force": "true"})
    assert answer.status_code == 404, answer.text
    assert beta.http.get("/v1/keys").json()["keys"][-1]["revoked_at"] is None
    made = beta.http.post("/v1/keys", json={})  # the key it made works, and is beta's
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=auth_headers(made.json()["key"]), timeout=30
    ) as other:
        assert other.get("/v1/quotas").json()["tenant_id"] == "beta"
        assert other.delete(f"/v1/keys/{made.json()['prefix']}").status_code == 200
        assert other.get("/v1/quotas").status_code == 401


def test_a_tenant_cannot_make_keys_without_bound(new_tenant: Callable[..., Tenant]) -> None:
    """Issue 24, finding 6: a tenant could make any number of keys with one of its own (each
    a record in the key store and a credential to track). It may hold 20 working ones (the
    default of DECKHANDS_MAX_API_KEYS_PER_TENANT); past that, a 409 naming the limit, until
    one is revoked."""
    tenant = new_tenant()
    made: list[str] = []
    while True:
        answer = tenant.http.post("/v1/keys", json={"name": f"k{len(made)}"})
        if answer.status_code != 201:
            break
        made.append(answer.json()["prefix"])
        assert len(made) < 20, "no bound on a tenant's keys"
    assert answer.status_code == 409, answer.text
    assert "DECKHANDS_MAX_API_KEYS_PER_TENANT=20" in answer.json()["detail"], answer.text
    assert len(made) == 19  # and the key the tenant was made with
    revoked = tenant.http.delete(f"/v1/keys/{made[0]}")
    assert revoked.status_code == 200, revoked.text
    again = tenant.http.post("/v1/keys", json={"name": "after a revocation"})
    assert again.status_code == 201, again.text
