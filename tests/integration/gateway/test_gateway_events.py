"""A task's events through the real gateway: pages from storage, and the SSE stream that joins
stored history with live events from the event subject."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from gateway_doubles import SseFrame, SseReader, StorageDouble, make_as_controller
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from shared.events import (
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    CmdOutputObservation,
    CmdRunAction,
    EventAdapter,
    EventSource,
    MessageAction,
)
from shared.state_store import TaskStateStore
from shared.subjects import EVENTS_STREAM, event_subject

STREAM_TIMEOUT = httpx.Timeout(10, read=10)


def make_event(task_id: str, seq: int) -> dict[str, Any]:
    kinds = [
        lambda: MessageAction(task_id=task_id, seq=seq, source=EventSource.USER, content=f"m{seq}"),
        lambda: CmdRunAction(task_id=task_id, seq=seq, source=EventSource.AGENT, command="ls"),
        lambda: CmdOutputObservation(
            task_id=task_id,
            seq=seq,
            source=EventSource.ENVIRONMENT,
            command="ls",
            content=f"out {seq}\nline two",
            exit_code=0,
            cwd="/workspace",
        ),
    ]
    return kinds[seq % 3]().model_dump(mode="json")


def make_events(task_id: str, first: int, last: int) -> list[dict[str, Any]]:
    return [make_event(task_id, seq) for seq in range(first, last + 1)]


async def new_task(http: httpx.AsyncClient) -> str:
    resp = await http.post("/v1/tasks", json={"task": "x"})
    assert resp.status_code == 202
    return str(resp.json()["id"])


async def publish_live(nc: NatsClient, *events: dict[str, Any]) -> None:
    """What the controller does when it logs an event."""
    js = nc.jetstream()
    for event in events:
        await js.publish(
            event_subject(event["task_id"]),
            json.dumps(event).encode(),
            stream=EVENTS_STREAM,
            headers={"Nats-Msg-Id": event["id"]},
        )


@asynccontextmanager
async def open_stream(
    http: httpx.AsyncClient, task_id: str, **kwargs: Any
) -> AsyncIterator[tuple[httpx.Response, SseReader]]:
    async with http.stream(
        "GET", f"/v1/tasks/{task_id}/events/stream", timeout=STREAM_TIMEOUT, **kwargs
    ) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        try:
            yield resp, reader
        finally:
            await reader.close()


def seqs(frames: list[SseFrame]) -> list[int]:
    return [frame.json()["seq"] for frame in frames]


async def test_events_are_paged_in_order(http: httpx.AsyncClient, storage: StorageDouble) -> None:
    task_id = await new_task(http)
    stored = make_events(task_id, 1, 5)
    storage.add(*reversed(stored))  # storage order must not matter

    page = (await http.get(f"/v1/tasks/{task_id}/events", params={"limit": 2})).json()
    assert page["events"] == stored[:2]
    assert (page["next_after"], page["last_seq"], page["has_more"]) == (2, 5, True)
    page = (await http.get(f"/v1/tasks/{task_id}/events", params={"after": 2})).json()
    assert [e["seq"] for e in page["events"]] == [3, 4, 5]
    assert (page["next_after"], page["has_more"]) == (5, False)
    page = (await http.get(f"/v1/tasks/{task_id}/events", params={"after": 5})).json()
    assert page["events"] == [] and page["next_after"] == 5
    assert [(r.after, r.limit) for r in storage.requests] == [(0, 2), (2, 1000), (5, 1000)]
    for event in stored:  # what the client gets is the Event union, intact
        EventAdapter.validate_python(event)


async def test_trajectory_is_the_whole_log(http: httpx.AsyncClient, storage: StorageDouble) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 1203))  # more than one storage page
    body = (await http.get(f"/v1/tasks/{task_id}/trajectory")).json()
    assert body["task"] == "x"
    assert [e["seq"] for e in body["events"]] == list(range(1, 1204))


async def test_trajectory_waits_for_events_storage_has_not_stored_yet(
    http: httpx.AsyncClient, storage: StorageDouble, redis: Redis
) -> None:
    """Right after a task ends, storage may still be writing its last events: the export
    waits for everything up to the State's last seq instead of returning a shorter log."""
    task_id = await new_task(http)
    store = TaskStateStore(redis)
    state = await make_as_controller(redis, task_id)
    await store.save(state.model_copy(update={"last_seq": 5}))
    storage.add(*make_events(task_id, 1, 3))

    async def store_the_rest() -> None:
        await asyncio.sleep(0.8)
        storage.add(*make_events(task_id, 4, 5))

    late = asyncio.create_task(store_the_rest())
    body = (await http.get(f"/v1/tasks/{task_id}/trajectory")).json()
    await late
    assert [e["seq"] for e in body["events"]] == [1, 2, 3, 4, 5]


