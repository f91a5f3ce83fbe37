"""An agent that tries to break out of its sandbox or into others' (issue 10's hostile-agent
suite), through the real runtime service on Docker: each attempt with the exact result expected.

Runs under the engine's default runtime (runc), or under gVisor with
DECKHANDS_DOCKER_RUNTIME=runsc; where gVisor's kernel answers differently, both exact results
are stated (docs/runtime.md, "gVisor").

Also in the suite elsewhere: what the runtime does with a foreign writer on the executor's
channel (test_runtime_service), the memory and fork bombs (test_runtime_limits), the network
and the read-only root (test_runtime_sandbox), FIFOs and devices as files (test_runtime_service).
"""

from __future__ import annotations

import time
import uuid

import docker
import pytest
from nats.js import JetStreamContext
from runtime_helpers import (  # type: ignore[import-not-found]
    GVISOR,
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
    # Docker's init and tini as root, the channel's holder as `channel`, the rest the agent's
    # (under gVisor there is no Docker init: tini is PID 1).
    users = [line.split()[0] for line in seen.splitlines()[1:-2] if line.strip()]
    privileged = ["root", "channel"] if GVISOR else ["root", "root", "channel"]
    assert users[: len(privileged)] == privileged, seen
    assert set(users[len(privileged) :]) == {"sandbox"}, seen
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
        "touch /etc/x 2>&1 | grep -c '${REFUSAL}'; mount | grep -c ' /workspace '"
        # The read-only root: EROFS from Linux; gVisor's overlay answers EACCES.
        .replace("${REFUSAL}", "Permission denied" if GVISOR else "Read-only"),
    )
    assert "FOUND" not in seen
    assert seen.split() == ["lo", "1000", "1", "1"]
    await ctl.release()


async def test_the_executors_channel_is_out_of_the_agents_reach(
    runtime: Runtime, js: JetStreamContext
) -> None:
    """Only root's docker-init and tini and the holder (uid 999, not dumpable) hold the channel;
    the executor (uid 1000 like the agent, not dumpable) holds pipes to the holder. From a
    command, none of their descriptors opens for writing or reading, none of them can be read
    as a tracer would, and the processes of other uids cannot be signalled; the sandbox works
    on."""
    task_id, ctl = await _task(runtime, js)
    seen = await _out(
        ctl,
        task_id,
        "HOLDER=$(ps -o ppid= -p $PPID | tr -d ' '); echo holder $HOLDER executor $PPID; "
        "for p in 1 $HOLDER $PPID; do "
        "  printf 'not-json-probe\\n' > /proc/$p/fd/1; printf x > /proc/$p/fd/0; "
        "  head -c 1 /proc/$p/fd/0; ls /proc/$p/fd; head -c 1 /proc/$p/environ; "
        "done; kill -TERM 1 $HOLDER; echo END; "
        "grep -E '^(Uid|CapEff)' /proc/$HOLDER/status /proc/$PPID/status; echo alive",
    )
    lines = seen.splitlines()
    holder, executor = lines[0].split()[1], lines[0].split()[3]
    attempts = lines[1 : lines.index("END")]
    if GVISOR:
        # gVisor (Debian's 20221219) refuses every open of another process' descriptors and
        # both signals, but lets uid 1000 list /proc/<pid>/fd and read /proc/<pid>/environ of
        # the root and uid-999 processes (Linux refuses both: ptrace access mode). What they
        # show: descriptor numbers, and the image's environment (no secret is ever in it).
        assert seen.count("Permission denied") == 9, seen  # 3 processes x 3 opens
        assert seen.count("Operation not permitted") == 2, seen
        assert "cannot access '/proc/1/fd'" not in seen, seen
        assert f"/proc/{holder}/status:Uid:\t999\t999\t999\t999" in seen
        assert seen.count("CapEff:\t0000000000000000") == 2
        assert seen.strip().endswith("alive")
        assert (await _out(ctl, task_id, "echo works")).strip() == "works"
        await ctl.release()
        return
    # 3 processes x (write fd 1, write fd 0, read fd 0, list fds, read what only a tracer may),
    # refused by the kernel; then the two signals.
    assert len(attempts) == 17, seen
    assert all(line.endswith("Permission denied") for line in attempts[:15]), seen
    assert all(line.endswith("Operation not permitted") for line in attempts[15:]), seen
    assert f"/proc/{holder}/status:Uid:\t999\t999\t999\t999" in seen
    assert f"/proc/{executor}/status:Uid:\t1000\t1000\t1000\t1000" in seen
    assert seen.count("CapEff:\t0000000000000000") == 2  # no capability left in either
    assert seen.strip().endswith("alive")
    assert (await _out(ctl, task_id, "echo works")).strip() == "works"
    await ctl.release()


async def test_ending_its_own_executor_ends_only_its_own_sandbox(
    runtime: Runtime, js: JetStreamContext
) -> None:
    """Signals to PID 1 (root's docker-init) are refused. The agent can still kill its own
    executor (the same uid): `kill -KILL -1` ends its own sandbox, it is told so and gets a
    fresh one; its neighbour notices nothing."""
    task_id, ctl = await _task(runtime, js)
    other, ctl_other = await _task(runtime, js)
    await _out(ctl_other, other, "echo kept > /workspace/mine.txt")
    refused = await _out(ctl, task_id, "kill -KILL 1; kill -TERM 1; echo survived")
    assert refused.count("Operation not permitted") == 2 and "survived" in refused, refused
    ended = await ctl.run(cmd(task_id, "kill -KILL -1; sleep 10"))
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
    # E2BIG from Linux; gVisor refuses a single argument past its limit with ENAMETOOLONG.
    refusal = "File name too long" if GVISOR else "Argument list too long"
    assert refusal in seen and seen.strip().endswith("after"), seen
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
