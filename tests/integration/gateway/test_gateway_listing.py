"""Finding and deleting tasks through the real gateway process: labels, GET /v1/tasks with its
filters and cursor, and DELETE /v1/tasks/{id} removing State, log, blobs and sub-tasks."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from gateway_doubles import StorageDouble, controller_inbox, make_as_controller
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from services.gateway.tasks.creations import TaskViews
from shared.blobs import BlobMissing, BlobStore
from shared.events import AgentState, new_id
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import DELETIONS_STREAM, EVENTS_STREAM, deletion_subject, event_subject
from shared.task_creation import creation_key
from shared.trajectory import load_trajectory, trajectory_key
from tools.api_access import auth_headers, issue_key


@pytest.fixture
async def fresh(gateway_url: str, admin_key: str) -> httpx.AsyncClient:
    """A client of a tenant of the test's own: its listing holds only what the test made."""
    key = issue_key(gateway_url, admin_key, f"list-{new_id()[:10]}")
    return httpx.AsyncClient(base_url=gateway_url, headers=auth_headers(key), timeout=15)


async def _create(http: httpx.AsyncClient, task: str, **body: object) -> str:
    answer = await http.post("/v1/tasks", json={"task": task, **body})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


async def _set_state(redis: Redis, task_id: str, agent_state: AgentState) -> None:
    store = TaskStateStore(redis)
    state = await make_as_controller(redis, task_id)
    await store.save(state.model_copy(update={"agent_state": agent_state}))


async def _deletion_announced(nc: NatsClient, task_id: str) -> bool:
    info = await nc.jetstream().stream_info(
        DELETIONS_STREAM, subjects_filter=deletion_subject(task_id)
    )
    return bool((info.state.subjects or {}).get(deletion_subject(task_id)))


async def test_labels_are_set_at_creation_and_checked(http: httpx.AsyncClient) -> None:
    task_id = await _create(http, "x", labels=["team=payments", "ticket:ABC-12"])
    view = (await http.get(f"/v1/tasks/{task_id}")).json()
    assert view["labels"] == ["team=payments", "ticket:ABC-12"]
    assert (await http.get(f"/v1/tasks/{await _create(http, 'y')}")).json()["labels"] == []
    for labels in (
        [f"l{i}" for i in range(17)],  # more than 16
        ["a", "a"],
        [""],
        ["has space"],
        ["x" * 129],
        ["-leading"],
    ):
        answer = await http.post("/v1/tasks", json={"task": "x", "labels": labels})
        assert answer.status_code == 422, (labels, answer.text)
        assert answer.json()["detail"][0]["field"].startswith("labels"), answer.text


async def test_the_listing_is_the_tenants_newest_first(
    fresh: httpx.AsyncClient, http: httpx.AsyncClient, redis: Redis
) -> None:
    async with fresh:
        made = [await _create(fresh, f"task {i}", labels=[f"n={i}", "all"]) for i in range(5)]
        await _create(http, "another tenant's")
        await _set_state(redis, made[1], AgentState.FINISHED)
        await _set_state(redis, made[3], AgentState.ERROR)

        listed = (await fresh.get("/v1/tasks")).json()
        assert [t["id"] for t in listed["tasks"]] == made[::-1]
        assert listed["next_cursor"] is None
        first = listed["tasks"][-1]
        assert (first["task"], first["state"], first["labels"]) == (
            "task 0",
            "LOADING",
            ["n=0", "all"],
        )

        pages, cursor = [], None
        while True:
            params: dict[str, object] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = (await fresh.get("/v1/tasks", params=params)).json()
            pages.append([t["id"] for t in page["tasks"]])
            if not (cursor := page["next_cursor"]):
                break
        assert pages == [made[4:2:-1], made[2:0:-1], made[0:1]]

        by_state = await fresh.get("/v1/tasks", params={"state": ["FINISHED", "ERROR"]})
        assert [t["id"] for t in by_state.json()["tasks"]] == [made[3], made[1]]
        by_label = await fresh.get("/v1/tasks", params={"label": ["all", "n=2"]})
        assert [t["id"] for t in by_label.json()["tasks"]] == [made[2]]

        created = [datetime.fromisoformat(t["created_at"]) for t in listed["tasks"]][::-1]
        window = {"created_after": created[0].isoformat(), "created_before": created[3].isoformat()}
        in_window = await fresh.get("/v1/tasks", params=window)
        assert [t["id"] for t in in_window.json()["tasks"]] == [made[2], made[1]]
        future = {"created_after": datetime(2100, 1, 1, tzinfo=UTC).isoformat()}
        assert (await fresh.get("/v1/tasks", params=future)).json()["tasks"] == []

        for params in (
            {"limit": 0},
            {"limit": 101},
            {"state": "DANCING"},
            {"label": "has space"},
            {"label": [f"l{i}" for i in range(17)]},
            {"created_after": "yesterday"},
            {"cursor": "not-a-cursor"},
        ):
            answer = await fresh.get("/v1/tasks", params=params)
            assert answer.status_code == 422, (params, answer.text)


