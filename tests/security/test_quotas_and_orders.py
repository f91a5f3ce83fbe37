"""Attacks on quotas, delegation and the runtime, on the whole running system (issue 9, parts 3,
4 and 6): a tenant past its quotas (429 with Retry-After, nothing stored, no agent step); an
agent delegating past its parent's budget (refused, no sub-task); ExecuteActions published
straight to the runtime's subject by an intruder on the broker: for an action no verdict
allowed, after the task stopped, a replay of one that ran, an altered command (none runs: no
ledger entry, no file, no container, no event); a 50 MB body; network egress and trajectories
without the operator's leave; a foreign Host header."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import docker
import httpx
import nats
import pytest
import redis
from conftest import Tenant

from services.runtime.containers import task_container_name
from shared.commands import ExecuteAction
from shared.events import EventAdapter, RunnableAction, new_id
from shared.subjects import WORK_STREAM, Service, work_subject
from tools.api_access import auth_headers
from tools.stack import Stack

pytestmark = pytest.mark.docker

SETTLE_S = 3.0  # long enough for the runtime and the controller to act on what got through


# --- helpers ------------------------------------------------------------------------------


def _broker_login(stack: Stack) -> dict[str, Any]:
    """With the broker locked (issue 9, part 5) only the controller may order the runtime, so
    the intruder holds the controller's credentials (a compromised pod); before, anyone could."""
    login = getattr(stack, "nats_login", None)
    if login is not None:
        return dict(login("controller"))
    return {"servers": [f"nats://127.0.0.1:{stack.config.nats_port}"]}


def _redis(stack: Stack) -> redis.Redis:
    login = getattr(stack, "redis_login", None)
    return (
        redis.Redis(**login()) if login is not None else redis.Redis(port=stack.config.redis_port)
    )


def _publish_order(stack: Stack, order: ExecuteAction) -> None:
    """What an intruder on the broker does: an ExecuteAction straight to the runtime."""

    async def publish() -> None:
        nc = await nats.connect(**_broker_login(stack))
        try:
            await nc.jetstream().publish(
                work_subject(Service.RUNTIME, order.task_id),
                order.model_dump_json().encode(),
                stream=WORK_STREAM,
                headers={"Nats-Msg-Id": order.id},
            )
        finally:
            await nc.close()

    asyncio.run(publish())


def _pending(view: dict[str, Any]) -> RunnableAction:
    action = EventAdapter.validate_python(view["pending_action"])
    return action  # type: ignore[return-value]


def _ledger(stack: Stack, action_id: str) -> list[str]:
    """The runtime's record of an action it started or ran (empty: never reached a sandbox)."""
    client = _redis(stack)
    try:
        keys = [
            f"deckhands:runtime:observation:{action_id}",
            f"deckhands:runtime:running:{action_id}",
        ]
        return [key for key in keys if client.exists(key)]
    finally:
        client.close()


def _containers(task_id: str) -> list[Any]:
    client = docker.from_env()
    try:
        return list(
            client.containers.list(all=True, filters={"name": task_container_name(task_id)})
        )
    finally:
        client.close()


def _file_in_sandbox(task_id: str, path: str) -> bool:
    """Whether the task's sandbox holds `path` (no sandbox: nothing ran in one)."""
    return any(
        c.status == "running" and c.exec_run(["test", "-e", path]).exit_code == 0
        for c in _containers(task_id)
    )


