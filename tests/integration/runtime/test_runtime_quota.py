"""The /workspace quota (issue 10, part 3) through the real runtime on Docker: a tmpfs volume of
sandbox_workspace_size bytes and sandbox_inodes files (64 MiB and 4096 in these tests, see
make_settings). Writing past it fails with "No space left on device" inside the sandbox, the
observation says which limit it is, and a neighbour sandbox notices nothing.
"""

from __future__ import annotations

import asyncio
import uuid

import docker
import pytest
from nats.js import JetStreamContext
from runtime_helpers import (  # type: ignore[import-not-found]
    Controller,
    Runtime,
    cmd,
    differs_under_gvisor,
    make_settings,
)

from services.runtime.containers import DockerSandboxes, task_container_name
from services.runtime.keepers import keeper_name
from services.runtime.settings import RuntimeSettings
from shared.events import CmdOutputObservation, ErrorObservation, EventSource, FileWriteAction
from shared.settings import CommonSettings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def svc_settings(
    isolated_settings: CommonSettings, sandbox_image: str, module_pool: str
) -> RuntimeSettings:
    # Files may be larger than the quota here: the quota, not RLIMIT_FSIZE, is what stops them.
    return make_settings(
        isolated_settings, sandbox_image, module_pool, pool_min_idle=1, sandbox_max_file_size="1g"
    )


async def _task(runtime: Runtime, js: JetStreamContext) -> tuple[str, Controller]:
    task_id = uuid.uuid4().hex
    return task_id, await Controller.for_task(js, task_id, runtime.settings.redis_url)


async def _out(ctl: Controller, task_id: str, command: str) -> str:
    observation = await ctl.run(cmd(task_id, command, timeout_s=60))
    assert isinstance(observation, CmdOutputObservation), observation
    return observation.content


@differs_under_gvisor(
    "/workspace is a 9p mount of the host's tmpfs volume (the quota holds; the file system "
    "reads v9fs)"
)
async def test_writing_past_the_quota_is_no_space_left_and_the_agent_is_told(
    runtime: Runtime, js: JetStreamContext
) -> None:
    task_id, ctl = await _task(runtime, js)
    other, ctl_other = await _task(runtime, js)
    assert (await _out(ctl, task_id, "stat -f -c %T /workspace")).strip() == "tmpfs"

    # fallocate asks for it all at once: refused, nothing written.
    seen = await _out(ctl, task_id, "fallocate -l 100M /workspace/big; echo rc=$?")
    assert "fallocate failed: No space left on device" in seen and "rc=1" in seen, seen
    assert "[the sandbox's disk space is limited: /workspace has room" in seen, seen
    assert "of 64.0 MiB used" in seen, seen

    # dd writes until the limit.
    seen = await _out(
        ctl, task_id, "dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>&1 | tail -3"
    )
    assert "No space left on device" in seen and "64.0 MiB of 64.0 MiB used" in seen, seen
    assert "/workspace is full" in seen, seen

    # A file operation says it too, with the limit.
    refused = await ctl.run(
        FileWriteAction(
            task_id=task_id, source=EventSource.AGENT, path="/workspace/n.txt", content="x" * 9000
        )
    )
    assert isinstance(refused, ErrorObservation), refused
    assert "no space left" in refused.content and "64.0 MiB of 64.0 MiB" in refused.content

    # The neighbour's workspace is its own, empty and writable.
    seen = await _out(
        ctl_other,
        other,
        "df -B1 --output=used,size /workspace | tail -1; "
        "head -c 10000000 /dev/zero > /workspace/mine && echo wrote",
    )
    used, size = map(int, seen.split()[:2])
    assert used < 1 << 20 and size == 64 << 20 and seen.strip().endswith("wrote"), seen

    # Deleting makes room again; no note once there is room and no error.
    seen = await _out(ctl, task_id, "rm /workspace/fill; echo hi > /workspace/after; cat after")
    assert seen.strip() == "hi", seen
    await ctl.release()
    await ctl_other.release()