async def test_a_trajectory_storage_has_not_caught_up_with_is_a_503_not_a_cut_log(
    http: httpx.AsyncClient, storage: StorageDouble, redis: Redis
) -> None:
    """Storage's consumer can fall seconds behind the log (a stream's leader election in a
    NATS cluster held it back past the wait): the export says so instead of returning the
    first events as if they were the whole log, and is whole once storage has caught up."""
    task_id = await new_task(http)
    state = await make_as_controller(redis, task_id)
    await TaskStateStore(redis).save(state.model_copy(update={"last_seq": 5}))
    storage.add(*make_events(task_id, 1, 3))

    started = time.monotonic()
    resp = await http.get(f"/v1/tasks/{task_id}/trajectory")
    assert resp.status_code == 503, resp.text
    body = resp.json()
    assert "up to seq 3 of 5" in body["detail"], body
    assert (body["stored_seq"], body["last_seq"]) == (3, 5)
    assert resp.headers["retry-after"] == "1"
    assert 0.9 < time.monotonic() - started < 5  # the gateway's wait, history_timeout_s

    storage.add(*make_events(task_id, 4, 5))
    resp = await http.get(f"/v1/tasks/{task_id}/trajectory")
    assert resp.status_code == 200
    assert [e["seq"] for e in resp.json()["events"]] == [1, 2, 3, 4, 5]


async def test_events_are_503_when_storage_does_not_answer(
    http: httpx.AsyncClient, storage: StorageDouble
) -> None:
    task_id = await new_task(http)
    storage.answering = False
    started = time.monotonic()
    resp = await http.get(f"/v1/tasks/{task_id}/events")
    assert resp.status_code == 503
    assert "storage" in resp.json()["detail"] and "1s" in resp.json()["detail"]
    assert resp.headers["retry-after"] == "1"
    assert 0.9 < time.monotonic() - started < 5

    resp = await http.get(f"/v1/tasks/{task_id}/events/stream")
    assert resp.status_code == 503 and "storage" in resp.json()["detail"]


async def test_stream_sends_history_then_live_events_each_once_in_order(
    http: httpx.AsyncClient, storage: StorageDouble, nc: NatsClient
) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 3))
    async with open_stream(http, task_id) as (resp, reader):
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        first = await reader.next_events(3)
        assert seqs(first) == [1, 2, 3]
        assert [f.id for f in first] == ["1", "2", "3"]
        assert [f.event for f in first] == ["run", "run_output", "message"]
        assert first[1].json()["content"] == "out 2\nline two"  # multi-line text, one data line

        live = make_events(task_id, 4, 6)
        storage.add(*live)
        await publish_live(nc, make_event(task_id, 3), *live)  # 3 again: already sent
        assert seqs(await reader.next_events(3)) == [4, 5, 6]
        await publish_live(nc, *live[:2])  # a repeated publish is not sent twice
        await reader.no_more_events(0.5)


async def test_stream_resumes_after_last_event_id(
    http: httpx.AsyncClient, storage: StorageDouble, nc: NatsClient
) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 5))
    async with open_stream(http, task_id) as (_, reader):
        received = await reader.next_events(5)
    last_id = received[2].id  # say the client had handled 1..3 when its connection dropped
    assert last_id == "3"

    # Last-Event-ID wins over the `after` of the original URL, as a browser reconnects.
    headers = {"Last-Event-ID": last_id}
    async with open_stream(http, task_id, params={"after": 1}, headers=headers) as (_, reader):
        assert seqs(await reader.next_events(2)) == [4, 5]
        storage.add(make_event(task_id, 6))
        await publish_live(nc, make_event(task_id, 6))
        assert seqs(await reader.next_events(1)) == [6]

    async with open_stream(http, task_id, params={"after": 4}) as (_, reader):
        assert seqs(await reader.next_events(2)) == [5, 6]
        await reader.no_more_events(0.3)