def _refusals_logged(stack: Stack, order: ExecuteAction, timeout_s: float = 10) -> str:
    """The runtime's security log line about the order."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [
            line
            for line in (stack.logs / "runtime.log").read_text().splitlines()
            if f"runtime refused order {order.id}" in line
        ]
        if lines or time.monotonic() > deadline:
            assert lines, f"no security log line for order {order.id}"
            return lines[0]
        time.sleep(0.2)


def _awaiting_confirmation(tenant: Tenant) -> tuple[str, RunnableAction]:
    task_id = tenant.create(
        task=f"confirm: {new_id()}", confirmation_mode=True, confirmation_threshold="LOW"
    )
    return task_id, _pending(tenant.wait(task_id, "AWAITING_USER_CONFIRMATION"))


# --- quotas (part 3) ----------------------------------------------------------------------


def test_past_the_running_tasks_quota_a_task_is_429_and_nothing_runs(
    new_tenant: Callable[..., Tenant], llm_requests: Callable[[str], int]
) -> None:
    tenant = new_tenant(max_running_tasks=1)
    held = tenant.create(task=f"ask: {new_id()}")  # waits for a person: still running
    tenant.wait(held, "AWAITING_USER_INPUT")
    text = f"finish over quota {new_id()}"
    for _ in range(3):  # again and again: always refused, never queued
        answer = tenant.http.post("/v1/tasks", json={"task": text})
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "30"
        body = answer.json()
        assert (body["limit"], body["limit_value"], body["current"]) == ("max_running_tasks", 1, 1)
    time.sleep(SETTLE_S)
    assert llm_requests(text) == 0  # no agent ever stepped on it
    assert [t["id"] for t in tenant.http.get("/v1/tasks").json()["tasks"]] == [held]
    # Its place frees when the task ends: then a task goes through.
    assert tenant.http.post(f"/v1/tasks/{held}/stop").status_code == 202
    tenant.wait(held, "STOPPED")
    tenant.wait(tenant.create(task=text), "FINISHED")


def test_past_the_daily_spend_a_task_is_429_until_midnight(
    new_tenant: Callable[..., Tenant], llm_requests: Callable[[str], int]
) -> None:
    tenant = new_tenant(max_spend_usd_per_day=0.01)
    text = f"finish expensive {new_id()}"
    answer = tenant.http.post("/v1/tasks", json={"task": text, "max_budget_usd": 1.0})
    assert answer.status_code == 429
    assert answer.json()["limit"] == "max_spend_usd_per_day"
    assert 0 < int(answer.headers["retry-after"]) <= 86_400
    time.sleep(SETTLE_S)
    assert llm_requests(text) == 0
    assert tenant.http.get("/v1/tasks").json()["tasks"] == []
    # No budget asked: the task gets what is left of the day's, and runs.
    task_id = tenant.create(task=f"finish cheap {new_id()}")
    assert tenant.view(task_id)["max_budget_usd"] == pytest.approx(0.01)
    tenant.wait(task_id, "FINISHED")


def test_event_streams_past_the_tenants_quota_are_429(new_tenant: Callable[..., Tenant]) -> None:
    tenant = new_tenant(max_event_streams=1)
    task_id = tenant.create(task=f"ask: {new_id()}")
    with tenant.http.stream("GET", f"/v1/tasks/{task_id}/events/stream") as first:
        assert first.status_code == 200
        second = tenant.http.get(f"/v1/tasks/{task_id}/events/stream")
        assert second.status_code == 429 and second.headers["retry-after"] == "5"
        assert second.json()["limit"] == "max_event_streams"


def _usage(tenant: Tenant) -> dict[str, Any]:
    answer = tenant.http.get("/v1/quotas")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["usage"])


def test_past_the_sandboxes_quota_a_task_is_429_while_an_ended_task_keeps_its_sandbox(
    new_tenant: Callable[..., Tenant], llm_requests: Callable[[str], int]
) -> None:
    """A task that ended in ERROR no longer runs but keeps its sandbox (a user message may
    resume it): it still counts against the tenant's sandboxes until it is stopped."""
    tenant = new_tenant(max_sandboxes=1)
    held = tenant.create(task=f"count: {new_id()}", max_iterations=1)
    assert "iteration" in tenant.wait(held, "ERROR")["reason"]
    deadline = time.monotonic() + 10
    while (usage := _usage(tenant))["running_tasks"] != 0:
        assert time.monotonic() < deadline, usage
        time.sleep(0.2)
    assert usage["sandboxes"] == 1
    text = f"finish past the sandboxes {new_id()}"
    answer = tenant.http.post("/v1/tasks", json={"task": text})
    assert answer.status_code == 429, answer.text
    assert answer.headers["retry-after"] == "30"
    body = answer.json()
    assert (body["limit"], body["limit_value"], body["current"]) == ("max_sandboxes", 1, 1)
    time.sleep(SETTLE_S)
    assert llm_requests(text) == 0
    assert [t["id"] for t in tenant.http.get("/v1/tasks").json()["tasks"]] == [held]
    # Stopped, its sandbox is released: the seat is free and a task goes through.
    assert tenant.http.post(f"/v1/tasks/{held}/stop").status_code == 202
    tenant.wait(held, "STOPPED")
    deadline = time.monotonic() + 30
    while _usage(tenant)["sandboxes"] != 0:
        assert time.monotonic() < deadline, "the stopped task's seat was never freed"
        time.sleep(0.2)
    tenant.wait(tenant.create(task=text), "FINISHED")


