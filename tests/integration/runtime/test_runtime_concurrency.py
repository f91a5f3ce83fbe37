"""Many tasks at once, and two replicas racing for the same tasks: no hangs, no duplicates,
no leaks. Runs RuntimeService directly (no NATS), with real Docker and Redis."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import docker
import pytest
from prometheus_client import REGISTRY
from runtime_helpers import (  # type: ignore[import-not-found]
    eventually,
    make_settings,
    pool_containers,
    remove_pool_containers,
)

from services.runtime.service import RuntimeService
from services.runtime.settings import RuntimeSettings
from shared.events import EventBase
from shared.sandbox_protocol.session import answers
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker


async def _ignore(event: EventBase) -> None:
    return None


@pytest.fixture
def pool(docker_client: docker.DockerClient) -> Any:
    name = f"test-conc-{uuid.uuid4().hex[:6]}"
    yield name
    remove_pool_containers(docker_client, name)


def _settings(base: CommonSettings, image: str, pool: str) -> RuntimeSettings:
    return make_settings(
        base,
        image,
        pool,
        pool_min_idle=2,
        pool_max_total=60,
        pool_create_concurrency=4,
        sandbox_memory="128m",
    )


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_fifty_tasks_acquire_at_once(
    settings: CommonSettings, sandbox_image: str, pool: str, docker_client: docker.DockerClient
) -> None:
    service = RuntimeService(_settings(settings, sandbox_image, pool), _ignore)
    await service.start()
    try:
        tasks = [uuid.uuid4().hex for _ in range(50)]
        acquisitions = _metric("deckhands_runtime_pool_acquisitions_total")
        hits = _metric("deckhands_runtime_pool_hits_total")
        misses = _metric("deckhands_runtime_pool_misses_total")
        sandboxes = await asyncio.wait_for(
            asyncio.gather(*(service.tasks.get(t) for t in tasks)), timeout=150
        )
        ids = [s.container_id for s in sandboxes]
        assert len(set(ids)) == 50  # no sandbox handed to two tasks
        assert all(await asyncio.gather(*(answers(s.session, 2.0) for s in sandboxes)))
        assert _metric("deckhands_runtime_pool_acquisitions_total") - acquisitions == 50
        assert (
            _metric("deckhands_runtime_pool_hits_total")
            - hits
            + _metric("deckhands_runtime_pool_misses_total")
            - misses
        ) == 50
        assert _metric("deckhands_runtime_sandboxes", {"state": "busy"}) >= 50
        for task_id, sandbox in zip(tasks, sandboxes, strict=True):
            assert await service.bindings.get(task_id) == sandbox.container_id
        # Asking again gives each task the same sandbox.
        again = await asyncio.gather(*(service.tasks.get(t) for t in tasks))
        assert [s.container_id for s in again] == ids

        await asyncio.gather(*(service.tasks.release(t) for t in tasks))
        assert not {c.id for c in pool_containers(docker_client, pool)} & set(ids)
        assert service.pool.busy == 0
    finally:
        await service.stop()
    assert pool_containers(docker_client, pool) == []  # nothing leaked
    assert docker_client.volumes.list(filters={"label": f"deckhands.pool={pool}"}) == []


async def test_two_replicas_racing_for_the_same_tasks_agree(
    settings: CommonSettings, sandbox_image: str, pool: str, docker_client: docker.DockerClient
) -> None:
    config = _settings(settings, sandbox_image, pool)
    first, second = RuntimeService(config, _ignore), RuntimeService(config, _ignore)
    await first.start()
    await second.start()
    try:
        tasks = [uuid.uuid4().hex for _ in range(8)]
        got_first, got_second = await asyncio.wait_for(
            asyncio.gather(
                asyncio.gather(*(first.tasks.get(t) for t in tasks)),
                asyncio.gather(*(second.tasks.get(t) for t in tasks)),
            ),
            timeout=120,
        )
        for a, b in zip(got_first, got_second, strict=True):
            assert a.container_id == b.container_id  # one sandbox per task, whoever won
        assert len({s.container_id for s in got_first}) == 8
        # Both replicas can drive the same sandbox (each is attached to it).
        one = await got_first[0].session.bash({"command": "echo $$", "timeout_s": 10}, 10 + 5)
        two = await got_second[0].session.bash({"command": "echo $$", "timeout_s": 10}, 10 + 5)
        assert one["output"] == two["output"]
        await asyncio.gather(*(first.tasks.release(t) for t in tasks))
    finally:
        await first.stop()
        await second.stop()
    assert pool_containers(docker_client, pool) == []
    assert docker_client.volumes.list(filters={"label": f"deckhands.pool={pool}"}) == []


async def test_tasks_queued_behind_full_seats_find_warm_sandboxes(
    settings: CommonSettings, sandbox_image: str, pool: str, docker_client: docker.DockerClient
) -> None:
    """Every seat taken and tasks queued: the pool warms sandboxes for them (beyond what past
    acquisitions alone would keep), so the next task seated does not wait for a start."""
    config = make_settings(
        settings, sandbox_image, pool, pool_min_idle=0, pool_max_idle=3, max_sandboxes=1
    )
    service = RuntimeService(config, _ignore)
    await service.start()
    try:
        first = uuid.uuid4().hex
        assert (await service.seats.admit(first, tenant_id="team")).seated
        await service.tasks.get(first)  # holds the only seat
        queued = [uuid.uuid4().hex for _ in range(3)]
        for task in queued:
            assert not (await service.seats.admit(task, tenant_id="team")).seated
        await service.seating.admit_queued()
        assert service.pool.target_idle() == 3  # one acquisition alone would keep 1

        async def warmed() -> bool:
            return service.pool.idle == 3

        await eventually(warmed, timeout=60)
        hits = _metric("deckhands_runtime_pool_hits_total")
        await service.tasks.release(first)
        await service.seats.release(first)
        await service.seating.admit_queued()
        assert await service.seats.position(queued[0]) is None  # seated
        await service.tasks.get(queued[0])
        assert _metric("deckhands_runtime_pool_hits_total") == hits + 1  # a warm one
        await service.tasks.release(queued[0])
    finally:
        await service.stop()
    assert pool_containers(docker_client, pool) == []
