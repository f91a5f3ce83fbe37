"""The dead-letter tool against the real nats-server: a work order a service gave up on is
listed with its reason and task, replayed to its subject once the cause is fixed, or dropped."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats
from pydantic import BaseModel

from shared.broker import WORK, build_broker, durable_subscription
from shared.delivery import PermanentError
from shared.settings import CommonSettings
from shared.subjects import WORK_STREAM, Service
from tools.dead_letters import ReplayRefused, drop, list_dead_letters, main, replay


class Order(BaseModel):
    n: int


async def test_list_replay_and_drop(streams: CommonSettings, capsys: object) -> None:
    task_id = uuid.uuid4().hex
    subject = f"deckhands.work.security.{task_id}"
    fixed = asyncio.Event()
    handled: list[int] = []
    done = asyncio.Event()

    async def handler(body: Order) -> None:
        if not fixed.is_set():
            raise PermanentError(f"order {body.n} refused")
        handled.append(body.n)
        done.set()

    broker = build_broker(streams, Service.SECURITY)
    broker.subscriber(
        subject, **durable_subscription(streams, WORK, f"dlq-tool-{uuid.uuid4().hex[:8]}")
    )(handler)
    nc = await nats.connect(streams.nats_url)
    js = nc.jetstream()
    try:
        async with broker:
            await broker.start()
            for n in (1, 2):
                await broker.publish(Order(n=n), subject, stream=WORK_STREAM)
            letters: list[Any] = []
            for _ in range(100):
                letters = await list_dead_letters(js, service="security", task_id=task_id)
                if len(letters) == 2:
                    break
                await asyncio.sleep(0.1)
            assert [letter.reason for letter in letters] == [
                "PermanentError: order 1 refused",
                "PermanentError: order 2 refused",
            ]
            assert all(
                letter.subject == subject and letter.stream == WORK_STREAM for letter in letters
            )
            assert await list_dead_letters(js, service="runtime", task_id=task_id) == []

            fixed.set()
            await replay(js, letters[0].seq)
            await asyncio.wait_for(done.wait(), 10)
            assert handled == [1]
            await drop(js, letters[1].seq)
            assert await list_dead_letters(js, task_id=task_id) == []
            try:
                await replay(js, letters[1].seq)
            except ReplayRefused as exc:
                assert "no dead letter" in str(exc)
            else:
                raise AssertionError("a dropped dead letter was replayed")
    finally:
        await nc.close()
    # The command line lists with the same filters.
    listed = await asyncio.to_thread(main, ["--nats", streams.nats_url, "list", "--task", task_id])
    assert listed == 0
    assert "0 dead letter(s)" in capsys.readouterr().out  # type: ignore[attr-defined]
