"""Attacks by one tenant (beta) on another's tasks (alpha's): reading, streaming, messaging,
stopping, pausing, approving, deleting, listing. Each is answered exactly as a task that does
not exist (404), and each asserts that nothing happened to the victim's task: no event in its
log, no state change, no action run, no LLM call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import nats
import pytest
import redis
from conftest import Tenant

from shared.commands import HistoryReply, HistoryRequest
from shared.events import new_id
from shared.subjects import EVENTS_STREAM, HISTORY_SUBJECT, event_subject
from tools.stack import Stack

pytestmark = pytest.mark.docker

SETTLE_S = 2.0  # long enough for the controller to have acted on anything that got through


def _not_found(answer_status: int, detail: str, task_id: str) -> None:
    assert answer_status == 404
    assert detail == f"task {task_id!r} not found"  # word for word a missing task's answer


def _awaiting_confirmation(alpha: Tenant) -> tuple[str, str]:
    task_id = alpha.create(
        task=f"confirm: {new_id()}", confirmation_mode=True, confirmation_threshold="LOW"
    )
    view = alpha.wait(task_id, "AWAITING_USER_CONFIRMATION")
    return task_id, view["pending_action"]["id"]


def _awaiting_input(alpha: Tenant) -> tuple[str, str]:
    text = f"ask: {new_id()}"
    task_id = alpha.create(task=text)
    alpha.wait(task_id, "AWAITING_USER_INPUT")
    return task_id, text


def test_reading_another_tenants_task_is_404(alpha: Tenant, beta: Tenant) -> None:
    task_id = alpha.create(task=f"finish {new_id()}")
    alpha.wait(task_id, "FINISHED")
    events = alpha.log(task_id)
    text = next(e["content"] for e in events if e["kind"] == "message")  # the task's own words
    for path in (
        f"/v1/tasks/{task_id}",
        f"/v1/tasks/{task_id}/events",
        f"/v1/tasks/{task_id}/events?after=0&limit=10",
        f"/v1/tasks/{task_id}/trajectory",
        f"/v1/tasks/{task_id}/blobs/{'0' * 64}",
    ):
        answer = beta.http.get(path)
        _not_found(answer.status_code, answer.json()["detail"], task_id)
        assert text not in answer.text  # not a word of the task leaks
    missing = new_id()
    assert beta.http.get(f"/v1/tasks/{missing}").json()["detail"] == f"task {missing!r} not found"


def test_streaming_another_tenants_events_is_404(alpha: Tenant, beta: Tenant) -> None:
    task_id, _ = _awaiting_input(alpha)
    with beta.http.stream("GET", f"/v1/tasks/{task_id}/events/stream") as answer:
        answer.read()
        _not_found(answer.status_code, answer.json()["detail"], task_id)
        assert "text/event-stream" not in answer.headers["content-type"]


def test_messaging_another_tenants_task_is_404(
    alpha: Tenant, beta: Tenant, llm_requests: Callable[[str], int]
) -> None:
    task_id, text = _awaiting_input(alpha)
    before, calls = alpha.log(task_id), llm_requests(text)
    answer = beta.http.post(f"/v1/tasks/{task_id}/messages", json={"content": "do evil"})
    _not_found(answer.status_code, answer.json()["detail"], task_id)
    time.sleep(SETTLE_S)
    assert alpha.log(task_id) == before  # no message reached the log
    assert "do evil" not in str(alpha.log(task_id))
    assert llm_requests(text) == calls  # the agent did not step
    assert alpha.view(task_id)["state"] == "AWAITING_USER_INPUT"
    # The owner's own message goes through.
    assert alpha.http.post(f"/v1/tasks/{task_id}/messages", json={"content": "a.txt"}).is_success
    alpha.wait(task_id, "FINISHED")


def test_stopping_another_tenants_task_is_404(alpha: Tenant, beta: Tenant) -> None:
    task_id, _ = _awaiting_input(alpha)
    before = alpha.log(task_id)
    for verb in ("stop", "pause", "resume"):
        answer = beta.http.post(f"/v1/tasks/{task_id}/{verb}")
        _not_found(answer.status_code, answer.json()["detail"], task_id)
    time.sleep(SETTLE_S)
    assert alpha.log(task_id) == before
    assert alpha.view(task_id)["state"] == "AWAITING_USER_INPUT"
    assert alpha.http.post(f"/v1/tasks/{task_id}/stop").status_code == 202
    alpha.wait(task_id, "STOPPED")


def test_approving_another_tenants_action_is_404_and_it_does_not_run(
    alpha: Tenant, beta: Tenant
) -> None:
    task_id, action_id = _awaiting_confirmation(alpha)
    before = alpha.log(task_id)
    answer = beta.http.post(
        f"/v1/tasks/{task_id}/confirmation", json={"action_id": action_id, "approve": True}
    )
    _not_found(answer.status_code, answer.json()["detail"], task_id)
    time.sleep(SETTLE_S)
    after = alpha.log(task_id)
    assert after == before
    assert not [e for e in after if e["kind"] in ("run_output", "user_confirmed")]
    view = alpha.view(task_id)
    assert view["state"] == "AWAITING_USER_CONFIRMATION"
    assert view["pending_action"]["id"] == action_id
    # The owner can still answer it: rejected, the command never runs.
    alpha.http.post(
        f"/v1/tasks/{task_id}/confirmation", json={"action_id": action_id, "approve": False}
    )
    alpha.wait(task_id, "FINISHED")
    assert not [e for e in alpha.log(task_id) if e["kind"] == "run_output"]


def test_an_idempotency_key_cannot_reach_another_tenants_task(alpha: Tenant, beta: Tenant) -> None:
    key = {"Idempotency-Key": new_id()}
    body = {"task": f"finish {new_id()}"}
    theirs = alpha.http.post("/v1/tasks", json=body, headers=key)
    mine = beta.http.post("/v1/tasks", json=body, headers=key)  # the very same request
    assert theirs.status_code == mine.status_code == 202
    assert mine.json()["id"] != theirs.json()["id"]
    assert "idempotent-replayed" not in mine.headers


def test_deleting_another_tenants_task_is_404(alpha: Tenant, beta: Tenant) -> None:
    task_id, action_id = _awaiting_confirmation(alpha)
    before = alpha.log(task_id)
    answer = beta.http.delete(f"/v1/tasks/{task_id}")
    _not_found(answer.status_code, answer.json()["detail"], task_id)
    time.sleep(SETTLE_S)
    assert alpha.log(task_id) == before  # not even stopped
    view = alpha.view(task_id)
    assert view["state"] == "AWAITING_USER_CONFIRMATION"
    assert view["pending_action"]["id"] == action_id
    assert alpha.http.post(f"/v1/tasks/{task_id}/stop").status_code == 202


def test_a_listing_shows_the_callers_tasks_only(alpha: Tenant, beta: Tenant) -> None:
    label = f"run={new_id()}"
    theirs = alpha.create(task=f"finish {new_id()}", labels=[label])
    mine = beta.create(task=f"finish {new_id()}", labels=[label])
    listed = beta.http.get("/v1/tasks", params={"label": label, "limit": 100}).json()
    assert [t["id"] for t in listed["tasks"]] == [mine]
    everything = beta.http.get("/v1/tasks", params={"limit": 100}).json()["tasks"]
    assert theirs not in [t["id"] for t in everything]
    # A cursor of alpha's listing is no key to alpha's tasks in beta's hands.
    alpha.create(task=f"finish {new_id()}", labels=[label])
    cursor = alpha.http.get("/v1/tasks", params={"label": label, "limit": 1}).json()
    assert cursor["next_cursor"]
    followed = beta.http.get("/v1/tasks", params={"label": label, "cursor": cursor["next_cursor"]})
    assert theirs not in [t["id"] for t in followed.json()["tasks"]]


def test_the_owner_deletes_a_running_task_and_nothing_of_it_is_left(
    alpha: Tenant, stack: Stack
) -> None:
    """Not an attack: what DELETE leaves behind, on the real services."""
    task_id, _ = _awaiting_confirmation(alpha)
    assert alpha.log(task_id)
    assert alpha.http.delete(f"/v1/tasks/{task_id}").status_code == 204
    assert alpha.http.get(f"/v1/tasks/{task_id}").status_code == 404
    assert alpha.http.get(f"/v1/tasks/{task_id}/events").status_code == 404
    assert task_id not in [t["id"] for t in alpha.http.get("/v1/tasks").json()["tasks"]]
    assert asyncio.run(_stored(stack, task_id)) == (0, 0)
    # Its State and deadline, removed by the controller (told by the deletions stream).
    client = redis.Redis(**stack.redis_login())
    try:
        deadline = time.monotonic() + 15
        while client.exists(f"deckhands:task:{task_id}"):
            assert time.monotonic() < deadline, "the deleted task's State is still there"
            time.sleep(0.1)
        assert client.zscore("deckhands:deadlines", task_id) is None
    finally:
        client.close()


async def _stored(stack: Stack, task_id: str) -> tuple[int, int]:
    """What NATS and the storage service still hold of a task: (log messages, stored events)."""
    nc = await nats.connect(**stack.nats_login())
    try:
        info = await nc.jetstream().stream_info(
            EVENTS_STREAM, subjects_filter=event_subject(task_id)
        )
        request = HistoryRequest(task_id=task_id)
        reply = await nc.request(HISTORY_SUBJECT, request.model_dump_json().encode(), timeout=5)
        stored = HistoryReply.model_validate_json(reply.data)
        return sum((info.state.subjects or {}).values()), len(stored.events)
    finally:
        await nc.close()
