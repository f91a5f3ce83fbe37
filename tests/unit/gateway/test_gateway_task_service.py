"""TaskService on real Redis and nats-server: what a failure at each step leaves behind, and
that a retry with the same Idempotency-Key finishes the job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from faststream.nats import NatsBroker
from redis.asyncio import Redis

from services.gateway.errors import EgressForbidden, PublishFailed, TaskNotFound
from services.gateway.main import build_gateway_broker
from services.gateway.settings import GatewaySettings
from services.gateway.tasks.creations import TaskViews
from services.gateway.tasks.service import TaskService
from services.gateway.tasks.values import NewTask, TaskDefaults, valid_task_id
from services.runtime.settings import RuntimeSettings
from shared.events import AgentState, EventBase, TaskCreatedObservation, new_id
from shared.state_store import TaskStateStore
from shared.streams import ensure_streams
from shared.subjects import WORK_STREAM, Service, work_subject
from shared.task_creation import derived_event_id, state_from_created
from tools.procs import free_port, start_nats

TENANT = "unit-tests"


def service(redis: Redis, broker: NatsBroker) -> TaskService:
    return TaskService(TaskViews(redis), broker, defaults=TaskDefaults(), idempotency_ttl_s=60)


def test_task_ids_and_derived_event_ids() -> None:
    assert valid_task_id(new_id())
    for bad in ("", "a.b", "a*", "a>", "a b", "x" * 129, "ü"):
        assert not valid_task_id(bad)
    assert derived_event_id("t", "initial") == derived_event_id("t", "initial")
    assert derived_event_id("t", "initial") != derived_event_id("u", "initial")
    assert len(derived_event_id("t")) == 32


async def test_an_id_that_cannot_be_a_task_is_not_found(redis: Redis, broker: NatsBroker) -> None:
    with pytest.raises(TaskNotFound, match="not found"):
        await service(redis, broker).get("a.b.>", TENANT)


@pytest.fixture
async def nats_without_streams(
    tmp_path: Path, unit_settings: GatewaySettings
) -> AsyncIterator[GatewaySettings]:
    """A JetStream server on which no stream is declared yet: every publish fails."""
    port = free_port()
    proc = start_nats(port, tmp_path / "store", tmp_path / "nats.log")
    yield unit_settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{port}"})
    proc.terminate()
    proc.wait(10)


async def queued_for_controller(settings: GatewaySettings, task_id: str) -> int:
    import nats

    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().stream_info(
            WORK_STREAM, subjects_filter=work_subject(Service.CONTROLLER, task_id)
        )
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def test_a_lost_publish_without_a_key_fails_the_task_not_strands_it(
    redis: Redis, nats_without_streams: GatewaySettings
) -> None:
    broker = build_gateway_broker(nats_without_streams)
    await broker.start()
    try:
        tasks = service(redis, broker)
        views = TaskViews(redis)
        text = f"task {new_id()}"
        with pytest.raises(PublishFailed, match="nothing was accepted") as failure:
            await tasks.create(NewTask(text), TENANT)
        assert failure.value.status_code == 503
        # The one task it accepted shows as ERROR, not LOADING forever: no retry can reach it.
        # Its State was never written: only the controller writes States.
        ids = [
            k.decode().rsplit(":", 1)[1] async for k in redis.scan_iter("deckhands:task-creation:*")
        ]
        states = [await views.load(task_id) for task_id in ids]
        [made] = [s for s in states if s is not None and s.task == text]
        assert not await views.exists(made.task_id)
        assert made.agent_state is AgentState.ERROR
        assert made.reason == "the task could not be queued for the controller"
    finally:
        await broker.stop()


async def test_a_late_acknowledgement_is_no_failure_when_the_controller_has_the_task(
    redis: Redis, broker: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JetStream stored the creation request but its acknowledgement came after the deadline
    # (seen with 200 tasks posted at once): the controller made the task first.
    tasks = service(redis, broker)
    store = TaskStateStore(redis)

    async def stored_but_acknowledged_late(event: EventBase) -> None:
        assert isinstance(event, TaskCreatedObservation) and event.task is not None
        made = state_from_created(event).model_copy(update={"agent_state": AgentState.RUNNING})
        assert await store.create(made)
        raise PublishFailed("could not queue the request (TimeoutError: nats: timeout)")

    monkeypatch.setattr(tasks, "_publish", stored_but_acknowledged_late)
    created = await tasks.create(NewTask(f"task {new_id()}"), TENANT)
    kept = await store.load(created.state.task_id)
    assert kept is not None and kept.agent_state is AgentState.RUNNING  # accepted, not failed


async def test_a_lost_publish_with_a_key_is_finished_by_the_retry(
    redis: Redis, nats_without_streams: GatewaySettings
) -> None:
    key = new_id()
    broker = build_gateway_broker(nats_without_streams)
    await broker.start()
    try:
        tasks = service(redis, broker)
        with pytest.raises(PublishFailed):
            await tasks.create(NewTask("build it", max_iterations=4), TENANT, key)

        await ensure_streams(nats_without_streams)  # NATS is back to normal
        created = await tasks.create(NewTask("build it", max_iterations=4), TENANT, key)
        assert created.replayed
        assert created.state.agent_state is AgentState.LOADING
        assert created.state.max_iterations == 4
        assert await queued_for_controller(nats_without_streams, created.state.task_id) == 1

        # And again: the request's id is derived from the task, so it is stored once.
        again = await tasks.create(NewTask("build it", max_iterations=4), TENANT, key)
        assert again.state.task_id == created.state.task_id
        assert await queued_for_controller(nats_without_streams, created.state.task_id) == 1
    finally:
        await broker.stop()


async def test_network_egress_is_refused_when_the_server_disallows_it(
    redis: Redis, broker: NatsBroker
) -> None:
    # The default: egress is off unless the operator allows it.
    assert GatewaySettings().allow_network_egress is False
    assert RuntimeSettings().allow_network_egress is False
    strict = TaskService(TaskViews(redis), broker, defaults=TaskDefaults(), idempotency_ttl_s=60)
    with pytest.raises(EgressForbidden, match="DECKHANDS_ALLOW_NETWORK_EGRESS") as refused:
        await strict.create(NewTask("fetch a page", network_egress=True), TENANT)
    assert refused.value.status_code == 403
    created = await strict.create(NewTask("offline work"), TENANT)  # no egress asked: fine
    assert not created.state.network_egress
