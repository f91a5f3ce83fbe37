"""Redelivery with backoff and dead-lettering, against the real nats-server."""

from __future__ import annotations

import asyncio
import uuid

import nats
from faststream.nats import NatsBroker
from pydantic import BaseModel

from shared.broker import WORK, build_broker, durable_subscription
from shared.settings import CommonSettings
from shared.subjects import Service, dlq_subject


class Ping(BaseModel):
    n: int


async def _dlq_messages(settings: CommonSettings, service: Service) -> list[nats.aio.msg.Msg]:
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    sub = await js.subscribe(dlq_subject(service), ordered_consumer=True)
    got = []
    try:
        while True:
            got.append(await sub.next_msg(timeout=0.5))
    except (TimeoutError, nats.errors.TimeoutError):
        pass
    await nc.close()
    return got


def _broker_with(
    settings: CommonSettings, subject: str, durable: str, handler: object
) -> NatsBroker:
    broker = build_broker(settings, Service.SECURITY)
    broker.subscriber(subject, **durable_subscription(settings, WORK, durable))(handler)
    return broker


async def test_failed_handler_is_redelivered_then_succeeds(streams: CommonSettings) -> None:
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    attempts: list[int] = []
    done = asyncio.Event()

    async def handler(body: Ping) -> None:
        attempts.append(body.n)
        if len(attempts) < 3:
            raise RuntimeError("transient")
        done.set()

    broker = _broker_with(streams, subject, f"t-{uuid.uuid4().hex[:8]}", handler)
    async with broker:
        await broker.start()
        await broker.publish(Ping(n=7), subject, stream="DECKHANDS_WORK")
        await asyncio.wait_for(done.wait(), 10)
    assert attempts == [7, 7, 7]


async def test_garbage_goes_to_dead_letter_with_reason(streams: CommonSettings) -> None:
    task = uuid.uuid4().hex
    subject = f"deckhands.work.security.{task}"
    ok = asyncio.Event()

    async def handler(body: Ping) -> None:
        ok.set()

    broker = _broker_with(streams, subject, f"t-{uuid.uuid4().hex[:8]}", handler)
    async with broker:
        await broker.start()
        await broker.publish(b"\x00not json{", subject, stream="DECKHANDS_WORK")
        await broker.publish(Ping(n=1), subject, stream="DECKHANDS_WORK")
        await asyncio.wait_for(ok.wait(), 10)  # the service kept running after the garbage
        await asyncio.sleep(0.3)
    dead = [
        m
        for m in await _dlq_messages(streams, Service.SECURITY)
        if m.headers and m.headers.get("Deckhands-Dlq-Subject") == subject
    ]
    assert len(dead) == 1
    assert dead[0].data == b"\x00not json{"
    assert "validation" in dead[0].headers["Deckhands-Dlq-Reason"].lower()


async def test_always_failing_handler_is_dead_lettered_after_max_deliveries(
    streams: CommonSettings,
) -> None:
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    attempts = 0

    async def handler(body: Ping) -> None:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("boom forever")

    broker = _broker_with(streams, subject, f"t-{uuid.uuid4().hex[:8]}", handler)
    async with broker:
        await broker.start()
        await broker.publish(Ping(n=2), subject, stream="DECKHANDS_WORK")
        for _ in range(100):
            await asyncio.sleep(0.1)
            dead = [
                m
                for m in await _dlq_messages(streams, Service.SECURITY)
                if m.headers and m.headers.get("Deckhands-Dlq-Subject") == subject
            ]
            if dead:
                break
    assert attempts == streams.max_deliveries
    assert dead[0].headers["Deckhands-Dlq-Deliveries"] == str(streams.max_deliveries)
    assert "boom forever" in dead[0].headers["Deckhands-Dlq-Reason"]