async def test_delete_removes_state_log_blobs_and_record(
    http: httpx.AsyncClient, redis: Redis, nc: NatsClient, storage: StorageDouble
) -> None:
    key = {"Idempotency-Key": new_id()}
    answer = await http.post("/v1/tasks", json={"task": "doomed", "trajectory": []}, headers=key)
    task_id = answer.json()["id"]
    await _set_state(redis, task_id, AgentState.FINISHED)
    js = nc.jetstream()
    blobs = BlobStore(lambda: js)
    ref = await blobs.put(task_id, b"the whole output")
    event = {
        "kind": "run_output",
        "task_id": task_id,
        "seq": 1,
        "id": new_id(),
        "content_ref": ref.model_dump(mode="json"),
    }
    storage.add(event)
    await js.publish(event_subject(task_id), b"{}", stream=EVENTS_STREAM)
    assert await load_trajectory(redis, task_id) == []

    deleted = await http.delete(f"/v1/tasks/{task_id}")
    assert deleted.status_code == 204, deleted.text

    assert (await http.get(f"/v1/tasks/{task_id}")).status_code == 404
    assert (await http.delete(f"/v1/tasks/{task_id}")).status_code == 404
    assert task_id not in [t["id"] for t in (await http.get("/v1/tasks")).json()["tasks"]]
    # The State is the controller's to remove: the deletion is announced to it (and to the
    # runtime and storage) on the deletions stream; the gateway writes no State.
    assert await _deletion_announced(nc, task_id)
    assert await TaskStateStore(redis).load(task_id) is not None
    assert not await redis.exists(creation_key(task_id))
    assert await redis.exists(trajectory_key(task_id)) == 0
    assert task_id in storage.forgotten and task_id not in storage.events
    with pytest.raises(BlobMissing):
        await blobs.get(task_id, ref.sha256)
    info = await js.stream_info(EVENTS_STREAM, subjects_filter=event_subject(task_id))
    assert not info.state.subjects  # the log is gone from JetStream
    # Its Idempotency-Key is free again: the same request makes a new task.
    again = await http.post("/v1/tasks", json={"task": "doomed", "trajectory": []}, headers=key)
    assert again.status_code == 202 and again.json()["id"] != task_id


async def test_a_task_that_does_not_stop_is_not_deleted(
    http: httpx.AsyncClient, redis: Redis, nc: NatsClient
) -> None:
    task_id = await _create(http, "running")  # LOADING: no controller here will stop it
    answer = await http.delete(f"/v1/tasks/{task_id}")
    assert answer.status_code == 503, answer.text
    assert "did not stop" in answer.json()["detail"]
    queued = await controller_inbox(nc, task_id, expect=2)
    assert (queued[1]["agent_state"], queued[1]["reason"]) == ("STOPPED", "deleted by user")
    assert await TaskViews(redis).load(task_id) is not None  # nothing was removed
    assert (await http.get(f"/v1/tasks/{task_id}")).status_code == 200


async def test_sub_tasks_go_with_their_root_and_only_with_it(
    http: httpx.AsyncClient, redis: Redis, nc: NatsClient, storage: StorageDouble
) -> None:
    store = TaskStateStore(redis)
    parent_id = await _create(http, "parent")
    child = TaskState(
        task_id=new_id(),
        task="child",
        max_iterations=3,
        parent_task_id=parent_id,
        agent_state=AgentState.FINISHED,
    )
    assert await store.create(child)
    parent = await make_as_controller(redis, parent_id)
    await store.save(
        parent.model_copy(update={"agent_state": AgentState.STOPPED, "sub_tasks": [child.task_id]})
    )
    refused = await http.delete(f"/v1/tasks/{child.task_id}")
    assert refused.status_code == 409 and parent_id in refused.json()["detail"]
    assert (await http.delete(f"/v1/tasks/{parent_id}")).status_code == 204
    assert await _deletion_announced(nc, child.task_id)
    assert {parent_id, child.task_id} <= set(storage.forgotten)
