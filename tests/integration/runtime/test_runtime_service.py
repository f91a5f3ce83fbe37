"""The runtime service end to end: real NATS JetStream, Redis and Docker.

Work orders go to the runtime's work subject; observations are read from the controller's, as
the controller would, with a plain nats-py consumer filtered on the task.
"""

from __future__ import annotations

import asyncio
import ipaddress
import uuid
from typing import Any

import docker
import pytest
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import (  # type: ignore[import-not-found]
    GVISOR,
    Controller,
    Runtime,
    cmd,
    differs_under_gvisor,
    eventually,
)

from services.runtime.actions import observation_id
from services.runtime.containers import (
    LABEL_POOL,
    task_container_name,
)
from shared.commands import ExecuteAction, PrepareSandbox
from shared.events import (
    AgentState,
    AnswerMissingObservation,
    CmdOutputObservation,
    ErrorObservation,
    EventAdapter,
    EventSource,
    FileReadAction,
    FileReadObservation,
    PythonOutputObservation,
    RunPythonAction,
)
from shared.sandbox_protocol.session import answers
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import WORK_STREAM, Service, work_subject

pytestmark = pytest.mark.docker


async def test_actions_run_in_the_tasks_sandbox_and_release_destroys_it(
    runtime: Runtime,
    js: JetStreamContext,
    docker_client: docker.DockerClient,
    redis: Redis,
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)

    first = await ctl.run(cmd(task_id, "mkdir -p src && cd src && export COLOR=blue"))
    assert isinstance(first, CmdOutputObservation)
    assert (first.exit_code, first.cwd) == (0, "/workspace/src")
    assert first.source is EventSource.ENVIRONMENT and first.task_id == task_id
    assert first.cause is not None and first.id == observation_id(first.cause)

    second = await ctl.run(cmd(task_id, "echo $COLOR > color.txt; cat color.txt; pwd"))
    assert isinstance(second, CmdOutputObservation)
    assert second.content.split() == ["blue", "/workspace/src"]

    py = await ctl.run(
        RunPythonAction(
            task_id=task_id,
            source=EventSource.AGENT,
            code="data = open('/workspace/src/color.txt').read()\ndata",
        )
    )
    assert isinstance(py, PythonOutputObservation) and "'blue\\n'" in py.content

    read = await ctl.run(
        FileReadAction(task_id=task_id, source=EventSource.AGENT, path="src/color.txt")
    )
    assert isinstance(read, FileReadObservation) and read.content == "blue\n"

    await runtime.service.tasks.renamed(task_id)
    container = docker_client.containers.get(task_container_name(task_id))
    assert container.labels[LABEL_POOL] == runtime.settings.pool_name
    assert container.labels["deckhands.role"] == "sandbox"
    bound = await redis.get(f"deckhands:runtime:{runtime.settings.pool_name}:task:{task_id}")
    # The container, and the replica whose engine holds it (where the task's orders go).
    assert bound == f"{container.id}@{runtime.service.replica}".encode()

    await ctl.release()

    async def gone() -> bool:
        try:
            docker_client.containers.get(container.id)
        except docker.errors.NotFound:
            return True
        return False

    await eventually(gone)
    assert await redis.get(f"deckhands:runtime:{runtime.settings.pool_name}:task:{task_id}") is None


@differs_under_gvisor("/proc/self/cgroup is empty")
async def test_tasks_get_different_sandboxes_and_cannot_see_each_other(
    runtime: Runtime, js: JetStreamContext
) -> None:
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    ctl_a = await Controller.for_task(js, a, runtime.settings.redis_url)
    ctl_b = await Controller.for_task(js, b, runtime.settings.redis_url)
    await ctl_a.run(cmd(a, "echo secret-a > /workspace/mine.txt; echo x > /tmp/a-tmp"))
    seen = await ctl_b.run(cmd(b, "ls /workspace /tmp; cat /workspace/mine.txt"))
    assert isinstance(seen, CmdOutputObservation)
    assert "secret-a" not in seen.content and "a-tmp" not in seen.content
    assert seen.exit_code != 0  # cat: no such file
    ids = [
        (await ctl.run(cmd(t, "cat /proc/self/cgroup | head -1")))  # one container each
        for ctl, t in ((ctl_a, a), (ctl_b, b))
    ]
    assert ids[0].content != ids[1].content
    await ctl_a.release()
    await ctl_b.release()


