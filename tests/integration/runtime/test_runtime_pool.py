"""The warm pool against real containers: dead sandboxes are never handed out, the pool waits
at its maximum instead of failing, and lost busy sandboxes stop counting."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest
from runtime_helpers import eventually, make_settings, remove_pool_containers  # type: ignore[import-not-found]

from services.runtime.containers import DockerSandboxes
from services.runtime.errors import PoolExhausted
from services.runtime.pool import WarmPool
from shared.sandbox_protocol.session import answers
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker


@pytest.fixture
def pool_name(docker_client: docker.DockerClient) -> Any:
    name = f"test-pool-{uuid.uuid4().hex[:6]}"
    yield name
    remove_pool_containers(docker_client, name)


async def _pool(settings: CommonSettings, image: str, name: str, **kw: Any) -> WarmPool:
    config = make_settings(settings, image, name, pool_health_interval_s=1.0, **kw)
    pool = WarmPool(config, DockerSandboxes(config, f"r-{uuid.uuid4().hex[:4]}"))
    pool.start()
    return pool


@pytest.fixture
async def warm(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> AsyncIterator[WarmPool]:
    pool = await _pool(settings, sandbox_image, pool_name, pool_min_idle=1, pool_max_idle=1)
    yield pool
    await pool.stop()


async def test_a_dead_idle_sandbox_is_never_handed_out(
    warm: WarmPool, docker_client: docker.DockerClient
) -> None:
    async def one_idle() -> bool:
        return warm.idle == 1

    await eventually(one_idle)
    doomed = warm._idle[0]
    docker_client.api.kill(doomed.container_id)
    sandbox = await warm.acquire()
    assert sandbox.container_id != doomed.container_id
    assert await answers(sandbox.session, 2.0)
    await warm.discard(sandbox.container_id, "test")


async def test_busy_sandbox_removed_elsewhere_stops_counting(
    warm: WarmPool, docker_client: docker.DockerClient
) -> None:
    sandbox = await warm.acquire()
    assert warm.busy == 1
    docker_client.api.remove_container(sandbox.container_id, force=True, v=True)

    async def forgotten() -> bool:
        return warm.busy == 0

    await eventually(forgotten, timeout=10)


async def test_acquisition_waits_at_max_total_then_proceeds(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    pool = await _pool(
        settings,
        sandbox_image,
        pool_name,
        pool_min_idle=0,
        pool_max_total=1,
        acquire_timeout_s=20.0,
    )
    try:
        first = await pool.acquire()
        waiting = asyncio.create_task(pool.acquire())
        await asyncio.sleep(1.0)
        assert not waiting.done()  # at the maximum: it waits, it does not fail
        await pool.discard(first.container_id, "test")
        second = await asyncio.wait_for(waiting, 20)
        assert second.container_id != first.container_id
        await pool.discard(second.container_id, "test")
    finally:
        await pool.stop()


async def test_acquisition_gives_up_after_its_timeout(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    pool = await _pool(
        settings, sandbox_image, pool_name, pool_min_idle=0, pool_max_total=1, acquire_timeout_s=1.0
    )
    try:
        first = await pool.acquire()
        with pytest.raises(PoolExhausted):
            await pool.acquire()
        await pool.discard(first.container_id, "test")
    finally:
        await pool.stop()


async def test_the_head_of_a_backlog_leaves_the_last_warm_sandboxes(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    pool = await _pool(
        settings, sandbox_image, pool_name, pool_min_idle=1, pool_max_idle=1, pool_max_total=2
    )
    try:

        async def one_idle() -> bool:
            return pool.idle == 1

        await eventually(one_idle)
        warm_one = pool._idle[0].container_id
        # A backlog's head leaves it and gets a sandbox started for it...
        started = await pool.acquire(leave_idle=1)
        assert started.container_id != warm_one and pool.idle == 1
        # ...at the pool's maximum nothing else can start: then it takes the warm one.
        at_max = await pool.acquire(leave_idle=1)
        assert at_max.container_id == warm_one
        for sandbox in (started, at_max):
            await pool.discard(sandbox.container_id, "test")
        await eventually(one_idle)
        # A task that went ahead of the backlog takes the warm one at once.
        warm_two = pool._idle[0].container_id
        ahead = await pool.acquire()
        assert ahead.container_id == warm_two
        await pool.discard(ahead.container_id, "test")
    finally:
        await pool.stop()
