"""Runtime replicas with names: an order goes to the replica holding the task's sandbox, and a
replica that is gone strands nothing.

Two runtimes with their own names (`node-a`, `node-b`) on this machine's one Docker engine, one
NATS server of the module's own, the session's Redis. "Another engine" is a binding naming a
container this engine does not have, held by a replica that is gone: what a replica sees of a
dead node's sandbox.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import docker
import nats
import pytest
from nats.js import JetStreamContext
from redis.asyncio import Redis
from runtime_helpers import (  # type: ignore[import-not-found]
    Controller,
    Runtime,
    await_approved,
    cmd,
    make_settings,
    remove_pool_containers,
)

from services.runtime.bindings import TaskBindings
from services.runtime.settings import RuntimeSettings
from shared.commands import ExecuteAction
from shared.events import CmdOutputObservation, ErrorObservation
from shared.settings import CommonSettings
from shared.subjects import Service, routed_subject
from shared.workspace import (
    WORKSPACE_SUBJECT,
    WorkspaceOp,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
)

pytestmark = pytest.mark.docker

TTL_S = 3


@pytest.fixture(scope="module")
def pool(docker_client: docker.DockerClient) -> Iterator[str]:
    name = f"test-replicas-{uuid.uuid4().hex[:6]}"
    yield name
    remove_pool_containers(docker_client, name)


def _settings(base: CommonSettings, image: str, pool: str, replica: str) -> RuntimeSettings:
    return make_settings(base, image, pool, runtime_replica=replica, replica_ttl_s=TTL_S)


@pytest.fixture(scope="module")
async def node_a(
    isolated_settings: CommonSettings, sandbox_image: str, pool: str
) -> AsyncIterator[Runtime]:
    rt = Runtime(_settings(isolated_settings, sandbox_image, pool, "node-a"))
    await rt.start()
    yield rt
    await rt.stop()


@pytest.fixture(scope="module")
async def node_b(
    isolated_settings: CommonSettings, sandbox_image: str, pool: str, node_a: Runtime
) -> AsyncIterator[Runtime]:
    rt = Runtime(_settings(isolated_settings, sandbox_image, pool, "node-b"))
    await rt.start()
    yield rt
    await rt.stop()


async def _send_to(js: JetStreamContext, ctl: Controller, replica: str, command: str) -> str:
    """Order an action into one replica's queue, as the controller routes it."""
    action = cmd(ctl.task_id, command)
    await await_approved(ctl.redis_url, ctl.task_id, action)
    order = ExecuteAction(task_id=ctl.task_id, action=action)
    await js.publish(
        routed_subject(Service.RUNTIME, replica, ctl.task_id),
        order.model_dump_json().encode(),
        headers={"Nats-Msg-Id": order.id},
    )
    return action.id


async def test_an_order_reaching_another_replica_is_passed_on_to_the_holder(
    js: JetStreamContext, node_a: Runtime, node_b: Runtime, isolated_settings: CommonSettings
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, isolated_settings.redis_url)
    first = await ctl.run(cmd(task_id, "echo once >> /workspace/log; hostname"))
    assert isinstance(first, CmdOutputObservation)
    holder = first.runtime_replica
    assert holder in {"node-a", "node-b"}
    other = "node-b" if holder == "node-a" else "node-a"
    holding = node_a if holder == "node-a" else node_b
    assert holding.service.tasks.local(task_id) is not None

    # The next order reaches the other replica (a controller that did not know the holder):
    # it is passed on, and runs in the same sandbox, once.
    action_id = await _send_to(
        js, ctl, other, "echo twice >> /workspace/log; hostname; cat /workspace/log"
    )
    second = await ctl.receive()
    assert second.cause == action_id
    assert isinstance(second, CmdOutputObservation)
    assert second.runtime_replica == holder
    lines = second.content.split()
    assert lines[0] == first.content.split()[0]  # the same container
    assert lines[1:] == ["once", "twice"]
    assert await ctl.nothing_within(1.0)
    other_runtime = node_b if holding is node_a else node_a
    assert other_runtime.service.tasks.local(task_id) is None
    await ctl.release()


