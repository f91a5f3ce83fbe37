"""Issue 24: every route that names a task, swept by another tenant.

The routes are read from the gateway's own OpenAPI document, so a route added later is swept
too. Against a finished, a waiting and a confirming task of `alpha`, each request `beta` makes
(every method, with a body where the route takes one) is answered exactly as the same request
about a task that does not exist: the same status and the same body, the task's id aside.
Afterwards none of alpha's tasks changed: the same log, the same state, its workspace's files
and its webhooks as they were.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import Tenant, tar  # type: ignore[import-not-found]

from shared.events import new_id

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

_PARAMS = {"sha256": "0" * 64, "prefix": "dh_0000000000", "name": "X"}


def _task_routes(tenant: Tenant) -> list[tuple[str, str]]:
    document = tenant.http.get("/openapi.json")
    assert document.status_code == 200, document.text
    routes = []
    for path, methods in document.json()["paths"].items():
        if "{task_id}" not in path:
            continue
        for method in methods:
            if method.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                routes.append((method.upper(), path))
    return routes


def _request(tenant: Tenant, method: str, path: str, task_id: str) -> tuple[int, str]:
    url = re.sub(
        r"\{(\w+)\}", lambda m: task_id if m[1] == "task_id" else _PARAMS.get(m[1], "x"), path
    )
    kwargs: dict[str, Any] = {}
    if method in ("POST", "PATCH"):
        kwargs["json"] = {
            "content": "do evil",
            "action_id": "a",
            "approve": True,
            "url": "https://example.com/hook",
        }
    elif method == "PUT":
        kwargs["content"] = tar({"evil.txt": b"evil\n"})
    if path.endswith("/events/stream"):
        with tenant.http.stream(method, url, **kwargs) as answer:
            answer.read()
            return answer.status_code, answer.text.replace(task_id, "<id>")
    answer = tenant.http.request(method, url, **kwargs)
    return answer.status_code, answer.text.replace(task_id, "<id>")


def _snapshot(alpha: Tenant, task_id: str) -> tuple[Any, ...]:
    view = alpha.view(task_id)
    files = alpha.http.get(f"/v1/tasks/{task_id}/workspace", params={"path": "evil.txt"})
    hooks = alpha.http.get(f"/v1/tasks/{task_id}/webhooks")
    return (
        alpha.log(task_id),
        view["state"],
        files.status_code,
        hooks.status_code,
        hooks.text,
    )


def test_every_task_route_of_another_tenant_answers_as_a_missing_task(
    alpha: Tenant, beta: Tenant
) -> None:
    routes = _task_routes(beta)
    # The ones this issue names, at least: a sweep of nothing would pass.
    names = {path for _, path in routes}
    for expected in (
        "/workspace",
        "/workspace/diff",
        "/blobs/{sha256}",
        "/webhooks",
        "/trajectory",
    ):
        assert any(path.endswith(expected) for path in names), (expected, sorted(names))

    finished = alpha.create(task=f"finish {new_id()}")
    alpha.wait(finished, "FINISHED")
    waiting = alpha.create(task=f"ask: {new_id()}")
    alpha.wait(waiting, "AWAITING_USER_INPUT")
    confirming = alpha.create(
        task=f"confirm: {new_id()}", confirmation_mode=True, confirmation_threshold="LOW"
    )
    alpha.wait(confirming, "AWAITING_USER_CONFIRMATION")
    victims = (finished, waiting, confirming)
    before = {task_id: _snapshot(alpha, task_id) for task_id in victims}

    swept = 0
    for method, path in routes:
        if method == "DELETE" and path == "/v1/tasks/{task_id}":
            continue  # below, last: on a missing task it is a 404 too
        missing = _request(beta, method, path, new_id())
        for task_id in victims:
            got = _request(beta, method, path, task_id)
            assert got == missing, (method, path, task_id, got, missing)
            assert 400 <= got[0] < 500, (method, path, got)
            swept += 1
    for task_id in victims:
        got = _request(beta, "DELETE", "/v1/tasks/{task_id}", task_id)
        assert got == _request(beta, "DELETE", "/v1/tasks/{task_id}", new_id()), got
        assert got[0] == 404, got
    assert swept >= 3 * 10, swept

    for task_id in victims:
        assert _snapshot(alpha, task_id) == before[task_id], task_id