async def test_redelivered_action_is_answered_from_the_ledger_not_rerun(
    runtime: Runtime, js: JetStreamContext, redis: Redis
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    action = cmd(task_id, "echo ran >> /workspace/count.txt; wc -l < /workspace/count.txt")
    await ctl.send(action)
    first = await ctl.receive()
    assert isinstance(first, CmdOutputObservation) and first.content.strip() == "1"

    # The same action again, as a redelivery would bring it (a new message, same action).
    await ctl.send(action)
    # The republished observation has the same id: JetStream's de-duplication drops it, and the
    # controller would have recognised it anyway.
    assert await ctl.nothing_within(1.5)
    recorded = await redis.get(f"deckhands:runtime:observation:{action.id}")
    assert recorded is not None
    assert EventAdapter.validate_json(recorded) == first

    # Called directly, the service republishes the recorded observation, unchanged.
    published: list[Any] = []
    original = runtime.service.publish

    async def capture(event: Any) -> None:
        published.append(event)

    runtime.service.publish = capture
    try:
        await runtime.service.execution.execute(ExecuteAction(task_id=task_id, action=action))
    finally:
        runtime.service.publish = original
    assert published == [first]

    count = await ctl.run(cmd(task_id, "wc -l < /workspace/count.txt"))
    assert count.content.strip() == "1"  # ran once
    await ctl.release()


async def test_dead_sandbox_is_reported_and_replaced(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    await ctl.run(cmd(task_id, "echo precious > /workspace/keep.txt"))
    await runtime.service.tasks.renamed(task_id)
    old = docker_client.containers.get(task_container_name(task_id))

    # Killed during an action.
    await ctl.send(cmd(task_id, "sleep 20"))
    await asyncio.sleep(1.0)
    old.kill()
    died = await ctl.receive()
    assert isinstance(died, ErrorObservation)
    assert died.error_code == "sandbox_lost"
    assert "workspace was lost" in died.content

    fresh = await ctl.run(cmd(task_id, "ls /workspace; echo alive"))
    assert isinstance(fresh, CmdOutputObservation)
    assert fresh.content.split() == ["alive"]
    await runtime.service.tasks.renamed(task_id)
    new = docker_client.containers.get(task_container_name(task_id))
    assert new.id != old.id

    # Killed between actions.
    new.kill()
    await asyncio.sleep(0.5)
    between = await ctl.run(cmd(task_id, "echo never"))
    assert isinstance(between, ErrorObservation) and between.error_code == "sandbox_lost"
    assert "was not run" in between.content
    again = await ctl.run(cmd(task_id, "echo back"))
    assert isinstance(again, CmdOutputObservation) and again.content == "back\n"
    await ctl.release()


async def test_warm_pool_hands_out_ready_sandboxes_and_refills(runtime: Runtime) -> None:
    pool = runtime.service.pool

    async def refilled() -> bool:
        return pool.idle >= 1 and pool.creating == 0

    await eventually(refilled)
    before = {s.container_id for s in pool._idle}
    sandbox = await pool.acquire()
    assert sandbox.container_id in before  # a hit
    assert await answers(sandbox.session, 2.0)
    await eventually(refilled)
    assert sandbox.container_id not in {s.container_id for s in pool._idle}
    await pool.discard(sandbox.container_id, "test")


@differs_under_gvisor(
    "runsc needs --network=none here (its root-netns check misfires on Linux 6.x): no egress"
)
async def test_network_egress_is_opt_in_per_task(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient
) -> None:
    """A task that opted in reaches a server on the host; a task that did not has no network.
    The host's end of Docker's bridge stands in for the internet, which this machine lacks."""
    bridge = docker_client.networks.get(runtime.settings.sandbox_network_name)
    ipam = bridge.attrs["IPAM"]["Config"][0]
    # Docker leaves Gateway out when it is the subnet's first address.
    gateway_ip = ipam.get("Gateway") or str(ipaddress.ip_network(ipam["Subnet"])[1])

    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-outside")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "0.0.0.0", 0)
    port = server.sockets[0].getsockname()[1]
    dial = (
        "import socket\n"
        "try:\n"
        f"    print(socket.create_connection(({gateway_ip!r}, {port}), 5).recv(64).decode())\n"
        "except OSError as exc:\n"
        "    print('no route:', exc)\n"
    )
    online, offline = uuid.uuid4().hex, uuid.uuid4().hex
    ctl_on = await Controller.for_task(js, online, runtime.settings.redis_url, network_egress=True)
    ctl_off = await Controller.for_task(js, offline, runtime.settings.redis_url)
    try:

        async def warm() -> bool:
            return runtime.service.pool.idle >= 1

        await eventually(warm, timeout=60)
        warm_before = {
            c.id
            for c in docker_client.containers.list(
                filters={
                    "label": f"{LABEL_POOL}={runtime.settings.pool_name}",
                    "name": "deckhands-idle-",
                }
            )
        }
        reached = await ctl_on.run(
            RunPythonAction(task_id=online, source=EventSource.AGENT, code=dial)
        )
        assert isinstance(reached, PythonOutputObservation)
        assert "hello-from-outside" in reached.content, reached.content
        blocked = await ctl_off.run(
            RunPythonAction(task_id=offline, source=EventSource.AGENT, code=dial)
        )
        assert isinstance(blocked, PythonOutputObservation)
        assert "no route" in blocked.content and "hello" not in blocked.content

        await runtime.service.tasks.renamed(online)
        container = docker_client.containers.get(task_container_name(online))
        assert container.labels["deckhands.network"] == bridge.name
        assert container.attrs["HostConfig"]["NetworkMode"] == bridge.name
        # The rest of the hardening holds for a networked sandbox too.
        assert container.attrs["HostConfig"]["CapDrop"] == ["ALL"]
        assert container.attrs["HostConfig"]["ReadonlyRootfs"] is True
        # Started for this task: no warm (offline) sandbox was given a network.
        assert warm_before and container.id not in warm_before
    finally:
        server.close()
        await ctl_on.release()
        await ctl_off.release()

    async def gone() -> bool:
        return not docker_client.containers.list(
            all=True, filters={"name": task_container_name(online)}
        )

    await eventually(gone)


async def test_a_prepared_sandbox_is_bound_before_the_first_action_and_used_by_it(
    runtime: Runtime,
    js: JetStreamContext,
    redis: Redis,
) -> None:
    task_id = uuid.uuid4().hex
    store = TaskStateStore(redis)
    await store.create(
        TaskState(task_id=task_id, task="x", max_iterations=5, agent_state=AgentState.RUNNING)
    )
    binding = f"deckhands:runtime:{runtime.settings.pool_name}:task:{task_id}"
    order = PrepareSandbox(task_id=task_id)
    await js.publish(
        work_subject(Service.RUNTIME, task_id),
        order.model_dump_json().encode(),
        headers={"Nats-Msg-Id": order.id},
    )

    async def bound() -> bool:
        return await redis.get(binding) is not None

    await eventually(bound)
    prepared = await redis.get(binding)
    seats = await runtime.service.seats.seated()
    assert task_id in seats  # the sandbox holds one of the pool's seats
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    first = await ctl.run(cmd(task_id, "echo ready"))
    assert isinstance(first, CmdOutputObservation) and first.content.strip() == "ready"
    assert await redis.get(binding) == prepared  # the first action used the prepared one

    await ctl.release()

    async def seat_freed() -> bool:
        return task_id not in await runtime.service.seats.seated()

    await eventually(seat_freed)


async def test_no_sandbox_is_prepared_for_a_task_that_already_ended(
    runtime: Runtime,
    redis: Redis,
) -> None:
    task_id = uuid.uuid4().hex
    store = TaskStateStore(redis)
    await store.create(
        TaskState(task_id=task_id, task="x", max_iterations=5, agent_state=AgentState.STOPPED)
    )
    await runtime.service.seating.prepare(PrepareSandbox(task_id=task_id))
    assert await redis.get(f"deckhands:runtime:{runtime.settings.pool_name}:task:{task_id}") is None
    assert task_id not in await runtime.service.seats.seated()


async def test_an_order_for_an_unknown_task_is_refused_without_a_sandbox(
    runtime: Runtime,
    js: JetStreamContext,
    redis: Redis,
) -> None:
    task_id = uuid.uuid4().hex  # no State: forged, or its task was deleted
    answers = await js.pull_subscribe(
        work_subject(Service.CONTROLLER, task_id), durable=None, stream=WORK_STREAM
    )
    action = cmd(task_id, "echo should not run")
    order = ExecuteAction(task_id=task_id, action=action)
    await js.publish(
        work_subject(Service.RUNTIME, task_id),
        order.model_dump_json().encode(),
        headers={"Nats-Msg-Id": order.id},
    )
    [msg] = await answers.fetch(1, timeout=30)
    notice = EventAdapter.validate_json(msg.data)
    assert isinstance(notice, AnswerMissingObservation) and notice.cause == action.id
    assert notice.why == "dead_lettered" and "unknown task" in notice.detail
    assert await redis.get(f"deckhands:runtime:{runtime.settings.pool_name}:task:{task_id}") is None
    assert task_id not in await runtime.service.seats.seated()
    assert runtime.service.tasks.local(task_id) is None


async def test_a_long_output_is_cut_and_kept_whole_in_the_blob_store(
    runtime: Runtime, js: JetStreamContext
) -> None:
    from shared.blobs import BlobMissing, BlobStore

    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    blobs = BlobStore(lambda: js)
    # About 1.9 MB of output: more than a NATS message may carry, kept whole outside the event.
    whole = "".join(f"line {i} é€\n" for i in range(1, 150_001))
    big = await ctl.run(cmd(task_id, 'for i in $(seq 1 150000); do echo "line $i é€"; done'))
    assert isinstance(big, CmdOutputObservation) and big.exit_code == 0
    assert "characters cut from the middle" in big.content
    assert len(big.content) < runtime.settings.output_limit + 200
    assert big.content_ref is not None and big.content_ref.size == len(whole.encode())
    assert (await blobs.get(task_id, big.content_ref.sha256)).decode() == whole

    short = await ctl.run(cmd(task_id, "echo short"))
    assert isinstance(short, CmdOutputObservation) and short.content_ref is None

    cell = await ctl.run(
        RunPythonAction(task_id=task_id, source=EventSource.AGENT, code="print('x' * 100_000)")
    )
    assert isinstance(cell, PythonOutputObservation) and cell.content_ref is not None
    assert await blobs.get(task_id, cell.content_ref.sha256) == b"x" * 100_000 + b"\n"

    await ctl.run(cmd(task_id, "seq 1 100000 > numbers.txt"))
    read = await ctl.run(
        FileReadAction(task_id=task_id, source=EventSource.AGENT, path="numbers.txt")
    )
    assert isinstance(read, FileReadObservation) and read.content_ref is not None
    numbers = "".join(f"{i}\n" for i in range(1, 100_001)).encode()
    assert await blobs.get(task_id, read.content_ref.sha256) == numbers
    with pytest.raises(BlobMissing):
        await blobs.get(uuid.uuid4().hex, read.content_ref.sha256)
    await ctl.release()


async def test_file_actions_on_a_fifo_or_device_are_refused_and_the_workspace_stays(
    runtime: Runtime, js: JetStreamContext
) -> None:
    from shared.events import FileWriteAction

    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    await ctl.run(cmd(task_id, "mkfifo pipe && echo kept > notes.txt"))
    started = asyncio.get_running_loop().time()
    for action in (
        FileReadAction(task_id=task_id, source=EventSource.AGENT, path="pipe"),
        FileWriteAction(task_id=task_id, source=EventSource.AGENT, path="pipe", content="x"),
        FileReadAction(task_id=task_id, source=EventSource.AGENT, path="/dev/zero"),
    ):
        refused = await ctl.run(action)
        assert isinstance(refused, ErrorObservation), refused
        assert refused.error_code == "not_a_regular_file"
    assert asyncio.get_running_loop().time() - started < 10  # no wait for a 60 s timeout
    after = await ctl.run(cmd(task_id, "cat notes.txt"))
    assert isinstance(after, CmdOutputObservation) and after.content.strip() == "kept"
    await ctl.release()


@pytest.mark.skipif(
    GVISOR,
    reason="gVisor (Debian's runsc 0.0~20221219): after the 50 MB flood through docker exec the "
    "task's next sandbox was lost once and the test hung once (passed once): not yet explained",
)
async def test_a_foreign_writer_on_the_channel_ends_only_that_sandbox(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient
) -> None:
    """The agent cannot reach the executor's channel (test_runtime_hostile), but the runtime
    does not count on it: a process that did (here a `docker exec` as root, the uid of Docker's
    init) writing a foreign line, or a flood of bytes with no end of line, ends that sandbox
    with the reason, and costs the runtime no more than a bounded buffer (issue 10)."""
    import resource

    for probe, seen in (
        ("printf 'not-json-probe\\n' > /proc/1/fd/1", "not the executor's"),
        ("head -c 50000000 /dev/zero > /proc/1/fd/1", "more than 4,194,304 bytes"),
    ):
        task_id = uuid.uuid4().hex
        ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
        first = await ctl.run(cmd(task_id, "echo before > /workspace/a.txt"))
        assert isinstance(first, CmdOutputObservation)
        await runtime.service.tasks.renamed(task_id)
        container = docker_client.containers.get(task_container_name(task_id))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        running = asyncio.ensure_future(ctl.run(cmd(task_id, "sleep 50", timeout_s=60)))
        await asyncio.sleep(0.5)
        await asyncio.wait_for(
            asyncio.to_thread(container.exec_run, ["sh", "-c", probe], user="0"), 60
        )
        ended = await asyncio.wait_for(running, 60)
        assert isinstance(ended, ErrorObservation) and ended.error_code == "sandbox_lost", ended
        assert seen in ended.content, ended.content
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
        assert grown_kib < 64 * 1024, grown_kib  # the flood was not buffered
        fresh = await ctl.run(cmd(task_id, "ls /workspace; echo fresh"))
        assert isinstance(fresh, CmdOutputObservation) and fresh.content.strip() == "fresh"
        await ctl.release()
