"""A storage replica's durable consumers (named for it) do not outlive it for ever: NATS removes
them once the replica has been gone for `consumer_inactive_s`, so a replica scaled away leaves
no consumer behind; one that comes back reads the whole log again and stores it once."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path

import nats
import nats.js.errors
import pytest

from services.storage.main import build_app
from services.storage.settings import StorageSettings
from shared.events import EventSource, MessageAction
from shared.settings import CommonSettings
from shared.subjects import DELETIONS_STREAM, EVENTS_STREAM, event_subject

pytestmark = pytest.mark.timeout(120)


def _stored(data_dir: Path, replica: str, task_id: str) -> int:
    db = sqlite3.connect(data_dir / f"{replica}.sqlite3")
    try:
        row = db.execute("SELECT count(*) FROM events WHERE task_id = ?", (task_id,)).fetchone()
        return int(row[0])
    finally:
        db.close()


async def _until(what: str, check: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.2)


async def test_a_gone_replica_s_consumers_expire_and_a_returning_one_catches_up(
    isolated_settings: CommonSettings, tmp_path: Path
) -> None:
    common = isolated_settings.model_dump(include=set(CommonSettings.model_fields))
    replica = f"storage-x{uuid.uuid4().hex[:6]}"
    settings = StorageSettings(
        **common, data_dir=tmp_path, replica=replica, batch_wait_s=0.05, consumer_inactive_s=2
    )
    nc = await nats.connect(isolated_settings.nats_url)
    js = nc.jetstream()
    task_id = uuid.uuid4().hex

    async def consumers() -> set[str]:
        found = set()
        for stream in (EVENTS_STREAM, DELETIONS_STREAM):
            try:
                await js.consumer_info(stream, replica)
                found.add(stream)
            except nats.js.errors.NotFoundError:
                pass
        return found

    async def log(seq: int) -> None:
        event = MessageAction(task_id=task_id, source=EventSource.USER, content=f"m{seq}", seq=seq)
        await js.publish(
            event_subject(task_id),
            event.model_dump_json().encode(),
            headers={"Nats-Msg-Id": event.id},
        )

    try:
        app = build_app(settings)
        await app.start()
        await log(1)

        async def stored_first() -> bool:
            return _stored(tmp_path, replica, task_id) == 1

        await _until("the replica stores the first event", stored_first)
        assert await consumers() == {EVENTS_STREAM, DELETIONS_STREAM}
        await app.stop()

        await log(2)  # logged while the replica is away

        async def expired() -> bool:
            return not await consumers()

        await _until("NATS removes the gone replica's consumers", expired)

        # Back after its consumers expired: it reads the whole log again, each event once.
        app = build_app(settings)
        await app.start()

        async def caught_up() -> bool:
            return _stored(tmp_path, replica, task_id) == 2

        await _until("the returning replica stores what it missed", caught_up)
        await asyncio.sleep(0.5)
        assert _stored(tmp_path, replica, task_id) == 2
        await app.stop()
    finally:
        await nc.close()
