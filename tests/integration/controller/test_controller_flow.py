"""The controller with security and storage on real NATS and Redis; the test plays reasoner
and runtime, so every hop of the loop is visible. Two controller replicas share the work."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from faststream import FastStream
from nats.js import JetStreamContext
from redis.asyncio import Redis

from services.controller.main import build_app as build_controller
from services.controller.settings import ControllerSettings
from services.security.main import build_app as build_security
from services.security.settings import SecuritySettings
from services.storage.main import build_app as build_storage
from services.storage.settings import StorageSettings
from shared.commands import (
    ExecuteAction,
    ForgetTaskRequest,
    HistoryReply,
    HistoryRequest,
    PrepareSandbox,
    ReleaseSandbox,
    StepRequest,
)
from shared.events import (
    AgentFinishAction,
    AgentState,
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    MessageAction,
    TaskCreatedObservation,
    new_id,
)
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import (
    DELETIONS_STREAM,
    HISTORY_SUBJECT,
    WORK_STREAM,
    Service,
    deletion_subject,
    work_subject,
)
from shared.task_creation import (
    CREATION_REQUEST,
    creation_key,
    creation_request,
    first_message,
)


def _common(settings: CommonSettings) -> dict[str, Any]:
    return settings.model_dump(include=set(CommonSettings.model_fields))


@pytest.fixture(scope="module")
async def system(
    isolated_settings: CommonSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[CommonSettings]:
    common = _common(isolated_settings)
    data = Path(tmp_path_factory.mktemp("storage"))
    apps: list[FastStream] = [
        build_controller(ControllerSettings(**common)),
        build_controller(ControllerSettings(**common)),
        build_security(SecuritySettings(**common)),
        build_storage(StorageSettings(**common, data_dir=data)),
    ]
    for app in apps:
        await app.start()
    yield isolated_settings
    for app in apps:
        await app.stop()


class Peer:
    """Plays one service: reads a task's work subject, answers on the controller's."""

    def __init__(self, js: JetStreamContext, sub: Any) -> None:
        self.js, self.sub = js, sub

    @classmethod
    async def create(cls, js: JetStreamContext, service: Service, task_id: str) -> Peer:
        sub = await js.pull_subscribe(
            work_subject(service, task_id), durable=None, stream=WORK_STREAM
        )
        return cls(js, sub)

    async def receive(self, timeout: float = 10) -> dict[str, Any]:
        msgs = await self.sub.fetch(1, timeout=timeout)
        await msgs[0].ack()
        return dict(json.loads(msgs[0].data))

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await self.sub.fetch(1, timeout=seconds)
        except nats.errors.TimeoutError:
            return True
        return False


async def _answer(js: JetStreamContext, event: EventBase, msg_id: str | None = None) -> None:
    await js.publish(
        work_subject(Service.CONTROLLER, event.task_id),
        event.model_dump_json().encode(),
        headers={"Nats-Msg-Id": msg_id or event.id, "content-type": "application/json"},
    )


async def _wait_state(store: TaskStateStore, task_id: str, state: AgentState) -> TaskState:
    for _ in range(200):
        loaded = await store.load(task_id)
        if loaded is not None and loaded.agent_state is state:
            return loaded
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {state}: {loaded}")


@dataclass
class Harness:
    """One fresh task, with the test standing in for its reasoner and runtime."""

    task_id: str
    store: TaskStateStore
    nc: nats.aio.client.Client
    js: JetStreamContext
    reasoner: Peer
    runtime: Peer


@pytest.fixture
async def harness(system: CommonSettings) -> AsyncIterator[Harness]:
    task_id = uuid.uuid4().hex
    redis = Redis.from_url(system.redis_url)
    nc = await nats.connect(system.nats_url)
    js = nc.jetstream()
    try:
        yield Harness(
            task_id,
            TaskStateStore(redis),
            nc,
            js,
            await Peer.create(js, Service.REASONER, task_id),
            await Peer.create(js, Service.RUNTIME, task_id),
        )
    finally:
        await nc.close()
        await redis.aclose()


async def test_one_task_through_the_loop_with_redelivery(harness: Harness) -> None:
    task_id, store, nc, js = harness.task_id, harness.store, harness.nc, harness.js
    reasoner, runtime = harness.reasoner, harness.runtime
    assert await store.create(TaskState(task_id=task_id, task="list files", max_iterations=5))
    await _answer(js, MessageAction(task_id=task_id, source="USER", content="list files"))

    step = StepRequest.model_validate(await reasoner.receive())
    assert step.iteration == 1
    # With the first step, the runtime is asked to get the task's sandbox ready.
    prepare = PrepareSandbox.model_validate(await runtime.receive())
    assert prepare.task_id == task_id and not prepare.network_egress
    action = CmdRunAction(task_id=task_id, source="AGENT", cause=step.id, command="ls -la")
    await _answer(js, action)

    execute = ExecuteAction.model_validate(await runtime.receive())
    assert execute.action.id == action.id
    output = CmdOutputObservation(
        task_id=task_id,
        source="ENVIRONMENT",
        cause=action.id,
        command="ls -la",
        content="total 0",
        exit_code=0,
        cwd="/workspace",
    )
    await _answer(js, output)
    step2 = StepRequest.model_validate(await reasoner.receive())
    assert step2.iteration == 2

    # The same observation delivered again (a fresh Nats-Msg-Id, so JetStream keeps it):
    # the controller must recognise it and not run a third step.
    before = await store.load(task_id)
    await _answer(js, output, msg_id=uuid.uuid4().hex)
    assert await reasoner.nothing_within(1.0)
    after = await store.load(task_id)
    assert before is not None and after is not None
    assert (after.version, after.last_seq) == (before.version, before.last_seq)

    finish = AgentFinishAction(
        task_id=task_id, source="AGENT", cause=step2.id, final_message="listed"
    )
    await _answer(js, finish)
    done = await _wait_state(store, task_id, AgentState.FINISHED)
    assert done.result is not None and done.result.final_message == "listed"
    assert done.iteration == 2
    assert ReleaseSandbox.model_validate(await runtime.receive()).task_id == task_id

    for _ in range(200):  # storage follows the stream; slower on a loaded machine
        reply = HistoryReply.model_validate_json(
            (
                await nc.request(
                    HISTORY_SUBJECT,
                    HistoryRequest(task_id=task_id).model_dump_json().encode(),
                    timeout=5,
                )
            ).data
        )
        if reply.last_seq == done.last_seq:
            break
        await asyncio.sleep(0.05)
    kinds = [e["kind"] for e in reply.events]
    assert [e["seq"] for e in reply.events] == list(range(1, done.last_seq + 1))
    assert kinds == [
        "task_created",
        "message",
        "agent_state_changed",
        "run",
        "security_verdict",
        "run_output",
        "finish",
        "agent_state_changed",
    ]


async def test_denied_action_is_fed_back_and_the_task_goes_on(harness: Harness) -> None:
    task_id, store, js = harness.task_id, harness.store, harness.js
    reasoner, runtime = harness.reasoner, harness.runtime
    assert await store.create(TaskState(task_id=task_id, task="x", max_iterations=5))
    await _answer(js, MessageAction(task_id=task_id, source="USER", content="x"))
    step = StepRequest.model_validate(await reasoner.receive())
    await _answer(
        js, CmdRunAction(task_id=task_id, source="AGENT", cause=step.id, command="rm -rf /")
    )
    step2 = StepRequest.model_validate(await reasoner.receive())
    assert step2.iteration == 2
    assert (await runtime.receive())["kind"] == "prepare_sandbox"  # with the first step
    assert await runtime.nothing_within(0.5)  # the denied action never reached it
    state = await store.load(task_id)
    assert state is not None and state.agent_state is AgentState.RUNNING


async def test_unknown_task_and_garbage_are_dead_lettered(system: CommonSettings) -> None:
    nc = await nats.connect(system.nats_url)
    js = nc.jetstream()
    task_id = uuid.uuid4().hex
    try:
        await js.publish(work_subject(Service.CONTROLLER, task_id), b"{not json")
        await _answer(js, MessageAction(task_id=task_id, source="USER", content="?"))
        dlq = await js.pull_subscribe("deckhands.dlq.controller", durable=None)
        reasons = []
        for _ in range(2):
            msg = (await dlq.fetch(1, timeout=10))[0]
            reasons.append(msg.headers["Deckhands-Dlq-Reason"])
        assert any("unknown task" in r for r in reasons)
        assert any("validation" in r.lower() or "json" in r.lower() for r in reasons)
    finally:
        await nc.close()


async def _log_of(nc: nats.aio.client.Client, task_id: str, last_seq: int) -> list[dict[str, Any]]:
    for _ in range(400):
        reply = HistoryReply.model_validate_json(
            (
                await nc.request(
                    HISTORY_SUBJECT,
                    HistoryRequest(task_id=task_id).model_dump_json().encode(),
                    timeout=5,
                )
            ).data
        )
        if reply.last_seq >= last_seq:
            return reply.events
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id}: storage never held seq {last_seq}")


async def test_a_state_redis_lost_mid_action_is_rebuilt_from_the_log(harness: Harness) -> None:
    """FLUSHALL while the runtime runs the task's action: its answer finds no State, the
    controller rebuilds it from the log (awaiting that action) and the task goes on."""
    task_id, store, js = harness.task_id, harness.store, harness.js
    reasoner, runtime = harness.reasoner, harness.runtime
    created = TaskState(task_id=task_id, task="list files", max_iterations=5)
    assert await store.create(created)
    await _answer(js, MessageAction(task_id=task_id, source="USER", content="list files"))
    step = StepRequest.model_validate(await reasoner.receive())
    action = CmdRunAction(task_id=task_id, source="AGENT", cause=step.id, command="ls")
    await _answer(js, action)
    assert (await runtime.receive())["kind"] == "prepare_sandbox"
    assert ExecuteAction.model_validate(await runtime.receive()).action.id == action.id

    await store.redis.flushall()
    output = CmdOutputObservation(
        task_id=task_id,
        source="ENVIRONMENT",
        cause=action.id,
        command="ls",
        content="a.txt",
        exit_code=0,
        cwd="/workspace",
    )
    await _answer(js, output)
    step2 = StepRequest.model_validate(await reasoner.receive())
    assert step2.iteration == 2
    await _answer(js, AgentFinishAction(task_id=task_id, source="AGENT", cause=step2.id))
    done = await _wait_state(store, task_id, AgentState.FINISHED)
    assert (done.iteration, done.max_iterations, done.created_at) == (
        2,
        5,
        created.created_at,
    )
    events = await _log_of(harness.nc, task_id, done.last_seq)
    assert [e["seq"] for e in events] == list(range(1, done.last_seq + 1))
    assert [e["kind"] for e in events][-5:] == [
        "run",
        "security_verdict",
        "run_output",
        "finish",
        "agent_state_changed",
    ]


async def test_a_live_task_is_rebuilt_without_any_input_and_its_lost_step_asked_again(
    harness: Harness,
) -> None:
    """FLUSHALL while the reasoner thinks: the controller sees Redis lost its States, rebuilds
    every live task, and asks again for the step whose request no entry names; the answer to
    the old request is then stale."""
    task_id, store, js = harness.task_id, harness.store, harness.js
    reasoner = harness.reasoner
    assert await store.create(TaskState(task_id=task_id, task="think", max_iterations=5))
    await _answer(js, MessageAction(task_id=task_id, source="USER", content="think"))
    step = StepRequest.model_validate(await reasoner.receive())

    await store.redis.flushall()
    again = StepRequest.model_validate(await reasoner.receive(timeout=20))
    assert again.id != step.id and again.iteration == step.iteration == 1
    rebuilt = await store.load(task_id)
    assert rebuilt is not None and rebuilt.awaiting_id == again.id
    assert rebuilt.awaiting_deadline is not None
    await _answer(js, CmdRunAction(task_id=task_id, source="AGENT", cause=step.id, command="ls"))
    await _answer(
        js, AgentFinishAction(task_id=task_id, source="AGENT", cause=again.id, final_message="ok")
    )
    done = await _wait_state(store, task_id, AgentState.FINISHED)
    events = await _log_of(harness.nc, task_id, done.last_seq)
    assert [e["seq"] for e in events] == list(range(1, done.last_seq + 1))
    assert "run" not in [e["kind"] for e in events]  # the stale answer is not logged


def _creation_request(task_id: str, text: str) -> TaskCreatedObservation:
    """What the gateway sends to make a task (services/gateway/tasks/service.py)."""
    state = TaskState(task_id=task_id, task=text, max_iterations=4, tenant_id="tests")
    return creation_request(state)


async def test_the_controller_makes_a_task_from_the_gateways_request(harness: Harness) -> None:
    """Only the controller writes a task's State: it makes it from the creation request, logs
    the request without its text, and takes the text as the first user message, in one turn;
    the request sent again (a retried POST) changes nothing."""
    task_id, store, js, nc = harness.task_id, harness.store, harness.js, harness.nc
    request = _creation_request(task_id, "list the files")
    await _answer(js, request)
    made = await _wait_state(store, task_id, AgentState.RUNNING)
    assert (made.version, made.task, made.max_iterations, made.tenant_id) == (
        1,
        "list the files",
        4,
        "tests",
    )
    step = StepRequest.model_validate(await harness.reasoner.receive())
    assert (step.after_seq, step.tenant_id) == (3, "tests")
    entries = await _log_of(nc, task_id, 3)
    assert [e["kind"] for e in entries] == ["task_created", "message", "agent_state_changed"]
    assert entries[0]["task"] is None  # the text is the first message, not repeated
    assert entries[0]["id"] == f"created-{task_id}" and entries[0]["max_iterations"] == 4
    assert (entries[1]["id"], entries[1]["content"]) == (
        first_message(request).id,
        "list the files",
    )

    await _answer(js, request, msg_id=new_id())  # past JetStream's dedup: the controller's
    assert await harness.reasoner.nothing_within(1.0)
    again = await store.load(task_id)
    assert again is not None and again.last_seq == made.last_seq


async def test_a_message_sent_before_the_task_is_made_waits_for_it(
    harness: Harness, system: CommonSettings
) -> None:
    """A message the gateway queued right after accepting the task can reach the controller
    before the creation request (workers take messages side by side): while the gateway's copy
    of the request exists, the message is redelivered, not dead-lettered."""
    task_id, store, js, nc = harness.task_id, harness.store, harness.js, harness.nc
    request = _creation_request(task_id, "first")
    redis = Redis.from_url(system.redis_url)
    try:
        # The gateway keeps its copy of the request before sending it.
        await redis.hset(creation_key(task_id), CREATION_REQUEST, request.model_dump_json())
        follow_up = MessageAction(task_id=task_id, source="USER", content="and then this")
        await _answer(js, follow_up)
        await asyncio.sleep(1.0)  # taken at least once meanwhile, and put back
        assert await store.load(task_id) is None
        await _answer(js, request)
        entries = await _log_of(nc, task_id, 4)
    finally:
        await redis.aclose()
    messages = [e["content"] for e in entries if e["kind"] == "message"]
    assert messages == ["first", "and then this"]


async def test_a_deleted_task_s_state_is_removed_by_the_controller(harness: Harness) -> None:
    """Only the controller writes States, removal included: the gateway announces a deleted
    task on the deletions stream (as storage hears it) and the controller removes its State
    and deadline."""
    task_id, store, js = harness.task_id, harness.store, harness.js
    await _answer(js, _creation_request(task_id, "soon gone"))
    await _wait_state(store, task_id, AgentState.RUNNING)
    assert await store.redis.zscore(store.deadlines_key, task_id) is not None
    await js.publish(
        deletion_subject(task_id),
        ForgetTaskRequest(task_id=task_id).model_dump_json().encode(),
        stream=DELETIONS_STREAM,
        headers={"Nats-Msg-Id": f"deleted-{task_id}"},
    )
    for _ in range(200):
        if await store.load(task_id) is None:
            break
        await asyncio.sleep(0.05)
    assert await store.load(task_id) is None
    assert await store.redis.zscore(store.deadlines_key, task_id) is None
