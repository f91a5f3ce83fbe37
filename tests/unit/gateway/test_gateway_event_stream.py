"""EventService's live stream without HTTP, on a real nats-server: history and live events
joined in seq order, gaps filled from storage, storage outages ridden out."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from faststream.nats import NatsBroker
from gateway_unit_doubles import StorageStandIn
from redis.asyncio import Redis

from services.gateway.context import build_context
from services.gateway.errors import StorageUnavailable, TaskNotFound
from services.gateway.events.service import EventService
from services.gateway.events.stream import EventStream
from services.gateway.settings import GatewaySettings
from services.gateway.tasks.values import NewTask
from shared.commands import HistoryReply, HistoryRequest
from shared.events import new_id
from shared.state_store import TaskStateStore
from shared.subjects import event_subject

TENANT = "unit-tests"


def event(task_id: str, seq: int) -> dict[str, Any]:
    return {"id": f"e{seq}", "task_id": task_id, "seq": seq, "kind": "message", "content": "c"}


class Log:
    """What storage has stored, and whether it answers."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.stored: list[dict[str, Any]] = []
        self.answering = True

    def store(self, first: int, last: int) -> None:
        self.stored.extend(event(self.task_id, s) for s in range(first, last + 1))

    async def answer(self, request: HistoryRequest) -> bytes | None:
        if not self.answering:
            return None
        after = [e for e in self.stored if e["seq"] > request.after][: request.limit]
        last = max((e["seq"] for e in self.stored), default=0)
        reply = HistoryReply(task_id=self.task_id, events=after, last_seq=last)
        return reply.model_dump_json().encode()


@pytest.fixture
async def events(broker: NatsBroker, redis: Redis, unit_settings: GatewaySettings) -> EventService:
    return build_context(unit_settings, broker, redis).events


@pytest.fixture
async def task_id(events: EventService) -> str:
    created = await events.tasks.create(NewTask("x"), TENANT)
    return created.state.task_id


@pytest.fixture
async def log(task_id: str, storage_stand_in: StorageStandIn) -> AsyncIterator[Log]:
    log = Log(task_id)
    storage_stand_in.answer = log.answer
    yield log
    storage_stand_in.answer = None


async def publish_live(settings: GatewaySettings, *events: dict[str, Any]) -> None:
    nc = await nats.connect(settings.nats_url)
    try:
        for e in events:
            await nc.publish(event_subject(e["task_id"]), json.dumps(e).encode())
        await nc.flush()
    finally:
        await nc.close()


class Reader:
    """Pulls frames in a task of its own: a timeout while waiting must not cancel (and so end)
    the stream itself."""

    def __init__(self, stream: EventStream) -> None:
        self.frames = stream.frames()
        self.seqs: asyncio.Queue[int] = asyncio.Queue()
        self.heartbeats = 0
        self._task = asyncio.create_task(self._pull())

    async def _pull(self) -> None:
        async for frame in self.frames:
            if frame.startswith("id: "):
                await self.seqs.put(int(frame.split("\n")[0].removeprefix("id: ")))
            elif frame.startswith(":"):
                self.heartbeats += 1

    async def take(self, n: int, timeout_s: float = 5.0) -> list[int]:
        async with asyncio.timeout(timeout_s):
            return [await self.seqs.get() for _ in range(n)]

    async def close(self) -> None:
        self._task.cancel()  # as when the client goes away
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_a_long_history_is_paged_then_live_events_follow(
    events: EventService, task_id: str, log: Log, unit_settings: GatewaySettings
) -> None:
    log.store(1, 7)  # the page size is 2 in these tests
    reader = Reader(await events.open_stream(task_id, after=0, tenant_id=TENANT))
    try:
        assert await reader.take(7) == [1, 2, 3, 4, 5, 6, 7]
        log.store(8, 9)
        await publish_live(unit_settings, event(task_id, 8), event(task_id, 9))
        assert await reader.take(2) == [8, 9]
    finally:
        await reader.close()