async def test_stream_fills_a_gap_from_storage_once_storage_has_it(
    http: httpx.AsyncClient, storage: StorageDouble, nc: NatsClient
) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 2))
    async with open_stream(http, task_id) as (_, reader):
        assert seqs(await reader.next_events(2)) == [1, 2]
        # 3 and 4 went out before this subscriber could see them (say, it was a slow
        # consumer), and storage has not stored them yet: 5 must wait for them.
        await publish_live(nc, make_event(task_id, 5))
        await reader.no_more_events(0.5)
        storage.add(*make_events(task_id, 3, 5))
        assert seqs(await reader.next_events(3)) == [3, 4, 5]
        await reader.no_more_events(0.3)


async def test_stream_sends_heartbeats_when_idle(
    http: httpx.AsyncClient, storage: StorageDouble
) -> None:
    task_id = await new_task(http)
    async with open_stream(http, task_id) as (_, reader):
        await reader.no_more_events(3.5)  # the heartbeat is 1s in these tests, 15s by default
        assert 2 <= len(reader.comments) <= 4, reader.comments
        assert reader.comments[0] == "keep-alive"


async def test_stream_can_end_when_the_task_ends(
    http: httpx.AsyncClient, storage: StorageDouble, nc: NatsClient
) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 1))
    ending = [
        AgentFinishAction(
            task_id=task_id, seq=2, source=EventSource.AGENT, final_message="done"
        ).model_dump(mode="json"),
        AgentStateChangedObservation(
            task_id=task_id,
            seq=3,
            source=EventSource.SYSTEM,
            agent_state=AgentState.FINISHED,
            previous_state=AgentState.RUNNING,
            reason="agent finished",
        ).model_dump(mode="json"),
    ]
    async with open_stream(http, task_id, params={"close_on_terminal": "true"}) as (_, reader):
        assert seqs(await reader.next_events(1)) == [1]
        storage.add(*ending)
        await publish_live(nc, *ending)
        rest = await reader.rest()  # the server ends the stream by itself
    assert [f.event for f in rest] == ["finish", "agent_state_changed"]


async def open_streams(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    match = re.search(r"^deckhands_gateway_event_streams_open (\S+)$", text, re.M)
    assert match, "gauge missing from /metrics"
    return float(match.group(1))


async def test_a_client_that_goes_away_releases_its_stream(
    http: httpx.AsyncClient, storage: StorageDouble
) -> None:
    task_id = await new_task(http)
    storage.add(*make_events(task_id, 1, 1))
    before = await open_streams(http)
    async with httpx.AsyncClient(
        base_url=str(http.base_url), headers=http.headers, timeout=STREAM_TIMEOUT
    ) as other:
        async with other.stream("GET", f"/v1/tasks/{task_id}/events/stream") as resp:
            reader = SseReader(resp)
            await reader.next_events(1)
            assert await open_streams(http) == before + 1
            await reader.close()
    for _ in range(50):
        if await open_streams(http) == before:
            break
        await asyncio.sleep(0.1)
    assert await open_streams(http) == before


async def test_a_blob_an_event_refers_to_is_served_whole(
    http: httpx.AsyncClient, nc: NatsClient
) -> None:
    from shared.blobs import BlobStore

    task_id = await new_task(http)
    whole = "".join(f"line {i} é\n" for i in range(200_000)).encode()  # past max_payload
    ref = await BlobStore(nc.jetstream).put(task_id, whole)
    served = await http.get(f"/v1/tasks/{task_id}/blobs/{ref.sha256}")
    assert served.status_code == 200, served.text
    assert served.content == whole
    assert served.headers["content-type"] == "text/plain; charset=utf-8"

    other = await new_task(http)  # a blob is found only under its own task
    missing = await http.get(f"/v1/tasks/{other}/blobs/{ref.sha256}")
    assert missing.status_code == 404 and "no blob" in missing.json()["detail"]
    unknown = await http.get(f"/v1/tasks/nope/blobs/{ref.sha256}")
    assert unknown.status_code == 404 and "not found" in unknown.json()["detail"]
    malformed = await http.get(f"/v1/tasks/{task_id}/blobs/not-a-hash")
    assert malformed.status_code == 422
