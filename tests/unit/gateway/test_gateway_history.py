"""The history client against a real nats-server, with storage's side played by a core-NATS
responder that can misbehave in ways the real one should not."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from faststream.nats import NatsBroker
from gateway_unit_doubles import Responder, StorageStandIn

from services.gateway.errors import StorageBadReply, StorageUnavailable
from services.gateway.events.history import HistoryClient
from services.gateway.main import build_gateway_broker
from services.gateway.settings import GatewaySettings
from shared.commands import HistoryRequest
from tools.procs import free_port, start_nats


@asynccontextmanager
async def storage_answering(
    stand_in: StorageStandIn, answer: Responder
) -> AsyncIterator[list[HistoryRequest]]:
    stand_in.seen, stand_in.answer = [], answer
    try:
        yield stand_in.seen
    finally:
        stand_in.answer = None


def reply(task_id: str, seqs: list[int], last_seq: int) -> bytes:
    events = [{"seq": s, "kind": "message", "task_id": task_id} for s in seqs]
    return json.dumps({"task_id": task_id, "events": events, "last_seq": last_seq}).encode()


@pytest.fixture
def client(broker: NatsBroker, unit_settings: GatewaySettings) -> HistoryClient:
    return HistoryClient(broker, timeout_s=unit_settings.history_timeout_s, page_size=2)


async def test_events_come_back_sorted_and_only_after_the_cursor(
    client: HistoryClient, storage_stand_in: StorageStandIn
) -> None:
    async def answer(request: HistoryRequest) -> bytes:
        return reply(request.task_id, [5, 3, 2, 4], last_seq=5)

    async with storage_answering(storage_stand_in, answer) as seen:
        page = await client.page("t1", after=2, limit=7)
    assert [e["seq"] for e in page.events] == [3, 4, 5]
    assert page.last_seq == 5
    assert seen == [HistoryRequest(task_id="t1", after=2, limit=7)]


async def test_all_after_pages_through_the_log(
    client: HistoryClient, storage_stand_in: StorageStandIn
) -> None:
    async def answer(request: HistoryRequest) -> bytes:
        seqs = [s for s in range(1, 6) if s > request.after][: request.limit]
        return reply(request.task_id, seqs, last_seq=5)

    async with storage_answering(storage_stand_in, answer) as seen:
        events = [e async for e in client.all_after("t2")]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert [r.after for r in seen] == [0, 2, 4]  # page size 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "invalid history reply"),
        (b'{"error": "disk full"}', "invalid history reply"),
        (reply("someone-else", [1], 1), "answered for task 'someone-else'"),
    ],
)
async def test_a_bad_reply_is_a_bad_gateway(
    client: HistoryClient, storage_stand_in: StorageStandIn, body: bytes, message: str
) -> None:
    async def answer(request: HistoryRequest) -> bytes:
        return body

    async with storage_answering(storage_stand_in, answer):
        with pytest.raises(StorageBadReply, match=message) as failure:
            await client.page("t3", after=0)
    assert failure.value.status_code == 502


async def test_silence_is_unavailable_after_the_timeout(
    client: HistoryClient, storage_stand_in: StorageStandIn
) -> None:
    async def answer(request: HistoryRequest) -> None:
        return None

    async with storage_answering(storage_stand_in, answer):
        with pytest.raises(StorageUnavailable, match=r"within 0\.5s") as failure:
            await client.page("t4", after=0)
    assert failure.value.status_code == 503


async def test_no_listener_is_unavailable_at_once(tmp_path: Path) -> None:
    port = free_port()
    proc = start_nats(port, tmp_path / "store", tmp_path / "nats.log")
    broker = build_gateway_broker(GatewaySettings(nats_url=f"nats://127.0.0.1:{port}"))
    try:
        await broker.start()
        client = HistoryClient(broker, timeout_s=5, page_size=2)
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match="no storage service is listening"):
            await client.page("t5", after=0)
        assert time.monotonic() - started < 2
    finally:
        await broker.stop()
        proc.terminate()
        proc.wait(10)