# --- delegation (part 3) ------------------------------------------------------------------


def _refused_delegation(tenant: Tenant, task_id: str, view: dict[str, Any]) -> str:
    assert view["sub_tasks"] == []
    log = tenant.log(task_id)
    assert not [e for e in log if e["kind"] == "delegate_output"]
    [refusal] = [e for e in log if e.get("error_code") == "delegation_refused"]
    return str(refusal["content"])


def test_delegating_more_iterations_than_the_parent_has_left_is_refused(
    alpha: Tenant, llm_requests: Callable[[str], int]
) -> None:
    task_id = alpha.create(task=f"delegate-big: {new_id()}", max_iterations=5)
    view = alpha.wait(task_id, "FINISHED")
    content = _refused_delegation(alpha, task_id, view)
    assert "asks for 50 iterations, more than this task has left (4)" in content
    assert llm_requests("sub-task asking for more than is left") == 0  # no sub-agent ran


def test_delegating_with_the_parents_budget_spent_is_refused(
    alpha: Tenant, llm_requests: Callable[[str], int]
) -> None:
    task_id = alpha.create(task=f"delegate-broke: {new_id()}", max_budget_usd=0.000001)
    view = alpha.wait(task_id, "ERROR")
    assert "budget" in _refused_delegation(alpha, task_id, view)
    assert "reached the maximum budget" in view["reason"]
    assert llm_requests("sub-task of a spent budget") == 0


# --- the runtime runs only what was reviewed (part 6) --------------------------------------


def test_an_execute_action_no_verdict_allowed_is_not_run(alpha: Tenant, stack: Stack) -> None:
    """The action waits for the user's confirmation: an order for it straight to the runtime
    is refused. Then the owner's approval runs it, once."""
    task_id, action = _awaiting_confirmation(alpha)
    before = alpha.log(task_id)
    order = ExecuteAction(task_id=task_id, action=action)
    _publish_order(stack, order)
    line = _refusals_logged(stack, order)
    assert "was not run: the task is AWAITING_USER_CONFIRMATION" in line
    time.sleep(SETTLE_S)
    assert _ledger(stack, action.id) == []  # never reached a sandbox
    assert not _file_in_sandbox(task_id, "/workspace/ran.txt")  # the prepared one is untouched
    assert alpha.log(task_id) == before  # no event
    view = alpha.view(task_id)
    assert view["state"] == "AWAITING_USER_CONFIRMATION"
    assert view["pending_action"]["id"] == action.id

    approved = alpha.http.post(
        f"/v1/tasks/{task_id}/confirmation", json={"action_id": action.id, "approve": True}
    )
    assert approved.status_code == 202
    view = alpha.wait(task_id, "FINISHED")
    assert "the-action-ran" in view["result"]["final_message"]
    assert len([e for e in alpha.log(task_id) if e["kind"] == "run_output"]) == 1


def test_an_action_after_stop_is_not_run(alpha: Tenant, stack: Stack) -> None:
    task_id, action = _awaiting_confirmation(alpha)
    assert alpha.http.post(f"/v1/tasks/{task_id}/stop").status_code == 202
    alpha.wait(task_id, "STOPPED")
    deadline = time.monotonic() + 30
    while _containers(task_id):  # its sandbox is released with the stop
        assert time.monotonic() < deadline, "the stopped task's sandbox was never removed"
        time.sleep(0.2)
    before = alpha.log(task_id)
    order = ExecuteAction(task_id=task_id, action=action)
    _publish_order(stack, order)
    assert "the task is STOPPED" in _refusals_logged(stack, order)
    time.sleep(SETTLE_S)
    assert _containers(task_id) == []  # no sandbox was started for it
    assert _ledger(stack, action.id) == []
    assert alpha.log(task_id) == before
    assert alpha.view(task_id)["state"] == "STOPPED"


