"""A deleted task leaves no copy on any storage replica, not even one that was down when it was
deleted (issue 9): two replicas of the real storage service on a real nats-server store a
task's log; one stops; the task is deleted as the gateway deletes it (the log's subject purged,
the deletion announced on the deletions stream, the replicas that are up asked at once); the
stopped replica starts again on its own database, removes its copy, and keeps nothing that
comes of the task later."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client

from services.gateway.tasks.deletion import announce_deletion
from services.storage.main import build_app
from services.storage.settings import StorageSettings
from shared.commands import ForgetTaskReply, ForgetTaskRequest
from shared.events import EventSource, MessageAction
from shared.settings import CommonSettings
from shared.subjects import EVENTS_STREAM, FORGET_SUBJECT, event_subject

pytestmark = pytest.mark.timeout(120)


def _stored(data_dir: Path, replica: str, task_id: str) -> int:
    db = sqlite3.connect(data_dir / f"{replica}.sqlite3")
    try:
        row = db.execute("SELECT count(*) FROM events WHERE task_id = ?", (task_id,)).fetchone()
        return int(row[0])
    finally:
        db.close()


async def _until(what: str, check: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.1)


def _replica(settings: CommonSettings, data_dir: Path, name: str) -> FastStream:
    common = settings.model_dump(include=set(CommonSettings.model_fields))
    return build_app(StorageSettings(**common, data_dir=data_dir, replica=name, batch_wait_s=0.05))


async def _log(nc: Client, task_id: str, seqs: range) -> None:
    js = nc.jetstream()
    for seq in seqs:
        event = MessageAction(task_id=task_id, source=EventSource.USER, content=f"m{seq}", seq=seq)
        await js.publish(
            event_subject(task_id),
            event.model_dump_json().encode(),
            stream=EVENTS_STREAM,
            headers={"Nats-Msg-Id": event.id},
        )


@pytest.fixture
async def nc(isolated_settings: CommonSettings) -> AsyncIterator[Client]:
    client = await nats.connect(isolated_settings.nats_url)
    yield client
    await client.close()


async def test_a_replica_down_at_the_deletion_removes_its_copy_when_it_is_back(
    isolated_settings: CommonSettings, tmp_path: Path, nc: Client
) -> None:
    data_dir = tmp_path / "storage"
    up, down = f"up-{uuid.uuid4().hex[:6]}", f"down-{uuid.uuid4().hex[:6]}"
    first = _replica(isolated_settings, data_dir, up)
    second = _replica(isolated_settings, data_dir, down)
    await first.start()
    await second.start()
    deleted, kept = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        await _log(nc, deleted, range(1, 6))
        await _log(nc, kept, range(1, 4))
        for replica in (up, down):
            await _until(
                f"{replica} stored both logs",
                lambda r=replica: (
                    _stored(data_dir, r, deleted) == 5  # type: ignore[misc]
                    and _stored(data_dir, r, kept) == 3
                ),
            )
        await second.stop()  # down while the task is deleted

        # As DELETE /v1/tasks/{id} does: purge the subject, announce, ask the replicas up.
        await nc.jetstream().purge_stream(EVENTS_STREAM, subject=event_subject(deleted))
        broker = NatsBroker(isolated_settings.nats_url)
        await broker.connect()
        try:
            await announce_deletion(broker, deleted)
        finally:
            await broker.stop()
        reply = await nc.request(
            FORGET_SUBJECT, ForgetTaskRequest(task_id=deleted).model_dump_json().encode(), 5
        )
        assert ForgetTaskReply.model_validate_json(reply.data).error is None
        await _until(f"{up} removed its copy", lambda: _stored(data_dir, up, deleted) == 0)
        assert _stored(data_dir, down, deleted) == 5  # it was down: its copy is still there

        second = _replica(isolated_settings, data_dir, down)
        await second.start()
        await _until(f"{down} removed its copy", lambda: _stored(data_dir, down, deleted) == 0)
        assert _stored(data_dir, down, kept) == 3  # the other task's log is untouched

        # Something of the deleted task that comes late (a straggler) is kept by no replica.
        await _log(nc, deleted, range(6, 7))
        await _log(nc, kept, range(4, 5))
        for replica in (up, down):
            await _until(
                f"{replica} stored the kept task's new event",
                lambda r=replica: _stored(data_dir, r, kept) == 4,  # type: ignore[misc]
            )
            assert _stored(data_dir, replica, deleted) == 0
    finally:
        await second.stop()
        await first.stop()