async def test_a_sandbox_on_a_gone_replica_s_engine_is_reported_lost_then_replaced(
    js: JetStreamContext, node_a: Runtime, node_b: Runtime, isolated_settings: CommonSettings
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, isolated_settings.redis_url)
    redis = Redis.from_url(isolated_settings.redis_url)
    try:
        # Bound on "node-gone"'s engine (a container id this engine has not), which sends no
        # heartbeat any more.
        gone = TaskBindings(redis, node_a.settings.pool_name, 3600, "node-gone")
        await gone.bind(task_id, "f" * 64)
        assert await gone.holder(task_id) == "node-gone"
    finally:
        await redis.aclose()

    lost = await ctl.run(cmd(task_id, "echo never"))
    assert isinstance(lost, ErrorObservation) and lost.error_code == "sandbox_lost"
    assert lost.runtime_replica is None  # the next order goes to any replica
    fresh = await ctl.run(cmd(task_id, "ls -A /workspace | wc -l"))
    assert isinstance(fresh, CmdOutputObservation)
    assert fresh.content.strip() == "0"  # a fresh, empty workspace
    assert fresh.runtime_replica in {"node-a", "node-b"}
    holding = node_a if fresh.runtime_replica == "node-a" else node_b
    assert await holding.service.bindings.holder(task_id) == fresh.runtime_replica
    await ctl.release()


async def test_the_queue_of_a_gone_replica_is_handed_to_the_others(
    js: JetStreamContext, node_a: Runtime, node_b: Runtime, isolated_settings: CommonSettings
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, isolated_settings.redis_url)
    # Routed to a replica that died before taking it (no heartbeat of its name).
    action_id = await _send_to(js, ctl, "node-dead", "echo ran")
    # Not at once (its name is silent for TTL_S, then as long again), but then by a survivor.
    assert await ctl.nothing_within(TTL_S * 0.8)
    obs = await ctl.receive(timeout=TTL_S * 6)
    assert obs.cause == action_id
    assert isinstance(obs, CmdOutputObservation) and obs.content.strip() == "ran"
    assert obs.runtime_replica in {"node-a", "node-b"}
    assert await ctl.nothing_within(1.0)
    info = await js.stream_info("DECKHANDS_ROUTED", subjects_filter=">")
    assert not info.state.subjects  # nothing left queued for anyone
    await ctl.release()


async def test_a_workspace_request_is_answered_by_the_replica_holding_the_sandbox(
    js: JetStreamContext, node_a: Runtime, node_b: Runtime, isolated_settings: CommonSettings
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, isolated_settings.redis_url)
    first = await ctl.run(cmd(task_id, "echo kept > /workspace/note.txt"))
    holding, other = (node_a, node_b) if first.runtime_replica == "node-a" else (node_b, node_a)
    handled: dict[str, int] = {"node-a": 0, "node-b": 0}
    originals = {}
    for rt in (node_a, node_b):
        originals[rt.service.replica] = original = rt.service.workspace.handle

        async def counted(
            request: WorkspaceRequest, _rt: Runtime = rt, _orig: Any = original
        ) -> Any:
            handled[_rt.service.replica] += 1
            return await _orig(request)

        rt.service.workspace.handle = counted  # type: ignore[method-assign]
    transfers = WorkspaceTransfers(lambda: js)
    nc = await nats.connect(isolated_settings.nats_url)
    try:
        request = WorkspaceRequest(
            op=WorkspaceOp.GET_FILE, task_id=task_id, path="note.txt", max_bytes=4096
        )
        for _ in range(6):  # the queue group gives some to each replica
            msg = await nc.request(WORKSPACE_SUBJECT, request.model_dump_json().encode(), 30)
            reply = WorkspaceReply.model_validate_json(msg.data)
            assert reply.status is WorkspaceStatus.OK, reply
            assert reply.object is not None
            out = io.BytesIO()
            await transfers.get(reply.object, out)
            await transfers.delete(reply.object)
            assert out.getvalue() == b"kept\n"
    finally:
        await nc.close()
        for rt in (node_a, node_b):
            rt.service.workspace.handle = originals[rt.service.replica]  # type: ignore[method-assign]
    # Every request was served from the holder's engine: the other replica passed its share on.
    assert handled == {holding.service.replica: 6, other.service.replica: 0}
    await ctl.release()
