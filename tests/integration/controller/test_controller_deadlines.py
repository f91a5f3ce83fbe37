"""No silent hang, on real NATS and Redis: a step request nobody answers is asked for again
after its deadline, then the task ends in ERROR naming the reasoner; a work order that a service
dead-letters ends its task in ERROR with the reason."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from faststream import FastStream
from redis.asyncio import Redis

from services.controller.main import build_app as build_controller
from services.controller.settings import ControllerSettings
from shared.broker import WORK, build_broker, durable_subscription
from shared.commands import StepRequest
from shared.delivery import PermanentError
from shared.events import AgentState, MessageAction
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import WORK_STREAM, Service, work_subject


@pytest.fixture(scope="module")
async def controller(isolated_settings: CommonSettings) -> AsyncIterator[CommonSettings]:
    common = isolated_settings.model_dump(include=set(CommonSettings.model_fields))
    app = build_controller(
        ControllerSettings(
            **common, agent_answer_deadline_s=1.0, deadline_poll_s=0.2, answer_retries=2
        )
    )
    await app.start()
    yield isolated_settings
    await app.stop()


async def _state_becomes(
    store: TaskStateStore, task_id: str, state: AgentState, within_s: float
) -> TaskState:
    loaded = None
    for _ in range(int(within_s / 0.05)):
        loaded = await store.load(task_id)
        if loaded is not None and loaded.agent_state is state:
            return loaded
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {state}: {loaded}")


async def _start_task(task_id: str, store: TaskStateStore, js: Any) -> str:
    assert await store.create(TaskState(task_id=task_id, task="list files", max_iterations=5))
    hello = MessageAction(task_id=task_id, source="USER", content="list files")
    await js.publish(
        work_subject(Service.CONTROLLER, task_id),
        hello.model_dump_json().encode(),
        headers={"Nats-Msg-Id": hello.id},
    )
    return task_id


async def test_a_dropped_step_is_asked_again_then_the_task_ends_in_error(
    controller: CommonSettings,
) -> None:
    redis = Redis.from_url(controller.redis_url)
    nc = await nats.connect(controller.nats_url)
    js = nc.jetstream()
    try:
        store = TaskStateStore(redis)
        task_id = await _start_task(uuid.uuid4().hex, store, js)
        sub = await js.pull_subscribe(
            work_subject(Service.REASONER, task_id), durable=None, stream=WORK_STREAM
        )
        steps = []
        for _ in range(3):  # the first request and two more; each one is dropped
            msg = (await sub.fetch(1, timeout=10))[0]
            await msg.ack()
            steps.append(StepRequest.model_validate(json.loads(msg.data)))
        assert len({s.id for s in steps}) == 3
        assert {s.iteration for s in steps} == {1}
        ended = await _state_becomes(store, task_id, AgentState.ERROR, within_s=10)
        assert "no answer from the reasoner" in ended.reason
        assert "after 3 requests" in ended.reason
        assert ended.awaiting_deadline is None
        assert await redis.zscore(store.deadlines_key, task_id) is None
    finally:
        await nc.close()
        await redis.aclose()


async def test_a_dead_lettered_step_ends_the_task_in_error_with_the_reason(
    controller: CommonSettings,
) -> None:
    # A reasoner stand-in whose every step fails for good: the real DeliveryGuard dead-letters
    # the step and tells the task.
    broker = build_broker(controller, Service.REASONER)
    task_id = uuid.uuid4().hex

    async def refuse(step: StepRequest) -> None:
        raise PermanentError("storage refused the history query")

    broker.subscriber(
        work_subject(Service.REASONER, task_id),
        **durable_subscription(controller, WORK, f"reasoner-refuses-{task_id}"),
    )(refuse)
    app = FastStream(broker)
    await app.start()
    redis = Redis.from_url(controller.redis_url)
    nc = await nats.connect(controller.nats_url)
    try:
        store = TaskStateStore(redis)
        await _start_task(task_id, store, nc.jetstream())
        ended = await _state_becomes(store, task_id, AgentState.ERROR, within_s=10)
        assert "gave up" in ended.reason
        assert "storage refused the history query" in ended.reason
    finally:
        await app.stop()
        await nc.close()
        await redis.aclose()
