"""The controller's cache of the States it saved never overrides Redis: a State another writer
saved since is read and used, without a turn decided on the older one first."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.controller.handlers import ControllerHandlers
from services.controller.metrics import CONFLICTS
from services.controller.state_cache import StateCache
from shared.broker import ServiceBroker, build_broker
from shared.events import EventSource, MessageAction
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import Service


@pytest.fixture
async def broker(isolated_settings: CommonSettings) -> AsyncIterator[ServiceBroker]:
    broker = build_broker(isolated_settings, Service.CONTROLLER)
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.stop()


def _message(task_id: str, text: str) -> MessageAction:
    return MessageAction(task_id=task_id, source=EventSource.USER, content=text)


async def test_a_state_written_by_another_replica_wins_over_the_cached_one(
    broker: ServiceBroker, redis: Redis
) -> None:
    store = TaskStateStore(redis)
    cache = StateCache(8)
    handlers = ControllerHandlers(broker, store, cas_attempts=5, cache=cache)
    task_id = uuid.uuid4().hex
    assert await store.create(TaskState(task_id=task_id, task="list files", max_iterations=5))

    first = _message(task_id, "list files")
    await handlers.on_input(first)
    cached = cache.get(task_id)
    assert cached is not None and cached.has_processed(first.id)
    assert cached == await store.load(task_id)

    # Another replica applies an input meanwhile: the cached State is now one version behind.
    other = ControllerHandlers(broker, store, cas_attempts=5)
    between = _message(task_id, "and the hidden ones")
    await other.on_input(between)

    conflicts = CONFLICTS._value.get()
    last = _message(task_id, "sorted by size")
    await handlers.on_input(last)
    assert CONFLICTS._value.get() == conflicts  # the newer State was read before the turn

    saved = await store.load(task_id)
    assert saved is not None
    assert all(saved.has_processed(m.id) for m in (first, between, last))
    assert saved.version == cached.version + 2
    assert cache.get(task_id) == saved


def test_the_cache_keeps_the_most_recently_used_states() -> None:
    cache = StateCache(2)
    states = [TaskState(task_id=f"t{i}", task="x", max_iterations=1) for i in range(3)]
    cache.put(states[0])
    cache.put(states[1])
    assert cache.get("t0") == states[0]  # t0 is now the most recently used
    cache.put(states[2])
    assert cache.get("t1") is None and cache.get("t0") == states[0] and len(cache) == 2
    assert StateCache(0).get("t0") is None


async def test_a_state_is_read_again_only_when_another_writer_saved_it(redis: Redis) -> None:
    store = TaskStateStore(redis)
    task_id = uuid.uuid4().hex
    assert await store.create(TaskState(task_id=task_id, task="x", max_iterations=1))
    held = await store.load(task_id)
    assert held is not None
    assert await store.fresh(held) is held  # the saved version: not read again
    newer = await store.save(held.model_copy(update={"task": "y"}))
    again = await store.fresh(held)
    assert again == newer and again is not held
    await store.delete(task_id)
    assert await store.fresh(newer) is None