def test_a_replayed_or_altered_order_is_not_run(alpha: Tenant, stack: Stack) -> None:
    """A command that ran once, ordered again (as a captured order replayed under a new id),
    and the same action with another command: neither runs."""
    text = f"count: {new_id()}"
    task_id = alpha.create(task=text)
    alpha.wait(task_id, "AWAITING_USER_INPUT")
    log = alpha.log(task_id)
    [ran] = [e for e in log if e["kind"] == "run"]
    action: RunnableAction = EventAdapter.validate_python(ran)  # type: ignore[assignment]
    replayed = ExecuteAction(task_id=task_id, action=action)
    altered = ExecuteAction(
        task_id=task_id, action=action.model_copy(update={"command": "touch /workspace/pwned"})
    )
    for order in (replayed, altered):
        _publish_order(stack, order)
        assert "was not run: the task is AWAITING_USER_INPUT" in _refusals_logged(stack, order)
    time.sleep(SETTLE_S)
    assert alpha.log(task_id) == log
    assert not _file_in_sandbox(task_id, "/workspace/pwned")
    # The agent's own next command counts the runs: one.
    assert alpha.http.post(f"/v1/tasks/{task_id}/messages", json={"content": "go"}).is_success
    view = alpha.wait(task_id, "FINISHED")
    final = view["result"]["final_message"]
    assert final.split()[:3] == ["count:", "1", "count.txt"] and "pwned" not in final


# --- safe defaults (part 4) ---------------------------------------------------------------


def test_a_fifty_mb_body_is_413_and_nothing_is_created(
    new_tenant: Callable[..., Tenant], llm_requests: Callable[[str], int]
) -> None:
    tenant = new_tenant()
    text = f"huge {new_id()}"
    body = b'{"task": "' + text.encode() + b'", "pad": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    answer = tenant.http.post(
        "/v1/tasks", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413
    assert "DECKHANDS_MAX_REQUEST_BODY_BYTES" in answer.json()["detail"]
    assert tenant.http.get("/v1/tasks").json()["tasks"] == []
    assert llm_requests(text) == 0


def test_network_egress_is_refused_unless_the_operator_allows_it(
    new_tenant: Callable[..., Tenant],
) -> None:
    # No egress for this tenant (the stack's bound is for test_egress.py's tenants).
    tenant = new_tenant(egress_allow=[])
    answer = tenant.http.post("/v1/tasks", json={"task": "curl out", "network_egress": True})
    assert answer.status_code == 403
    assert "this tenant may use no egress" in answer.json()["detail"]
    assert tenant.http.get("/v1/tasks").json()["tasks"] == []


def test_a_trajectory_needs_the_operators_leave_and_its_actions_are_reviewed(
    alpha: Tenant, new_tenant: Callable[..., Tenant], stack: Stack
) -> None:
    original = alpha.create(
        task=f"confirm: {new_id()}", confirmation_mode=True, confirmation_threshold="LOW"
    )
    action = _pending(alpha.wait(original, "AWAITING_USER_CONFIRMATION"))
    alpha.http.post(
        f"/v1/tasks/{original}/confirmation", json={"action_id": action.id, "approve": True}
    )
    alpha.wait(original, "FINISHED")
    trajectory = alpha.http.get(f"/v1/tasks/{original}/trajectory").json()

    refused = alpha.http.post("/v1/tasks", json={"task": "replay", "trajectory": trajectory})
    assert refused.status_code == 403
    assert "may not create a task from a trajectory" in refused.json()["detail"]

    allowed = new_tenant(allow_trajectory_tasks=True)
    # The replay's recorded command is reviewed and, in confirmation mode, waits for a person.
    replay = allowed.create(
        task="an unscripted task, replayed",
        trajectory=trajectory,
        confirmation_mode=True,
        confirmation_threshold="LOW",
    )
    view = allowed.wait(replay, "AWAITING_USER_CONFIRMATION")
    log = allowed.log(replay)
    [verdict] = [e for e in log if e["kind"] == "security_verdict"]
    assert verdict["cause"] == view["pending_action"]["id"]
    assert view["pending_action"]["command"] == action.command  # type: ignore[attr-defined]
    assert not [e for e in log if e["kind"] == "run_output"]  # nothing ran unreviewed


def test_a_foreign_host_header_is_refused(anonymous: httpx.Client, alpha: Tenant) -> None:
    """DNS rebinding: a page's requests reach the gateway under the attacker's host name."""
    for method, path in (("GET", "/v1/tasks"), ("POST", "/v1/tasks")):
        answer = anonymous.request(
            method,
            path,
            json={"task": "from a web page"},
            headers={**auth_headers(alpha.key), "Host": "attacker.example"},
        )
        assert answer.status_code == 400, (method, path, answer.text)
        assert "DECKHANDS_TRUSTED_HOSTS" in answer.json()["detail"]
    assert anonymous.get("/healthz", headers={"Host": "attacker.example"}).status_code == 200
