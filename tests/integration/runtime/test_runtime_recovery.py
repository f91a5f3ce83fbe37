"""Restarts and leaks: a new runtime adopts live task sandboxes and removes orphans.

A module of its own: it runs several runtimes in turn on its own NATS server, and the
runtime's durable consumer must not be shared with another module's runtime.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import docker
import nats
import pytest
from nats.js import JetStreamContext
from runtime_helpers import (  # type: ignore[import-not-found]
    Controller,
    Runtime,
    cmd,
    eventually,
    make_settings,
    pool_containers,
    remove_pool_containers,
)

from services.runtime.containers import LABEL_REPLICA, DockerSandboxes, task_container_name
from shared.events import CmdOutputObservation
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
async def js(isolated_settings: CommonSettings) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(isolated_settings.nats_url)
    yield nc.jetstream()
    await nc.close()


async def test_restart_adopts_live_sandboxes_and_removes_orphans(
    isolated_settings: CommonSettings, sandbox_image: str, js: JetStreamContext,
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
        await orphan.client.close()
        stray = docker_client.volumes.create(
            labels={"deckhands.role": "sandbox", "deckhands.pool": pool}
        )

        first = Runtime(settings)
        await first.start()
        ctl = await Controller.for_task(js, task_id)
        await ctl.run(cmd(task_id, "cd /tmp && echo kept > /workspace/state.txt"))
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
            replicas = {c.labels[LABEL_REPLICA] for c in pool_containers(docker_client, pool)
                        if c.name.startswith("deckhands-idle-")}
            assert replicas <= {service.replica_id}
            await ctl.release()

            async def released() -> bool:
                return not any(c.name.startswith("deckhands-task-")
                               for c in pool_containers(docker_client, pool))

            await eventually(released)
        finally:
            await second.stop()
        assert [c.name for c in pool_containers(docker_client, pool)] == []
        # Workspaces went with their containers.
        assert docker_client.volumes.list(filters={"label": f"deckhands.pool={pool}"}) == []
    finally:
        remove_pool_containers(docker_client, pool)
