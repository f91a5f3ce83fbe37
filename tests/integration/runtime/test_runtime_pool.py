"""The warm pool against real containers: dead sandboxes are never handed out, the pool waits
at its maximum instead of failing, lost busy sandboxes stop counting, and its last idle ones
are kept for whoever the caller says may take them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest
from runtime_helpers import eventually, make_settings, remove_pool_containers  # type: ignore[import-not-found]

from services.runtime.containers import DockerSandboxes
from services.runtime.pool import PoolExhausted, WarmPool
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
    assert await sandbox.client.ping()
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


async def test_the_last_idle_sandboxes_are_kept_for_the_reserve(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    pool = await _pool(
        settings,
        sandbox_image,
        pool_name,
        pool_min_idle=2,
        pool_max_idle=2,
        pool_fair_reserve=2,
        pool_max_total=4,
        pool_scale_window_s=0.01,  # no scaling on the acquisitions below
    )
    try:

        async def two_idle() -> bool:
            return pool.idle == 2

        await eventually(two_idle, timeout=60)
        warm = {s.container_id for s in pool._idle}
        # A flood's task starts its own; the warm ones stay for a quieter tenant's.
        own = await pool.acquire(from_reserve=False)
        assert own.container_id not in warm and pool.idle == 2
        quiet = await pool.acquire()
        assert quiet.container_id in warm
        await eventually(two_idle, timeout=60)
        # At the pool's maximum, nothing is started: the reserve goes to whoever asks.
        assert pool.total == 4
        kept = {s.container_id for s in pool._idle}
        last = await asyncio.wait_for(pool.acquire(from_reserve=False), 20)
        assert last.container_id in kept and pool.idle == 1
        for sandbox in (own, quiet, last):
            await pool.discard(sandbox.container_id, "test")
    finally:
        await pool.stop()
