"""The warm pool against real containers: dead sandboxes are never handed out, the pool waits
at its maximum instead of failing, and lost busy sandboxes stop counting."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import docker
import pytest
from runtime_helpers import eventually, make_settings, remove_pool_containers  # type: ignore[import-not-found]

from services.runtime.containers import DockerSandboxes
from services.runtime.errors import PoolExhausted
from services.runtime.pool import WarmPool
from services.runtime.sandbox_starts import StartTerms
from shared.sandbox_protocol.session import answers
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker


@pytest.fixture
def pool_name(docker_client: docker.DockerClient) -> Any:
    name = f"test-pool-{uuid.uuid4().hex[:6]}"
    yield name
    remove_pool_containers(docker_client, name)


# A task seated amid a burst: it leaves the pool's last warm sandbox to whoever comes next.
_LEAVES_ONE = StartTerms(tenant="flood", leave_idle=1)


def _idle(pool: WarmPool, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pool.idle == count

    return check


def _starting(pool: WarmPool, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pool.creating == count

    return check


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
    await eventually(_idle(warm, 1))
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
        await eventually(_idle(pool, 1))
        warm_one = pool._idle[0].container_id
        # A backlog's head leaves it and gets a sandbox started for it...
        started = await pool.acquire(terms=_LEAVES_ONE)
        assert started.container_id != warm_one and pool.idle == 1
        # ...at the pool's maximum nothing else can start: then it takes the warm one.
        at_max = await pool.acquire(terms=_LEAVES_ONE)
        assert at_max.container_id == warm_one
        for sandbox in (started, at_max):
            await pool.discard(sandbox.container_id, "test")
        await eventually(_idle(pool, 1))
        # A task that went ahead of the backlog takes the warm one at once.
        warm_two = pool._idle[0].container_id
        ahead = await pool.acquire()
        assert ahead.container_id == warm_two
        await pool.discard(ahead.container_id, "test")
    finally:
        await pool.stop()


async def test_the_pool_refills_while_tasks_start_sandboxes_of_their_own(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    """A flood's tasks starting their own sandboxes do not keep the pool from refilling: the
    next tenant's task finds a warm one instead of waiting for a start among the flood's."""
    pool = await _pool(
        settings,
        sandbox_image,
        pool_name,
        pool_min_idle=1,
        pool_max_idle=1,
        pool_max_total=6,
        pool_create_concurrency=1,
    )
    try:
        await eventually(_idle(pool, 1))
        # Three tasks of a burst leave the warm one and start their own...
        callers = [asyncio.create_task(pool.acquire(terms=_LEAVES_ONE)) for _ in range(3)]

        await eventually(_starting(pool, 3))
        # ...another tenant's task takes the warm one meanwhile: the pool starts the next now.
        taken = await pool.acquire()
        assert not all(c.done() for c in callers)  # the burst's starts still run
        pool._refill()
        assert pool._refilling == 1
        started = await asyncio.gather(*callers)
        await eventually(_idle(pool, 1))
        for sandbox in (taken, *started):
            await pool.discard(sandbox.container_id, "test")
    finally:
        await pool.stop()


async def test_a_tenant_arriving_during_a_flood_of_starts_waits_for_one_or_two_only(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> None:
    """Starts go through fair slots: the engine starts as many a second one at a time as many
    at once, so a tenant's start that comes during another's five is not the sixth to end."""
    pool = await _pool(
        settings,
        sandbox_image,
        pool_name,
        pool_min_idle=0,
        pool_max_idle=0,
        pool_max_total=10,
        sandbox_start_concurrency=1,
    )
    ended: list[str] = []

    async def start(tenant: str) -> str:
        sandbox = await pool.acquire(terms=StartTerms(tenant=tenant))
        ended.append(tenant)
        return sandbox.container_id

    try:
        flood = [asyncio.create_task(start("flood")) for _ in range(5)]

        await eventually(_starting(pool, 5))
        made = await asyncio.gather(*flood, start("quiet"))
        assert ended.index("quiet") <= 2, ended  # after the one under way and the next
        for container_id in made:
            await pool.discard(container_id, "test")
    finally:
        await pool.stop()
