"""An ended task's workspace on the real Docker engine (services/runtime/retention.py): its
sandbox is kept paused with its files, read and written while paused, found again (sessions
and all) when a message resumes the task, and removed once its retention is over (then:
gone)."""

from __future__ import annotations

import asyncio
import io
import time
import uuid

import docker
import pytest
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import (  # type: ignore[import-not-found]
    cmd,
    make_settings,
    remove_pool_containers,
)

from services.runtime.service import RuntimeService
from shared.blobs import ensure_blob_bucket
from shared.commands import ExecuteAction, ReleaseSandbox
from shared.events import AgentState, CmdOutputObservation, EventBase
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.workspace import (
    WorkspaceOp,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
    transfer_name,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


async def _ignore(event: EventBase) -> None:
    return None


async def test_an_ended_task_keeps_its_files_until_resumed_or_its_retention_ends(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
    js: JetStreamContext,
) -> None:
    pool = f"test-retain-{uuid.uuid4().hex[:6]}"
    config = make_settings(
        isolated_settings,
        sandbox_image,
        pool,
        workspace_retention_s=3.0,
        pool_health_interval_s=600.0,  # the test sweeps itself
    )
    service = RuntimeService(config, _ignore)
    await service.start()
    await ensure_blob_bucket(js, 1 << 30)
    transfers = WorkspaceTransfers(lambda: js)
    service.workspace.transfers = transfers
    store = TaskStateStore(redis)
    task_id = uuid.uuid4().hex

    async def run(command: str) -> CmdOutputObservation:
        observation = await service.execution.run(
            ExecuteAction(task_id=task_id, action=cmd(task_id, command)), last_try=True
        )
        assert isinstance(observation, CmdOutputObservation), observation
        return observation

    async def state(agent_state: AgentState) -> None:
        current = await store.load(task_id)
        assert current is not None
        await store.save(current.model_copy(update={"agent_state": agent_state}))

    async def read(path: str) -> tuple[WorkspaceStatus, bytes]:
        reply = await service.workspace.handle(
            WorkspaceRequest(op=WorkspaceOp.GET_FILE, task_id=task_id, path=path, max_bytes=4096)
        )
        if reply.object is None:
            return reply.status, reply.detail.encode()
        out = io.BytesIO()
        await transfers.get(reply.object, out)
        await transfers.delete(reply.object)
        return reply.status, out.getvalue()

    try:
        assert await store.create(
            TaskState(task_id=task_id, task="t", max_iterations=5, agent_state=AgentState.RUNNING)
        )
        await run("echo kept > notes.txt; export MOOD=happy")
        sandbox = service.tasks.local(task_id)
        assert sandbox is not None
        container_id = sandbox.container_id

        await state(AgentState.FINISHED)
        # Ended, its release not handled yet: its sandbox is there, so a missing file is
        # missing (404), not a sandbox gone (410, seen in CI as a diff's "nothing to compare").
        status, detail = await read("missing.txt")
        assert status is WorkspaceStatus.NOT_FOUND, detail
        await service.seating.release(ReleaseSandbox(task_id=task_id, reason="finished"))
        assert docker_client.api.inspect_container(container_id)["State"]["Paused"] is True
        assert await service.bindings.get(task_id) == container_id
        assert task_id not in await service.seats.seated()  # its seat went to others
        assert (await service.upkeep.reconcile()).removed == 0  # kept, not an ended task's leftover

        # Read and written while paused.
        assert await read("notes.txt") == (WorkspaceStatus.OK, b"kept\n")
        upload = transfer_name(task_id)
        await transfers.put(upload, io.BytesIO(b"late\n"))
        reply = await service.workspace.handle(
            WorkspaceRequest(
                op=WorkspaceOp.PUT_FILE,
                task_id=task_id,
                path="late.txt",
                upload=upload,
                max_bytes=4096,
            )
        )
        assert reply.status is WorkspaceStatus.OK and reply.files == 1, reply
        await transfers.delete(upload)
        assert docker_client.api.inspect_container(container_id)["State"]["Paused"] is True

        # A message resumes the task: its next action finds its files, and its shell as it was.
        await state(AgentState.RUNNING)
        resumed = await run("cat notes.txt late.txt; echo mood=$MOOD")
        assert "kept" in resumed.content and "late" in resumed.content, resumed.content
        assert "mood=happy" in resumed.content, resumed.content
        assert "session are new" not in resumed.content
        state_now = docker_client.api.inspect_container(container_id)["State"]
        assert state_now["Running"] is True and state_now["Paused"] is False

        # It ends again; once its retention is over the sweep removes it.
        await state(AgentState.FINISHED)
        await service.seating.release(ReleaseSandbox(task_id=task_id, reason="finished again"))
        assert await service.kept.sweep(service.status.is_over, service.status.is_gone) == 0
        await asyncio.sleep(3.2)
        assert await service.kept.sweep(service.status.is_over, service.status.is_gone) == 1
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(container_id)
        assert await service.bindings.get(task_id) is None
        status, detail = await read("notes.txt")
        assert status is WorkspaceStatus.GONE and b"gone" in detail
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_the_pool_keeps_at_most_its_cap_of_ended_tasks_sandboxes(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    """Each kept sandbox is a stopped container and a running keeper: a burst of ended tasks
    keeps the newest `workspace_retained_max`, the oldest going first (then gone, as after
    its retention)."""
    pool = f"test-retain-cap-{uuid.uuid4().hex[:6]}"
    config = make_settings(
        isolated_settings,
        sandbox_image,
        pool,
        workspace_retained_max=2,
        pool_health_interval_s=600.0,  # nothing sweeps but the releases
    )
    service = RuntimeService(config, _ignore)
    await service.start()
    store = TaskStateStore(redis)
    tasks = [uuid.uuid4().hex for _ in range(3)]
    containers: dict[str, str] = {}
    try:
        for task_id in tasks:
            assert await store.create(
                TaskState(
                    task_id=task_id, task="t", max_iterations=5, agent_state=AgentState.RUNNING
                )
            )
            observation = await service.execution.run(
                ExecuteAction(task_id=task_id, action=cmd(task_id, "echo mine > f")),
                last_try=True,
            )
            assert isinstance(observation, CmdOutputObservation), observation
            sandbox = service.tasks.local(task_id)
            assert sandbox is not None
            containers[task_id] = sandbox.container_id
        for task_id in tasks:  # they end one after another, the first the oldest
            state = await store.load(task_id)
            assert state is not None
            await store.save(state.model_copy(update={"agent_state": AgentState.FINISHED}))
            await service.seating.release(ReleaseSandbox(task_id=task_id, reason="finished"))

        oldest, *newest = tasks
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(containers[oldest])
        reply = await service.workspace.handle(
            WorkspaceRequest(op=WorkspaceOp.GET_FILE, task_id=oldest, path="f", max_bytes=64)
        )
        assert reply.status is WorkspaceStatus.GONE, reply
        for task_id in newest:
            kept = docker_client.api.inspect_container(containers[task_id])
            assert kept["State"]["Paused"] is True
            assert await service.kept.is_retained(task_id)
        assert sorted(await service.kept.retention.all()) == sorted(newest)
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_a_crowd_of_releases_evicts_each_kept_sandbox_once(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    """Every ending task's release asks for an eviction pass; passes run at once (a crowd of
    tasks ending together) remove each sandbox beyond the cap once, not once per pass."""
    pool = f"test-retain-once-{uuid.uuid4().hex[:6]}"
    config = make_settings(
        isolated_settings,
        sandbox_image,
        pool,
        workspace_retained_max=2,
        pool_health_interval_s=600.0,
    )
    service = RuntimeService(config, _ignore)
    await service.start()
    retention = service.kept.retention
    assert retention is not None
    kept = [uuid.uuid4().hex for _ in range(5)]
    try:
        for n, task_id in enumerate(kept):
            await retention.add(task_id, time.time() + 600 + n)

        async def ended(task_id: str) -> bool:
            await asyncio.sleep(0.05)  # a State read: the passes interleave here
            return True

        evicted = await asyncio.gather(*(service.kept.evict_beyond_cap(ended) for _ in range(8)))
        assert sum(evicted) == 3, evicted
        assert sorted(await retention.all()) == sorted(kept[3:])
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_transfer_objects_left_behind_are_removed_and_blobs_kept(
    js: JetStreamContext,
) -> None:
    await ensure_blob_bucket(js, 1 << 30)
    transfers = WorkspaceTransfers(lambda: js)
    task_id = uuid.uuid4().hex
    left = transfer_name(task_id)
    await transfers.put(left, io.BytesIO(b"an upload nobody took"))
    blob = f"{task_id}/{'0' * 64}"  # a claim check of the task's log: not a transfer
    await transfers.put(blob, io.BytesIO(b"a whole output"))
    assert await transfers.remove_stale(3600.0) == 0  # too young
    assert await transfers.remove_stale(0.0) >= 1
    with pytest.raises(LookupError):
        await transfers.get(left, io.BytesIO())
    kept = io.BytesIO()
    await transfers.get(blob, kept)
    assert kept.getvalue() == b"a whole output"
    await transfers.delete(blob)
