"""The storage service answers every history request on the real nats-server: a page, or an
error naming what was wrong; never silence (the caller would wait out its timeout)."""

from __future__ import annotations

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
from shared.settings import CommonSettings
from shared.subjects import HISTORY_SUBJECT


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
