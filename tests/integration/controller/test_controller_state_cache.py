"""The controller's cache of the States it saved never overrides Redis: a State another writer
saved since is read and used, without a turn decided on the older one first."""

from __future__ import annotations

from controller_helpers import new_task, user_message  # type: ignore[import-not-found]
from redis.asyncio import Redis

from services.controller.handlers import ControllerHandlers
from services.controller.metrics import CONFLICTS
from services.controller.state_cache import StateCache
from shared.broker import ServiceBroker
from shared.state import TaskState
from shared.state_store import TaskStateStore


async def test_a_state_written_by_another_replica_wins_over_the_cached_one(
    broker: ServiceBroker, redis: Redis
) -> None:
    store = TaskStateStore(redis)
    cache = StateCache(8)
    handlers = ControllerHandlers(broker, store, cas_attempts=5, cache=cache)
    task_id = await new_task(store, "list files", 5)

    first = user_message(task_id, "list files")
    await handlers.on_input(first)
    cached = cache.get(task_id)
    assert cached is not None and cached.has_processed(first.id)
    assert cached == await store.load(task_id)

    # Another replica applies an input meanwhile: the cached State is now one version behind.
    other = ControllerHandlers(broker, store, cas_attempts=5)
    between = user_message(task_id, "and the hidden ones")
    await other.on_input(between)

    conflicts = CONFLICTS._value.get()
    last = user_message(task_id, "sorted by size")
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
    task_id = await new_task(store, "x", 1)
    held = await store.load(task_id)
    assert held is not None
    assert await store.fresh(held) is held  # the saved version: not read again
    newer = await store.save(held.model_copy(update={"task": "y"}))
    again = await store.fresh(held)
    assert again == newer and again is not held
    await store.delete(task_id)
    assert await store.fresh(newer) is None
