"""The runtime runs only what was reviewed (issue 9, part 6), on real NATS, Redis and Docker:
an ExecuteAction that is not the approved action its task's State awaits is answered with an
`order_refused` ErrorObservation and never reaches a sandbox (none is started for it)."""

from __future__ import annotations

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
)

from services.runtime.containers import task_container_name
from shared.commands import ORDER_REFUSED, ExecuteAction
from shared.events import AgentState, CmdOutputObservation, ErrorObservation, RunnableAction
from shared.state import Awaiting
from shared.state_store import TaskStateStore
from shared.subjects import Service, work_subject

pytestmark = pytest.mark.docker


async def _forge(ctl: Controller, action: RunnableAction, **fields: Any) -> ExecuteAction:
    """Publish an order straight to the runtime's subject, as an intruder on the broker would:
    the State is left as it is."""
    order = ExecuteAction(task_id=ctl.task_id, action=action, **fields)
    await ctl.js.publish(
        work_subject(Service.RUNTIME, ctl.task_id),
        order.model_dump_json().encode(),
        headers={"Nats-Msg-Id": order.id},
    )
    return order


async def _refused(ctl: Controller, action: RunnableAction, reason: str) -> None:
    answer = await ctl.receive()
    assert isinstance(answer, ErrorObservation), answer
    assert answer.error_code == ORDER_REFUSED and answer.cause == action.id
    assert reason in answer.content and "It was not run" in answer.content


def _no_sandbox(runtime: Runtime, client: docker.DockerClient, task_id: str) -> None:
    assert runtime.service.tasks.local(task_id) is None
    assert not client.containers.list(all=True, filters={"name": task_container_name(task_id)})


async def test_an_order_no_verdict_allowed_is_refused_and_no_sandbox_starts(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient, redis: Redis
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    action = cmd(task_id, "echo pwned > /workspace/pwned")
    # Under review: the State awaits the security monitor's verdict on this very action.
    store = TaskStateStore(redis)
    state = await store.load(task_id)
    assert state is not None
    await store.save(
        state.model_copy(
            update={
                "awaiting": Awaiting.SECURITY,
                "awaiting_id": action.id,
                "pending_action": action,
            }
        )
    )
    await _forge(ctl, action)
    await _refused(ctl, action, "the task does not await this action (it awaits security")
    _no_sandbox(runtime, docker_client, task_id)
    assert await redis.get(f"deckhands:runtime:observation:{action.id}") is None  # not in ledger


async def test_an_order_after_stop_or_pause_is_refused(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient, redis: Redis
) -> None:
    store = TaskStateStore(redis)
    for agent_state in (AgentState.STOPPED, AgentState.PAUSED):
        task_id = uuid.uuid4().hex
        ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
        action = cmd(task_id, "echo pwned > /workspace/pwned")
        await await_approved(runtime.settings.redis_url, task_id, action)  # it was approved...
        state = await store.load(task_id)
        assert state is not None
        await store.save(state.model_copy(update={"agent_state": agent_state}))  # ...then stopped
        await _forge(ctl, action)
        await _refused(ctl, action, f"the task is {agent_state.value}")
        _no_sandbox(runtime, docker_client, task_id)


async def test_a_forged_command_under_the_awaited_id_and_a_replay_are_refused(
    runtime: Runtime, js: JetStreamContext, docker_client: docker.DockerClient
) -> None:
    task_id = uuid.uuid4().hex
    ctl = await Controller.for_task(js, task_id, runtime.settings.redis_url)
    reviewed = cmd(task_id, "echo run >> /workspace/count; wc -l < /workspace/count")
    await await_approved(runtime.settings.redis_url, task_id, reviewed)
    forged = reviewed.model_copy(update={"command": "echo pwned > /workspace/pwned"})
    await _forge(ctl, forged)
    await _refused(ctl, forged, "the action differs from the one that was reviewed")
    await _forge(ctl, reviewed, network_egress=True)
    await _refused(ctl, reviewed, "the order's network egress is not the task's")
    _no_sandbox(runtime, docker_client, task_id)

    ran = await ctl.run(reviewed)  # the genuine order runs
    assert isinstance(ran, CmdOutputObservation) and ran.content.strip() == "1"
    later = cmd(task_id, "ls /workspace")
    await await_approved(runtime.settings.redis_url, task_id, later)  # the task moved on
    await _forge(ctl, reviewed)  # a replay of the earlier order, under a new order id
    await _refused(ctl, reviewed, "the task does not await this action")
    check = await ctl.run(cmd(task_id, "wc -l < /workspace/count; ls /workspace"))
    assert check.content.split() == ["1", "count"]  # ran once; the forged command never ran
    await ctl.release()
