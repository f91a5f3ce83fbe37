"""The storage service answers every history request on the real nats-server: a page, or an
error naming what was wrong; never silence (the caller would wait out its timeout)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from services.storage.main import build_app
from services.storage.settings import StorageSettings
from shared.commands import HistoryReply
from shared.events import EventSource, MessageAction
from shared.settings import CommonSettings
from shared.subjects import HISTORY_SUBJECT, dlq_subject


@pytest.fixture(scope="module")
async def storage_nc(
    isolated_settings: CommonSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    common = isolated_settings.model_dump(include=set(CommonSettings.model_fields))
    app = build_app(StorageSettings(**common, data_dir=Path(tmp_path_factory.mktemp("storage"))))
    await app.start()
    nc = await nats.connect(isolated_settings.nats_url)
    try:
        yield nc
    finally:
        await nc.close()
        await app.stop()


async def ask(nc: Client, body: bytes) -> HistoryReply:
    msg = await nc.request(HISTORY_SUBJECT, body, timeout=5)
    return HistoryReply.model_validate_json(msg.data)


async def test_a_valid_request_gets_a_page(storage_nc: Client) -> None:
    task_id = uuid.uuid4().hex
    reply = await ask(storage_nc, json.dumps({"task_id": task_id}).encode())
    assert reply.error is None and reply.events == [] and reply.last_seq == 0


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"\xff\xfenot json", "bad history request"),
        (b'{"task_id": "t", "after": 9223372036854775808}', "after"),
        (b'{"task_id": "t", "limit": 0}', "limit"),
        (b'{"after": 1}', "task_id"),
        (b"[]", "bad history request"),
    ],
)
async def test_a_bad_request_gets_an_error_naming_it(
    storage_nc: Client, body: bytes, names: str
) -> None:
    reply = await ask(storage_nc, body)
    assert reply.events == [] and reply.error is not None and names in reply.error


async def test_a_batch_with_bad_events_stores_the_good_ones_and_dead_letters_the_bad(
    storage_nc: Client,
) -> None:
    """Events taken in one batch are settled one by one: the valid ones are stored (a
    redelivered one is not stored twice), garbage and an event without seq go to the
    dead-letter subject with the reason, and none holds back the others."""
    js = storage_nc.jetstream()
    task_id = uuid.uuid4().hex
    subject = f"deckhands.events.{task_id}"
    good = [
        MessageAction(
            id=f"m{seq}-{task_id}", task_id=task_id, seq=seq, source=EventSource.USER, content="hi"
        )
        for seq in (1, 2, 3)
    ]
    unsequenced = MessageAction(
        id=f"x-{task_id}", task_id=task_id, source=EventSource.USER, content="no seq"
    )
    bodies = [
        good[0].model_dump_json().encode(),
        b"\x00 not an event",
        good[1].model_dump_json().encode(),
        unsequenced.model_dump_json().encode(),
        good[2].model_dump_json().encode(),
        good[1].model_dump_json().encode(),  # the same event again: a redelivery
    ]
    for body in bodies:
        await js.publish(subject, body)

    for _ in range(100):
        reply = await ask(storage_nc, json.dumps({"task_id": task_id}).encode())
        if len(reply.events) == 3:
            break
        await asyncio.sleep(0.05)
    assert [e["id"] for e in reply.events] == [e.id for e in good]

    dead = await js.subscribe(dlq_subject("storage"), ordered_consumer=True)
    reasons: list[str] = []
    for _ in range(2):
        msg = await dead.next_msg(timeout=5)
        if msg.headers and msg.headers.get("Deckhands-Dlq-Subject") == subject:
            reasons.append(msg.headers["Deckhands-Dlq-Reason"])
    await dead.unsubscribe()
    assert len(reasons) == 2, reasons
    assert any("ValidationError" in r for r in reasons), reasons
    assert any("has no seq" in r for r in reasons), reasons
