"""How the services' pull consumers fetch (shared.broker.durable_subscription: up to 32 messages
a fetch), on the real nats-server: a fetch of many returns a lone message at once and what is
there without waiting for the rest, and takes a burst in a few round trips. An older pairing of
nats-py and nats-server held a lone message for the rest of the batch, up to the pull timeout;
these tests hold the versions pyproject.toml asks for to the behaviour the consumers rely on."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
from faststream.nats import NatsBroker
from pydantic import BaseModel

from shared.broker import WORK, build_broker, durable_subscription
from shared.settings import CommonSettings
from shared.subjects import Service


class Ping(BaseModel):
    n: int


async def _pull(settings: CommonSettings, subject: str) -> tuple[nats.NATS, object]:
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(subject, durable=f"f-{uuid.uuid4().hex[:8]}", stream=WORK.name)
    return nc, sub


async def _publish(nc: nats.NATS, subject: str, numbers: range) -> None:
    js = nc.jetstream()
    for n in numbers:
        await js.publish(subject, Ping(n=n).model_dump_json().encode())


async def _fetch(sub: object) -> list[int]:
    """One fetch of up to 32, each message acknowledged; their numbers."""
    got = await sub.fetch(32, timeout=1.0)  # type: ignore[attr-defined]
    for message in got:
        await message.ack()
    return [Ping.model_validate_json(m.data).n for m in got]


async def test_a_fetch_of_many_returns_a_lone_message_at_once(streams: CommonSettings) -> None:
    """The fetch lingers on the server until the message comes, then returns it alone."""
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    nc, sub = await _pull(streams, subject)
    try:
        for n in range(3):
            fetching = asyncio.create_task(_fetch(sub))
            await asyncio.sleep(0.1)  # the fetch is lingering on the server
            published = time.monotonic()
            await _publish(nc, subject, range(n, n + 1))
            got = await fetching
            took = time.monotonic() - published
            assert got == [n]
            assert took < 0.25, f"a lone message came {took:.2f} s after it was published"
    finally:
        await nc.close()


async def test_a_fetch_of_many_returns_what_is_there_without_waiting_for_more(
    streams: CommonSettings,
) -> None:
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    nc, sub = await _pull(streams, subject)
    try:
        for round_ in range(3):
            await _publish(nc, subject, range(3))
            began = time.monotonic()
            got = await _fetch(sub)
            took = time.monotonic() - began
            assert len(got) == 3, round_
            assert took < 0.25, f"3 ready messages of 32 asked came after {took:.2f} s"
    finally:
        await nc.close()


async def test_a_fetch_of_many_takes_what_is_there_in_one_go(streams: CommonSettings) -> None:
    """100 messages already in the stream: each fetch of 32 brings 32 (one at a time, a burst
    of 300 step requests cost the reasoner 300 round trips on a busy event loop)."""
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    nc, sub = await _pull(streams, subject)
    try:
        await _publish(nc, subject, range(100))
        sizes = []
        seen: list[int] = []
        while len(seen) < 100:
            got = await _fetch(sub)
            sizes.append(len(got))
            seen += got
        assert seen == list(range(100))
        assert len(sizes) <= 5, f"100 ready messages took {len(sizes)} fetches: {sizes}"
    finally:
        await nc.close()


async def test_a_service_consumer_takes_a_burst_and_a_lone_message_promptly(
    streams: CommonSettings,
) -> None:
    """Through FastStream, as every service consumes: 300 messages at once, then one alone."""
    subject = f"deckhands.work.security.{uuid.uuid4().hex}"
    handled: dict[int, float] = {}
    lone = asyncio.Event()

    async def handler(body: Ping) -> None:
        handled[body.n] = time.monotonic()
        if body.n == -1:
            lone.set()

    broker: NatsBroker = build_broker(streams, Service.SECURITY)
    durable = f"f-{uuid.uuid4().hex[:8]}"
    broker.subscriber(subject, **durable_subscription(streams, WORK, durable, workers=64))(handler)
    async with broker:
        await broker.start()
        began = time.monotonic()
        # Acknowledged as the services' publishes are (FastStream's default wait is 0.5 s,
        # short for 300 at once on a busy machine).
        await asyncio.gather(
            *(broker.publish(Ping(n=n), subject, stream=WORK.name, timeout=10) for n in range(300))
        )
        for _ in range(200):
            if len(handled) == 300:
                break
            await asyncio.sleep(0.05)
        assert len(handled) == 300
        burst_s = max(handled.values()) - began
        await asyncio.sleep(0.5)  # quiet: the consumer's fetch lingers
        published = time.monotonic()
        await broker.publish(Ping(n=-1), subject, stream=WORK.name, timeout=10)
        await asyncio.wait_for(lone.wait(), 5)
        lone_s = handled[-1] - published
    assert burst_s < 5, f"300 messages took {burst_s:.1f} s"
    assert lone_s < 0.25, f"a lone message waited {lone_s:.2f} s"
