"""Attacks on authentication: every request with no key, a wrong key or a revoked key is 401,
and nothing it asked for happens (no task, no LLM call)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from conftest import Tenant

from services.gateway.api_keys import issue_api_key, key_prefix_of
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