async def test_a_gap_waits_out_a_storage_outage(
    events: EventService, task_id: str, log: Log, unit_settings: GatewaySettings
) -> None:
    log.store(1, 1)
    reader = Reader(await events.open_stream(task_id, after=0, tenant_id=TENANT))
    try:
        assert await reader.take(1) == [1]
        log.answering = False
        await publish_live(unit_settings, event(task_id, 4))  # 2 and 3 were missed
        with pytest.raises(TimeoutError):
            await reader.take(1, timeout_s=1.2)  # storage is silent: nothing skips ahead
        log.store(2, 4)
        log.answering = True
        assert await reader.take(3) == [2, 3, 4]
    finally:
        await reader.close()


async def test_events_logged_before_the_stream_and_not_yet_stored_still_come(
    events: EventService, task_id: str, log: Log
) -> None:
    """The State says seq 3 is logged; storage, a moment behind, has 1 only, and 2 and 3 were
    published before the stream subscribed (nothing will bring them live): the stream fetches
    them once storage has them. Before, it waited for a live event for ever."""
    view = await events.tasks.store.load(task_id)  # the creation request's State
    assert view is not None
    # As the controller makes it and logs three entries.
    states = TaskStateStore(events.tasks.store.redis)
    assert await states.create(view.model_copy(update={"last_seq": 3}))
    log.store(1, 1)
    reader = Reader(await events.open_stream(task_id, after=0, tenant_id=TENANT))
    try:
        assert await reader.take(1) == [1]
        log.store(2, 3)  # storage catches up; no live event comes
        assert await reader.take(2) == [2, 3]
    finally:
        await reader.close()


async def test_heartbeats_keep_an_idle_stream_open(
    events: EventService, task_id: str, log: Log
) -> None:
    reader = Reader(await events.open_stream(task_id, after=0, tenant_id=TENANT))
    try:
        with pytest.raises(TimeoutError):
            await reader.take(1, timeout_s=1.3)  # heartbeat every 0.5s in these tests
        assert reader.heartbeats >= 2
    finally:
        await reader.close()


async def test_closing_the_stream_unsubscribes(
    events: EventService, task_id: str, log: Log, broker: NatsBroker
) -> None:
    log.store(1, 1)
    before = len(broker.connection._subs)
    stream = await events.open_stream(task_id, after=0, tenant_id=TENANT)
    assert len(broker.connection._subs) == before + 1
    reader = Reader(stream)
    assert await reader.take(1) == [1]
    await reader.close()
    assert len(broker.connection._subs) == before


async def test_opening_fails_before_streaming_when_storage_is_silent(
    events: EventService, task_id: str, log: Log, broker: NatsBroker
) -> None:
    log.answering = False
    before = len(broker.connection._subs)
    with pytest.raises(StorageUnavailable):
        await events.open_stream(task_id, after=0, tenant_id=TENANT)
    assert len(broker.connection._subs) == before  # nothing left subscribed
    with pytest.raises(TaskNotFound):
        await events.open_stream(new_id(), after=0, tenant_id=TENANT)


async def test_stopping_streams_ends_them_and_forgets_them(
    events: EventService, task_id: str, log: Log, broker: NatsBroker
) -> None:
    log.store(1, 1)
    before = len(broker.connection._subs)
    streams = [await events.open_stream(task_id, after=0, tenant_id=TENANT) for _ in range(3)]
    readers = [asyncio.create_task(_collect(s)) for s in streams]
    await asyncio.sleep(0.2)
    events.stop_streams()
    collected = await asyncio.wait_for(asyncio.gather(*readers), 5)
    assert all(any(f.startswith("id: 1\n") for f in c) for c in collected)
    assert events._open == set()
    assert len(broker.connection._subs) == before


async def _collect(stream: EventStream) -> list[str]:
    return [frame async for frame in stream.frames()]
