"""An agent that tries to break out of its sandbox or into others' (issue 10's hostile-agent
suite), through the real runtime service on Docker: each attempt with the exact result expected.

Also in the suite elsewhere: writing into the executor's channel (test_runtime_service), the
memory and fork bombs (test_runtime_limits), the network and the read-only root
(test_runtime_sandbox), FIFOs and devices as files (test_runtime_service).
"""

from __future__ import annotations

import time
import uuid

import docker
import pytest
from nats.js import JetStreamContext
from runtime_helpers import (  # type: ignore[import-not-found]
    Controller,
    Runtime,
    cmd,
    eventually,
)

from services.runtime.containers import task_container_name
from shared.events import CmdOutputObservation, ErrorObservation

pytestmark = pytest.mark.docker


async def _task(runtime: Runtime, js: JetStreamContext) -> tuple[str, Controller]:
    task_id = uuid.uuid4().hex
    return task_id, await Controller.for_task(js, task_id, runtime.settings.redis_url)


async def _out(ctl: Controller, task_id: str, command: str) -> str:
    observation = await ctl.run(cmd(task_id, command))
    assert isinstance(observation, CmdOutputObservation), observation
    return observation.content


async def test_other_sandboxes_processes_and_the_host_are_invisible(
    runtime: Runtime, js: JetStreamContext
) -> None:
    a, ctl_a = await _task(runtime, js)
    b, ctl_b = await _task(runtime, js)
    await _out(ctl_a, a, "sleep 3131 & echo started")
    seen = await _out(ctl_b, b, "ps -eo user,args; echo; ls /proc | grep -cE '^[0-9]+$'")
    assert "3131" not in seen  # A's process
    for host_side in ("dockerd", "containerd", "services.runtime", "nats-server", "redis"):
        assert host_side not in seen
    assert {line.split()[0] for line in seen.splitlines()[1:-2] if line.strip()} == {"sandbox"}
    assert int(seen.split()[-1]) < 20  # only its own few processes
    await ctl_a.release()
    await ctl_b.release()


async def test_the_engine_and_other_workspaces_are_not_in_the_filesystem(
    runtime: Runtime, js: JetStreamContext
) -> None:
    task_id, ctl = await _task(runtime, js)
    seen = await _out(
        ctl,
        task_id,
        "for p in /var/run/docker.sock /run/docker.sock /var/lib/docker /var/lib/containerd; "
        "do test -e $p && echo FOUND $p; done; ls /sys/class/net; id -u; "
        "touch /etc/x 2>&1 | grep -c 'Read-only'; mount | grep -c ' /workspace '",
    )
    assert "FOUND" not in seen
    assert seen.split() == ["lo", "1000", "1", "1"]
    await ctl.release()


async def test_ending_its_own_init_ends_only_its_own_sandbox(
    runtime: Runtime, js: JetStreamContext
) -> None:
    """PID 1 (Docker's init) runs as the sandbox user: SIGKILL from inside is ignored by the
    kernel, SIGTERM is forwarded and ends the container. The agent can end its own sandbox,
    is told so, and gets a fresh one; its neighbour notices nothing."""
    task_id, ctl = await _task(runtime, js)
    other, ctl_other = await _task(runtime, js)
    await _out(ctl_other, other, "echo kept > /workspace/mine.txt")
    assert "survived" in await _out(ctl, task_id, "kill -KILL 1; sleep 0.5; echo survived")
    ended = await ctl.run(cmd(task_id, "kill -TERM 1; sleep 10"))
    assert isinstance(ended, ErrorObservation) and ended.error_code == "sandbox_lost", ended
    assert "fresh" in await _out(ctl, task_id, "echo fresh")
    assert (await _out(ctl_other, other, "cat /workspace/mine.txt")).strip() == "kept"
    await ctl.release()
    await ctl_other.release()


async def test_a_huge_argv_is_refused_by_the_kernel_and_nothing_else_happens(
    runtime: Runtime, js: JetStreamContext
) -> None:
    task_id, ctl = await _task(runtime, js)
    seen = await _out(
        ctl,
        task_id,
        "python3 -c \"import os; os.execvp('echo', ['echo', 'x' * 10**7])\" 2>&1 | tail -1; "
        "echo after",
    )
    assert "Argument list too long" in seen and seen.strip().endswith("after")
    await ctl.release()


async def test_a_process_that_ignores_sigterm_does_not_hold_the_release(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient
) -> None:
    task_id, ctl = await _task(runtime, js)
    await _out(ctl, task_id, "nohup bash -c \"trap '' TERM HUP; sleep 1000\" >/dev/null 2>&1 &")
    await runtime.service.tasks.renamed(task_id)
    container = docker_client.containers.get(task_container_name(task_id))
    started = time.monotonic()
    await ctl.release()

    async def gone() -> bool:
        try:
            docker_client.containers.get(container.id)
        except docker.errors.NotFound:
            return True
        return False

    await eventually(gone, timeout=30)
    assert time.monotonic() - started < 20