@differs_under_gvisor("/tmp is gVisor's own tmpfs, which ignores nr_inodes")
async def test_many_small_files_stop_at_the_inode_limit(
    runtime: Runtime, js: JetStreamContext
) -> None:
    task_id, ctl = await _task(runtime, js)
    other, ctl_other = await _task(runtime, js)
    seen = await _out(
        ctl,
        task_id,
        "mkdir -p /workspace/many && cd /workspace/many && "
        "for i in $(seq 5000); do : > f$i 2>/dev/null || { echo stopped at $i; break; }; done; "
        ": > one-more; cd /tmp && for i in $(seq 5000); do : > t$i 2>/dev/null || "
        "{ echo tmp stopped at $i; break; }; done",
    )
    # 4096 inodes: the root and the directory take two of them.
    assert "stopped at 4095" in seen and "tmp stopped at" in seen, seen
    assert "one-more: No space left on device" in seen, seen
    assert "/workspace is full" in seen and "4,096 of 4,096 files" in seen, seen
    assert (await _out(ctl_other, other, "touch /workspace/x && echo ok")).strip() == "ok"
    freed = await _out(ctl, task_id, "rm -r /workspace/many /tmp/t* && echo freed")
    assert freed.strip() == "freed", freed
    await ctl.release()
    await ctl_other.release()


async def test_a_keeper_holds_a_stopped_sandboxes_files_and_goes_when_not_needed(
    settings: CommonSettings,
    sandbox_image: str,
    pool_name: str,
    docker_client: docker.DockerClient,
) -> None:
    """The keeper of a stopped sandbox keeps its tmpfs workspace (files and all) until it runs
    again; reconciliation removes one whose sandbox runs or is gone (a crash between two steps),
    and removing a stopped sandbox removes its keeper and volume with it."""
    config = make_settings(settings, sandbox_image, pool_name, start_timeout_s=1.0)
    manager = DockerSandboxes(config, f"tests-{uuid.uuid4().hex[:6]}")
    sandbox = await manager.create()
    cid = sandbox.container_id
    volume = next(
        m["Name"]
        for m in docker_client.api.inspect_container(cid)["Mounts"]
        if m["Destination"] == "/workspace"
    )
    try:
        await sandbox.session.bash({"command": "echo kept > /workspace/f", "timeout_s": 30}, 30 + 5)
        await sandbox.session.close()
        await manager.keep_workspace(cid)
        await manager.stop(cid, timeout_s=1)
        await asyncio.sleep(2.5)  # older than the keepers' grace (2 x start_timeout_s)
        assert await manager.remove_stray_keepers() == 0  # needed: its sandbox is stopped
        await manager.start(cid)
        out = docker_client.containers.get(cid).exec_run(["cat", "/workspace/f"], user="1000")
        assert out.output.strip() == b"kept"
        assert await manager.remove_stray_keepers() == 1  # running again: not needed
        await manager.keep_workspace(cid)
        await manager.stop(cid, timeout_s=1)
    finally:
        await manager.remove(cid)
        manager.close()
    assert not docker_client.api.containers(all=True, filters={"name": keeper_name(cid)})
    assert volume not in {v.name for v in docker_client.volumes.list()}


async def test_a_task_chooses_its_own_quota_within_the_maximum(
    runtime: Runtime, js: JetStreamContext
) -> None:
    # The default is 64 MiB here; one task asks for 16, another for more than the maximum.
    small = uuid.uuid4().hex
    ctl = await Controller.for_task(js, small, runtime.settings.redis_url, workspace_mib=16)
    big = uuid.uuid4().hex
    ctl_big = await Controller.for_task(js, big, runtime.settings.redis_url, workspace_mib=1 << 20)
    seen = await _out(ctl, small, "dd if=/dev/zero of=/workspace/f bs=1M count=32 2>&1 | tail -2")
    assert "No space left on device" in seen and "16.0 MiB of 16.0 MiB used" in seen, seen
    # Capped at sandbox_workspace_max_size (128 MiB here): 100 MiB fit, past the default.
    seen = await _out(ctl_big, big, "dd if=/dev/zero of=/workspace/f bs=1M count=100; echo rc=$?")
    assert "rc=0" in seen and "No space" not in seen, seen
    limit = await _out(ctl_big, big, "df -B1M --output=size /workspace | tail -1")
    assert int(limit) == 128, limit
    # Its memory limit carries the bigger workspace (the pages are charged to the sandbox).
    info = docker.from_env().containers.get(task_container_name(big)).attrs
    assert info["HostConfig"]["Memory"] == runtime.settings.container_memory_bytes_for(128 << 20)
    for controller in (ctl, ctl_big):
        await controller.release()
