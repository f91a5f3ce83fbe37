"""Creating and steering tasks through the real gateway process: what lands in Redis, what is
queued for the controller, and what the client is told."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import httpx
from gateway_doubles import EGRESS_ALLOW, controller_inbox, make_as_controller
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from services.gateway.tasks.creations import TaskCreations
from services.gateway.tasks.idempotency import IdempotencyKeys, request_fingerprint
from services.gateway.tasks.records import TaskRecord, TaskRecords
from services.gateway.tasks.values import NewTask
from shared.events import AgentState, CmdRunAction, EventSource, new_id
from shared.state import Awaiting, TaskResult, TaskState
from shared.state_store import TaskStateStore
from shared.task_creation import creation_request

SEED = "Write a Python script that prints the squares of 1 to 10 and run it"
TENANT = "tests"  # the tenant of the `http` client's key (conftest)


async def claim_key_as_a_dead_request_would(redis: Redis, key: str, task_id: str) -> None:
    """What a creation with this key and the body {"task": SEED} does first."""
    fingerprint = request_fingerprint("POST /v1/tasks", dataclasses.asdict(NewTask(SEED)))
    bound = await IdempotencyKeys(redis, 60).claim(TENANT, key, fingerprint, task_id)
    assert bound == task_id


async def test_create_asks_the_controller_to_make_the_task(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    resp = await http.post("/v1/tasks", json={"task": SEED, "max_iterations": 7})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["state"] == "LOADING"
    assert resp.headers["location"] == f"/v1/tasks/{body['id']}"

    # Only the controller writes a task's State: the gateway asks it to make the task.
    assert await TaskStateStore(redis).load(body["id"]) is None
    [queued] = await controller_inbox(nc, body["id"], expect=1)
    assert queued["kind"] == "task_created" and queued["source"] == "SYSTEM"
    assert queued["task"] == SEED and queued["task_id"] == body["id"]
    assert queued["max_iterations"] == 7 and queued["tenant_id"] == TENANT
    assert queued["seq"] is None  # the controller assigns seq when it logs the event
    assert queued["_headers"]["Nats-Msg-Id"] == queued["id"] == f"created-{body['id']}"

    task = (await http.get(f"/v1/tasks/{body['id']}")).json()
    assert task["id"] == body["id"] and task["state"] == "LOADING"
    assert task["iterations"] == 0 and task["max_iterations"] == 7
    assert task["result"] is None and task["finished_at"] is None
    assert task["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "cost_usd": 0.0,
        "llm_calls": 0,
    }


async def test_max_iterations_defaults_from_settings(http: httpx.AsyncClient) -> None:
    created = (await http.post("/v1/tasks", json={"task": "x"})).json()
    assert (await http.get(f"/v1/tasks/{created['id']}")).json()["max_iterations"] == 30


async def test_finished_task_shows_result_and_usage(http: httpx.AsyncClient, redis: Redis) -> None:
    created = (await http.post("/v1/tasks", json={"task": "x"})).json()
    store = TaskStateStore(redis)
    state = await make_as_controller(redis, created["id"])
    finished = state.model_copy(
        update={
            "agent_state": AgentState.FINISHED,
            "reason": "agent finished",
            "iteration": 3,
            "finished_at": state.updated_at,
            "result": {"final_message": "10 squared is 100", "outputs": {"file": "sq.py"}},
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "cost_usd": 0.25,
                "llm_calls": 2,
            },
        }
    )
    await store.save(TaskState.model_validate(finished.model_dump(warnings=False)))
    task = (await http.get(f"/v1/tasks/{created['id']}")).json()
    assert task["state"] == "FINISHED" and task["reason"] == "agent finished"
    assert task["iterations"] == 3 and task["finished_at"] is not None
    assert task["result"] == {"final_message": "10 squared is 100", "outputs": {"file": "sq.py"}}
    assert task["usage"]["total_tokens"] == 15 and task["usage"]["cost_usd"] == 0.25


async def test_limits_and_confirmation_mode_are_set_per_task(
    http: httpx.AsyncClient, redis: Redis
) -> None:
    body = {
        "task": "x",
        "max_iterations": 5,
        "max_budget_usd": 0.5,
        "confirmation_mode": True,
        "confirmation_threshold": "MEDIUM",
    }
    created = (await http.post("/v1/tasks", json=body)).json()
    state = await make_as_controller(redis, created["id"])
    # The initial limits are what a resuming user message adds again.
    assert (state.max_iterations, state.initial_max_iterations) == (5, 5)
    assert (state.max_budget_usd, state.initial_budget_usd) == (0.5, 0.5)
    assert state.confirmation_mode and state.confirmation_threshold == "MEDIUM"
    task = (await http.get(f"/v1/tasks/{created['id']}")).json()
    assert task["max_budget_usd"] == 0.5
    assert (task["confirmation_mode"], task["confirmation_threshold"]) == (True, "MEDIUM")

    # Server defaults (a budget of $10, confirmation off) when the body names none.
    created = (await http.post("/v1/tasks", json={"task": "x"})).json()
    task = (await http.get(f"/v1/tasks/{created['id']}")).json()
    assert task["max_budget_usd"] == 10.0
    assert (task["confirmation_mode"], task["confirmation_threshold"]) == (False, "HIGH")
    assert (task["awaiting"], task["pending_action"], task["sub_tasks"]) == ("nothing", None, [])
    assert task["network_egress"] is False and task["network"] is None


async def test_network_egress_is_opt_in_per_task(http: httpx.AsyncClient, redis: Redis) -> None:
    # With an egress bound (DECKHANDS_EGRESS_ALLOW), it asks for the whole bound as the task's
    # policy, through the egress proxy; the plain network is for a server without one.
    created = (await http.post("/v1/tasks", json={"task": "x", "network_egress": True})).json()
    state = await make_as_controller(redis, created["id"])
    assert not state.network_egress
    assert state.network is not None and list(state.network.allow) == EGRESS_ALLOW
    task = (await http.get(f"/v1/tasks/{created['id']}")).json()
    assert task["network_egress"] is False and task["network"] == {
        "allow": EGRESS_ALLOW,
        "between_actions": [],
    }
    resp = await http.post("/v1/tasks", json={"task": "x", "network_egress": "sometimes"})
    assert resp.status_code == 422 and "network_egress" in resp.json()["message"]


async def test_a_task_chooses_its_workspace_quota_within_the_operators_maximum(
    http: httpx.AsyncClient, redis: Redis
) -> None:
    created = (await http.post("/v1/tasks", json={"task": "x", "workspace_mib": 512})).json()
    state = await make_as_controller(redis, created["id"])
    assert state.workspace_mib == 512
    assert (await http.get(f"/v1/tasks/{created['id']}")).json()["workspace_mib"] == 512
    # Above DECKHANDS_MAX_WORKSPACE_MIB (8192 by default): refused, naming the limit.
    resp = await http.post("/v1/tasks", json={"task": "x", "workspace_mib": 8193})
    assert resp.status_code == 422, resp.text
    assert "8192 MiB (DECKHANDS_MAX_WORKSPACE_MIB)" in resp.json()["detail"]
    resp = await http.post("/v1/tasks", json={"task": "x", "workspace_mib": 0})
    assert resp.status_code == 422 and "workspace_mib" in resp.json()["message"]


async def test_task_shows_its_pending_action_and_sub_tasks(
    http: httpx.AsyncClient, redis: Redis
) -> None:
    store = TaskStateStore(redis)
    parent_id = (await http.post("/v1/tasks", json={"task": "parent"})).json()["id"]
    child = TaskState(
        task_id=new_id(),
        task="child",
        max_iterations=3,
        parent_task_id=parent_id,
        agent_state=AgentState.FINISHED,
        iteration=2,
        result=TaskResult(final_message="child done", outputs={"n": 1}),
    )
    assert await store.create(child)
    parent = await make_as_controller(redis, parent_id)
    action = CmdRunAction(task_id=parent_id, source=EventSource.AGENT, command="rm -rf build")
    await store.save(
        parent.model_copy(
            update={
                "agent_state": AgentState.AWAITING_USER_CONFIRMATION,
                "awaiting": Awaiting.CONFIRMATION,
                "awaiting_id": action.id,
                "pending_action": action,
                "sub_tasks": [child.task_id, new_id()],  # the second one's State is gone
            }
        )
    )
    task = (await http.get(f"/v1/tasks/{parent_id}")).json()
    assert task["state"] == "AWAITING_USER_CONFIRMATION" and task["awaiting"] == "confirmation"
    assert task["pending_action"]["id"] == action.id
    assert task["pending_action"]["command"] == "rm -rf build"
    [sub] = task["sub_tasks"]
    assert (sub["id"], sub["task"], sub["state"], sub["iterations"]) == (
        child.task_id,
        "child",
        "FINISHED",
        2,
    )
    assert sub["result"] == {"final_message": "child done", "outputs": {"n": 1}}
    assert (await http.get(f"/v1/tasks/{child.task_id}")).json()["parent_task_id"] == parent_id


async def test_same_idempotency_key_gives_the_same_task_and_one_message(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    key = {"Idempotency-Key": new_id()}
    first = await http.post("/v1/tasks", json={"task": SEED}, headers=key)
    again = await http.post("/v1/tasks", json={"task": SEED}, headers=key)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    queued = await controller_inbox(nc, first.json()["id"], expect=1, settle_s=1.0)
    assert [q["task"] for q in queued] == [SEED]


async def test_concurrent_retries_with_one_key_make_one_task(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    key = {"Idempotency-Key": new_id()}
    answers = await asyncio.gather(
        *(http.post("/v1/tasks", json={"task": SEED}, headers=key) for _ in range(5))
    )
    assert {a.status_code for a in answers} == {202}
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1
    assert len(await controller_inbox(nc, ids.pop(), expect=1, settle_s=1.0)) == 1


async def test_reusing_a_key_for_another_request_is_refused(http: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": new_id()}
    first = await http.post("/v1/tasks", json={"task": "a"}, headers=key)
    assert first.status_code == 202
    task_id = first.json()["id"]
    # The whole request counts, not only the task's text; and a key is one request, whatever
    # the route.
    for path, body in [
        ("/v1/tasks", {"task": "b"}),
        ("/v1/tasks", {"task": "a", "max_iterations": 3}),
        ("/v1/tasks", {"task": "a", "network_egress": True}),
        (f"/v1/tasks/{task_id}/messages", {"content": "a"}),
        (f"/v1/tasks/{task_id}/stop", None),
    ]:
        resp = await http.post(path, json=body, headers=key)
        assert resp.status_code == 422, (path, body, resp.text)
        assert "Idempotency-Key" in resp.json()["detail"]
    again = await http.post("/v1/tasks", json={"task": "a"}, headers=key)
    assert again.status_code == 202 and again.json()["id"] == task_id


async def test_a_message_key_reused_with_other_content_is_refused(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
    key = {"Idempotency-Key": new_id()}
    path = f"/v1/tasks/{task_id}/messages"
    assert (await http.post(path, json={"content": "hi"}, headers=key)).status_code == 202
    resp = await http.post(path, json={"content": "bye"}, headers=key)
    assert resp.status_code == 422, resp.text
    queued = await controller_inbox(nc, task_id, expect=2, settle_s=1.0)
    assert [q.get("task") or q.get("content") for q in queued] == ["x", "hi"]


async def test_retry_completes_a_creation_that_died_before_saving_the_state(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    # A first attempt claimed the key, then its process died: no state, nothing queued.
    key = new_id()
    orphan_id = new_id()
    store = TaskStateStore(redis)
    await store.mark_intact()  # as the controller does: Redis has lost nothing since
    await claim_key_as_a_dead_request_would(redis, key, orphan_id)

    resp = await http.post("/v1/tasks", json={"task": SEED}, headers={"Idempotency-Key": key})
    assert resp.status_code == 202 and resp.json()["id"] == orphan_id
    shown = (await http.get(f"/v1/tasks/{orphan_id}")).json()
    assert (shown["task"], shown["state"]) == (SEED, "LOADING")
    [queued] = await controller_inbox(nc, orphan_id, expect=1)
    assert queued["task"] == SEED


async def test_retry_completes_a_creation_that_died_before_publishing(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    # A first attempt claimed the key and saved the record and the creation request, then
    # died before publishing.
    key = new_id()
    task_id = new_id()
    await claim_key_as_a_dead_request_would(redis, key, task_id)
    await TaskRecords(redis).put(task_id, TaskRecord(tenant_id=TENANT, idempotency_key=key))
    state = TaskState(task_id=task_id, task=SEED, max_iterations=5, tenant_id=TENANT)
    await TaskCreations(redis).put(creation_request(state))

    resp = await http.post("/v1/tasks", json={"task": SEED}, headers={"Idempotency-Key": key})
    assert resp.status_code == 202 and resp.json()["id"] == task_id
    [queued] = await controller_inbox(nc, task_id, expect=1)
    assert (queued["kind"], queued["task"], queued["max_iterations"]) == ("task_created", SEED, 5)


async def test_a_retry_after_the_controller_took_the_task_queues_nothing(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    key = {"Idempotency-Key": new_id()}
    task_id = (await http.post("/v1/tasks", json={"task": SEED}, headers=key)).json()["id"]
    assert len(await controller_inbox(nc, task_id, expect=1)) == 1
    store = TaskStateStore(redis)
    state = await make_as_controller(redis, task_id)
    await store.save(state.model_copy(update={"agent_state": AgentState.RUNNING}))

    again = await http.post("/v1/tasks", json={"task": SEED}, headers=key)
    assert again.json() == {"id": task_id, "state": "RUNNING"}
    assert await controller_inbox(nc, task_id, expect=0, settle_s=1.0) == []


async def test_user_input_is_queued_for_the_controller_in_order(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
    calls = [
        ("messages", {"content": "also print cubes"}),
        ("pause", None),
        ("resume", None),
        ("confirmation", {"action_id": "a1", "approve": True}),
        ("confirmation", {"action_id": "a2", "approve": False}),
        ("stop", None),
    ]
    accepted = []
    for path, body in calls:
        resp = await http.post(f"/v1/tasks/{task_id}/{path}", json=body)
        assert resp.status_code == 202, resp.text
        assert resp.json()["task_id"] == task_id
        accepted.append(resp.json()["event_id"])

    queued = await controller_inbox(nc, task_id, expect=7)
    assert [q["id"] for q in queued[1:]] == accepted
    assert all(q["source"] == "USER" and q["task_id"] == task_id for q in queued[1:])
    _first, message, pause, resume, confirm, reject, stop = queued
    assert message["kind"] == "message" and message["content"] == "also print cubes"
    assert (pause["kind"], pause["agent_state"]) == ("change_agent_state", "PAUSED")
    assert (resume["agent_state"], resume["reason"]) == ("RUNNING", "resumed by user")
    assert (confirm["agent_state"], confirm["cause"]) == ("USER_CONFIRMED", "a1")
    assert (reject["agent_state"], reject["cause"]) == ("USER_REJECTED", "a2")
    assert (stop["agent_state"], stop["reason"]) == ("STOPPED", "stopped by user")
    assert _first["kind"] == "task_created" and _first["source"] == "SYSTEM"


async def test_a_retried_message_with_a_key_is_queued_once(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
    key = {"Idempotency-Key": new_id()}
    ids = [
        (
            await http.post(f"/v1/tasks/{task_id}/messages", json={"content": "hi"}, headers=key)
        ).json()["event_id"]
        for _ in range(2)
    ]
    assert ids[0] == ids[1]
    queued = await controller_inbox(nc, task_id, expect=2, settle_s=1.0)
    assert [q["kind"] for q in queued] == ["task_created", "message"]
    assert queued[1]["content"] == "hi"


async def test_published_messages_continue_the_http_requests_trace(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    trace_id = new_id()
    traceparent = f"00-{trace_id}-{new_id()[:16]}-01"
    resp = await http.post("/v1/tasks", json={"task": "x"}, headers={"traceparent": traceparent})
    [queued] = await controller_inbox(nc, resp.json()["id"], expect=1)
    assert queued["_headers"]["traceparent"].split("-")[1] == trace_id

    # Without one, the HTTP request is the root: a fresh trace, still propagated.
    resp = await http.post("/v1/tasks", json={"task": "y"})
    [queued] = await controller_inbox(nc, resp.json()["id"], expect=1)
    fresh = queued["_headers"]["traceparent"]
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", fresh)
    assert fresh.split("-")[1] not in (trace_id, "0" * 32)


async def test_unknown_tasks_are_404_with_a_clear_body(http: httpx.AsyncClient) -> None:
    missing = new_id()
    for method, path, body in [
        ("GET", f"/v1/tasks/{missing}", None),
        ("GET", f"/v1/tasks/{missing}/events", None),
        ("GET", f"/v1/tasks/{missing}/events/stream", None),
        ("GET", f"/v1/tasks/{missing}/trajectory", None),
        ("POST", f"/v1/tasks/{missing}/messages", {"content": "hi"}),
        ("POST", f"/v1/tasks/{missing}/stop", None),
        ("POST", f"/v1/tasks/{missing}/pause", None),
        ("POST", f"/v1/tasks/{missing}/resume", None),
        ("POST", f"/v1/tasks/{missing}/confirmation", {"action_id": "a", "approve": True}),
        ("GET", "/v1/tasks/not.a*valid>id", None),
    ]:
        resp = await http.request(method, path, json=body)
        assert resp.status_code == 404, (method, path, resp.text)
        assert resp.headers["content-type"] == "application/json"
        assert "not found" in resp.json()["detail"], resp.text


async def test_bad_bodies_are_422_naming_the_field(http: httpx.AsyncClient) -> None:
    task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
    cases = [
        ("/v1/tasks", {}, "task"),
        ("/v1/tasks", {"task": ""}, "task"),
        ("/v1/tasks", {"task": "   "}, "task"),
        ("/v1/tasks", {"task": 5}, "task"),
        ("/v1/tasks", {"task": "x", "max_iterations": 0}, "max_iterations"),
        ("/v1/tasks", {"task": "x", "max_iterations": 1001}, "max_iterations"),
        ("/v1/tasks", {"task": "x", "max_iteration": 3}, "max_iteration"),
        ("/v1/tasks", {"task": "x", "max_budget_usd": 0}, "max_budget_usd"),
        ("/v1/tasks", {"task": "x", "confirmation_threshold": "EXTREME"}, "confirmation_threshold"),
        (f"/v1/tasks/{task_id}/messages", {}, "content"),
        (f"/v1/tasks/{task_id}/confirmation", {"action_id": "a"}, "approve"),
    ]
    for path, body, field in cases:
        resp = await http.post(path, json=body)
        assert resp.status_code == 422, (body, resp.text)
        detail = resp.json()
        assert field in [e["field"] for e in detail["detail"]], (body, detail)
        assert field in detail["message"]

    resp = await http.post(
        "/v1/tasks", content=b'{"task": "x",', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["field"] == "body"
    assert "not valid JSON" in resp.json()["message"]

    resp = await http.get(f"/v1/tasks/{task_id}/events", params={"after": -1})
    assert resp.status_code == 422 and resp.json()["detail"][0]["field"] == "after"


async def test_a_task_text_too_large_to_carry_is_413_and_the_gateway_stays_connected(
    http: httpx.AsyncClient, nc: NatsClient, redis: Redis
) -> None:
    # Within the API's own limit in characters, but control characters JSON-escape to six
    # bytes each: about 1.2 MB encoded, past NATS' max_payload.
    text = "\x01" * 200_000
    resp = await http.post("/v1/tasks", json={"task": text})
    assert resp.status_code == 413, resp.text
    assert "bytes encoded" in resp.json()["detail"]
    assert await TaskStateStore(redis).load("0" * 32) is None  # nothing stored
    # The gateway kept its broker: the next task is queued.
    resp = await http.post("/v1/tasks", json={"task": "small"})
    assert resp.status_code == 202, resp.text
    [queued] = await controller_inbox(nc, resp.json()["id"], expect=1)
    assert queued["task"] == "small"
    ready = await http.get("/readyz")
    assert ready.status_code == 200
