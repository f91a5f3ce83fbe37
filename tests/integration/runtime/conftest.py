"""Fixtures for the runtime against the real Docker engine.

The sandbox image is built (deploy/sandbox/build.sh, no registry needed) when missing. Every
container a test creates carries a per-session pool label, and is removed at the end.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import nats
import pytest
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import (  # type: ignore[import-not-found]
    Runtime,
    make_settings,
    remove_pool_containers,
)

from services.runtime.containers import DockerSandboxes, Sandbox
from services.runtime.settings import RuntimeSettings
from shared.settings import CommonSettings
from shared.state_store import TaskStateStore


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker engine: {exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient, repo_root: Path) -> str:
    image = os.environ.get("DECKHANDS_SANDBOX_IMAGE", "deckhands/sandbox:latest")
    # Builds it when missing or built from an older executor; otherwise a no-op.
    subprocess.run(
        [str(repo_root / "deploy" / "sandbox" / "build.sh")],
        check=True,
        env={**os.environ, "SANDBOX_IMAGE": image},
        timeout=900,
        stdout=subprocess.DEVNULL,
    )
    return image


@pytest.fixture(scope="session")
def pool_name(docker_client: docker.DockerClient) -> Iterator[str]:
    """A pool label of this test session's own; its containers are all removed at the end."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    remove_pool_containers(docker_client, name)


@pytest.fixture(scope="session")
def runtime_settings(
    settings: CommonSettings, sandbox_image: str, pool_name: str
) -> RuntimeSettings:
    return make_settings(settings, sandbox_image, pool_name)


@pytest.fixture(scope="session")
async def sandboxes(runtime_settings: RuntimeSettings) -> AsyncIterator[DockerSandboxes]:
    manager = DockerSandboxes(runtime_settings, f"tests-{uuid.uuid4().hex[:6]}")
    yield manager
    manager.close()


@pytest.fixture(scope="module")
async def shared_sandbox(sandboxes: DockerSandboxes) -> AsyncIterator[Sandbox]:
    """One sandbox for the tests that only read and write their own paths."""
    sandbox = await sandboxes.create()
    yield sandbox
    await sandbox.session.close()
    await sandboxes.remove(sandbox.container_id)


@pytest.fixture
async def fresh_sandbox(sandboxes: DockerSandboxes) -> AsyncIterator[Sandbox]:
    sandbox = await sandboxes.create()
    yield sandbox
    await sandbox.session.close()
    await sandboxes.remove(sandbox.container_id)


# -- the runtime service, one per test module (a module may define its own instead)


@pytest.fixture(scope="module")
def module_pool(docker_client: docker.DockerClient) -> Iterator[str]:
    name = f"test-svc-{uuid.uuid4().hex[:8]}"
    yield name
    remove_pool_containers(docker_client, name)


@pytest.fixture(scope="module")
def svc_settings(
    isolated_settings: CommonSettings, sandbox_image: str, module_pool: str
) -> RuntimeSettings:
    return make_settings(isolated_settings, sandbox_image, module_pool, pool_min_idle=1)


@pytest.fixture(scope="module")
async def runtime(svc_settings: RuntimeSettings) -> AsyncIterator[Runtime]:
    # The controller's marker, as a controller sets it on start: Redis has lost no State.
    # Without it an order for an unknown task waits for a rebuild that never comes.
    redis = Redis.from_url(svc_settings.redis_url)
    await TaskStateStore(redis).mark_intact()
    await redis.aclose()
    rt = Runtime(svc_settings)
    await rt.start()
    yield rt
    await rt.stop()


@pytest.fixture(scope="module")
async def js(isolated_settings: CommonSettings) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(isolated_settings.nats_url)
    yield nc.jetstream()
    await nc.close()
