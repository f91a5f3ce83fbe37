"""Restarts and leaks: a new runtime adopts live task sandboxes and removes orphans.

A module of its own: it runs several runtimes in turn on its own NATS server, and the
runtime's durable consumer must not be shared with another module's runtime.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import docker
import pytest
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import (  # type: ignore[import-not-found]
    Controller,
    Runtime,
    await_approved,
    cmd,
    eventually,
    make_settings,
    pool_containers,
    remove_pool_containers,
)

from services.runtime.containers import LABEL_REPLICA, DockerSandboxes, task_container_name
from services.runtime.service import RuntimeService
from shared.commands import ExecuteAction
from shared.events import AgentState, CmdOutputObservation, EventBase
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore

pytestmark = pytest.mark.docker


async def _ignore(event: EventBase) -> None:
    return None


async def test_restart_adopts_live_sandboxes_and_removes_orphans(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    js: JetStreamContext,
    docker_client: docker.DockerClient,
) -> None:
    pool = f"test-restart-{uuid.uuid4().hex[:6]}"
    settings = make_settings(isolated_settings, sandbox_image, pool, pool_min_idle=1)
    task_id = uuid.uuid4().hex
    try:
        # A warm sandbox left behind by a replica that is gone (no heartbeat), and a workspace
        # volume that outlived its container.
        dead = DockerSandboxes(settings, "dead-replica")
        orphan = await dead.create()
        await orphan.session.close()
        stray = docker_client.volumes.create(
            labels={"deckhands.role": "sandbox", "deckhands.pool": pool}
        )

        first = Runtime(settings)
        await first.start()
        ctl = await Controller.for_task(js, task_id, settings.redis_url)
        await ctl.run(cmd(task_id, "cd /tmp && echo kept > /workspace/state.txt"))
        await first.service.tasks.renamed(task_id)
        task_container = docker_client.containers.get(task_container_name(task_id))
        await first.stop()  # idle sandboxes go, the task's stays
        task_container.reload()
        assert task_container.status == "running"

        second = Runtime(settings)
        service = await second.start()
        try:
            assert service.tasks.local(task_id) is not None  # adopted at start-up
            obs = await ctl.run(cmd(task_id, "cat /workspace/state.txt; pwd"))
            assert isinstance(obs, CmdOutputObservation)
            assert obs.content.split() == ["kept", "/tmp"]  # same files, same shell
            names = {c.name for c in pool_containers(docker_client, pool)}
            assert orphan.name not in names
            assert stray.name not in {v.name for v in docker_client.volumes.list()}
            replicas = {
                c.labels[LABEL_REPLICA]
                for c in pool_containers(docker_client, pool)
                if c.name.startswith("deckhands-idle-")
            }
            assert replicas <= {service.replica_id}
            await ctl.release()

            async def released() -> bool:
                return not any(
                    c.name.startswith("deckhands-task-")
                    for c in pool_containers(docker_client, pool)
                )

            await eventually(released)
        finally:
            await second.stop()
        assert [c.name for c in pool_containers(docker_client, pool)] == []
        # Workspaces went with their containers.
        assert docker_client.volumes.list(filters={"label": f"deckhands.pool={pool}"}) == []
    finally:
        remove_pool_containers(docker_client, pool)


async def test_reconcile_rebinds_lost_bindings_and_removes_finished_tasks(
    settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    pool = f"test-rebind-{uuid.uuid4().hex[:6]}"
    config = make_settings(settings, sandbox_image, pool)
    service = RuntimeService(config, _ignore)
    await service.start()
    try:
        store = TaskStateStore(redis)
        task_id = uuid.uuid4().hex
        assert await store.create(TaskState(task_id=task_id, task="t", max_iterations=3))
        sandbox = await service.tasks.get(task_id)
        await service.tasks.renamed(task_id)
        service.tasks.forget_local(task_id)
        service.pool.forget(sandbox.container_id)
        await redis.delete(f"deckhands:runtime:{pool}:task:{task_id}")  # Redis lost it

        report = await service.upkeep.reconcile()
        assert report.rebound == 1
        assert await service.bindings.get(task_id) == sandbox.container_id

        # ERROR ends a run, not the task: a user message resumes it with its workspace.
        state = await store.load(task_id)
        assert state is not None
        await store.save(state.model_copy(update={"agent_state": AgentState.ERROR}))
        report = await service.upkeep.reconcile()
        assert report.removed == 0 and report.unbound == 0
        assert await service.bindings.get(task_id) == sandbox.container_id

        state = await store.load(task_id)
        assert state is not None
        await store.save(state.model_copy(update={"agent_state": AgentState.FINISHED}))
        report = await service.upkeep.reconcile()
        assert report.removed == 1 and report.unbound == 1
        assert await service.bindings.get(task_id) is None
        assert sandbox.container_id not in {c.id for c in pool_containers(docker_client, pool)}
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_a_waiting_tasks_idle_sandbox_is_stopped_and_started_again_with_its_files(
    settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    pool = f"test-idle-{uuid.uuid4().hex[:6]}"
    # Upkeep runs rarely here: the test calls stop_idle_sandboxes itself.
    config = make_settings(
        settings, sandbox_image, pool, sandbox_idle_stop_s=0.5, pool_health_interval_s=600.0
    )
    service = RuntimeService(config, _ignore)
    await service.start()
    store = TaskStateStore(redis)
    waiting, running = uuid.uuid4().hex, uuid.uuid4().hex

    async def run(task_id: str, command: str) -> CmdOutputObservation:
        order = ExecuteAction(task_id=task_id, action=cmd(task_id, command))
        observation = await service.execution.run(order, last_try=True)
        assert isinstance(observation, CmdOutputObservation), observation
        return observation

    try:
        for task_id, agent_state in (
            (waiting, AgentState.AWAITING_USER_INPUT),
            (running, AgentState.RUNNING),
        ):
            assert await store.create(
                TaskState(task_id=task_id, task="t", max_iterations=3, agent_state=agent_state)
            )
            await run(task_id, "echo kept > notes.txt; export MOOD=happy; cd /tmp")
        container_id = (await service.tasks.get(waiting)).container_id
        await asyncio.sleep(0.7)

        assert await service.upkeep.stop_idle_sandboxes() == 1  # the RUNNING task keeps its sandbox
        assert docker_client.api.inspect_container(container_id)["State"]["Running"] is False
        assert await service.bindings.get(waiting) == container_id
        report = await service.upkeep.reconcile()  # a stopped-on-purpose sandbox is not "dead"
        assert report.removed == 0

        woken = await run(waiting, "cat /workspace/notes.txt; echo mood=$MOOD; pwd")
        assert "sandbox was stopped while the task waited" in woken.content
        assert "shell and the Python session are new" in woken.content
        assert "kept" in woken.content and "mood=\n" in woken.content + "\n"
        assert woken.cwd == "/workspace"  # a new shell
        assert docker_client.api.inspect_container(container_id)["State"]["Running"] is True
        again = await run(waiting, "cat /workspace/notes.txt")
        assert again.content.strip() == "kept"  # the notice is told once
        assert await service.bindings.stopped_at(container_id) is None

        await service.tasks.release(waiting)
        await service.tasks.release(running)
        left = pool_containers(docker_client, pool)
        assert container_id not in {c.id for c in left}
        assert all(c.name.startswith("deckhands-idle-") for c in left)  # warm ones only
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_after_flushall_sandboxes_are_bound_again_and_no_action_runs_twice(
    settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    """Redis loses everything (the ledger, the bindings, the seats, the States) while the
    task's action runs. Until the controller has rebuilt the State the order waits; the replica
    binds its task sandbox again and holds its seat; a duplicate order of the running action
    waits for that run and gets its observation, and so does one after it: one run."""
    pool = f"test-flush-{uuid.uuid4().hex[:6]}"
    published: list[EventBase] = []

    async def publish(event: EventBase) -> None:
        published.append(event)

    service = RuntimeService(make_settings(settings, sandbox_image, pool), publish)
    await service.start()
    try:
        store = TaskStateStore(redis)
        await store.mark_intact()  # the controller's marker: every State is there
        task_id = uuid.uuid4().hex
        running = TaskState(
            task_id=task_id, task="t", max_iterations=3, agent_state=AgentState.RUNNING
        )
        assert await store.create(running)
        warm_up = cmd(task_id, "echo warm")
        await await_approved(settings.redis_url, task_id, warm_up)
        await service.execution.execute(ExecuteAction(task_id=task_id, action=warm_up))
        sandbox = service.tasks.local(task_id)
        assert sandbox is not None

        action = cmd(task_id, "echo run >> /workspace/runs; sleep 2; wc -l < /workspace/runs")
        await await_approved(settings.redis_url, task_id, action)
        state = await store.load(task_id)
        order = ExecuteAction(task_id=task_id, action=action)
        first = asyncio.create_task(service.execution.execute(order))
        await asyncio.sleep(1.0)  # running
        await redis.flushall()
        # The order's duplicate comes before the controller rebuilt the State: it waits.
        duplicate = asyncio.create_task(service.execution.execute(order))
        await asyncio.sleep(0.5)
        assert not duplicate.done()
        assert state is not None and await store.create(state)  # "rebuilt"
        await store.mark_intact()
        await asyncio.wait_for(asyncio.gather(first, duplicate), 30)
        outputs = [e for e in published if e.cause == action.id]
        assert len(outputs) == 2 and outputs[0] == outputs[1]
        assert isinstance(outputs[0], CmdOutputObservation)
        assert outputs[0].content.strip().endswith("1")  # ran once

        # The replica's recovery round (every second) bound its sandbox again.
        async def bound_again() -> bool:
            return bool(await service.bindings.get(task_id) == sandbox.container_id)

        await eventually(bound_again)
        assert task_id in await service.seats.seated()
        assert await service.upkeep.readopt_after_redis_loss() == 0  # once per loss
        await service.execution.execute(order)  # and once more, after it ran
        assert [e for e in published if e.cause == action.id][-1] == outputs[0]

        # Redis fails as the run is recorded (it restarts empty): the order is redelivered,
        # and gets the run's observation from the replica's memory, not a second run.
        again = cmd(task_id, "echo again >> /workspace/again; wc -l < /workspace/again")
        await await_approved(settings.redis_url, task_id, again)
        second = ExecuteAction(task_id=task_id, action=again)
        complete = service.ledger.complete

        async def redis_gone(*args: object) -> str:
            service.ledger.complete = complete  # type: ignore[method-assign]
            raise ConnectionError("Connection closed by server.")

        service.ledger.complete = redis_gone  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await service.execution.execute(second)
        await asyncio.wait_for(service.execution.execute(second), 30)
        [answer] = [e for e in published if e.cause == again.id]
        assert isinstance(answer, CmdOutputObservation) and answer.content.strip() == "1"
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_a_sandbox_another_replica_starts_while_reconciliation_looks_is_kept(
    settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    """Reconciliation lists the containers, then works through them while other replicas go
    on: a sandbox seen stopped in the list, and started and bound by a live replica since, is
    that replica's, not a dead one to remove."""
    pool = f"test-stale-{uuid.uuid4().hex[:6]}"
    config = make_settings(settings, sandbox_image, pool)
    service = RuntimeService(config, _ignore)
    other = DockerSandboxes(config, "other-replica")
    await service.start()
    try:
        await service.bindings.heartbeat(other.replica_id, 60)  # the other replica lives
        store = TaskStateStore(redis)
        task_id = uuid.uuid4().hex
        assert await store.create(TaskState(task_id=task_id, task="t", max_iterations=3))
        sandbox = await other.create()
        await sandbox.session.close()
        docker_client.containers.get(sandbox.container_id).stop(timeout=1)
        real_list = service.docker.list

        async def list_then_other_replica_goes_on(*, everything: bool = True) -> list[Any]:
            seen = await real_list(everything=everything)
            # Meanwhile the other replica starts the sandbox and binds its task to it.
            docker_client.containers.get(sandbox.container_id).start()
            assert await service.bindings.bind(task_id, sandbox.container_id)
            return seen

        service.docker.list = list_then_other_replica_goes_on  # type: ignore[method-assign]
        report = await service.upkeep.reconcile()
        service.docker.list = real_list  # type: ignore[method-assign]
        container = docker_client.containers.get(sandbox.container_id)
        assert container.status == "running"
        assert report.removed == 0
        assert await service.bindings.get(task_id) == sandbox.container_id
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def test_a_sandbox_lost_while_reconciliation_looks_is_not_bound_again(
    settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    """A task's sandbox dies and is unbound, and reconciliation looks while the engine is still
    removing it: the container, still running under its task's name and unbound, is not taken
    for one whose binding Redis lost and bound again, and the task's next action gets a fresh
    sandbox (under load it once found the removed one and heard its workspace was lost twice)."""
    pool = f"test-letgo-{uuid.uuid4().hex[:6]}"
    config = make_settings(settings, sandbox_image, pool)
    service = RuntimeService(config, _ignore)
    await service.start()
    try:
        store = TaskStateStore(redis)
        task_id = uuid.uuid4().hex
        assert await store.create(TaskState(task_id=task_id, task="t", max_iterations=3))
        sandbox = await service.tasks.get(task_id)
        await service.tasks.renamed(task_id)
        real_remove = service.docker.remove
        removing = asyncio.Event()
        go_on = asyncio.Event()

        async def slow_remove(container_id: str) -> None:
            removing.set()
            await go_on.wait()  # a busy engine
            await real_remove(container_id)

        service.docker.remove = slow_remove  # type: ignore[method-assign]
        losing = asyncio.ensure_future(service.tasks.lost(task_id, sandbox))
        await asyncio.wait_for(removing.wait(), 10)
        assert await service.bindings.get(task_id) is None
        report = await service.upkeep.reconcile()
        go_on.set()
        await asyncio.wait_for(losing, 30)
        service.docker.remove = real_remove  # type: ignore[method-assign]
        assert report.rebound == 0
        assert await service.bindings.get(task_id) is None
        fresh = await service.tasks.get(task_id)
        assert fresh.container_id != sandbox.container_id
    finally:
        await service.stop()
        remove_pool_containers(docker_client, pool)
