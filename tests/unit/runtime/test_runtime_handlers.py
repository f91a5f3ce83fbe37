"""The runtime's message entry points (services/runtime/handlers.py) as build_runtime wires
them, on FastStream's in-memory broker (TestNatsBroker), the fake engine and a real Redis.

Orders arrive as JetStream delivers them (the reply subject carries the stream, the sequence
and the delivery count the handlers and the delivery guard read); what the runtime sends
goes to JetStream's publish, recorded by the test broker's connection. A NATS server adds
nothing here: the Docker tests (tests/integration/runtime/test_runtime_service.py,
test_runtime_replicas.py) run the same on a real one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from faststream.nats import JStream, NatsBroker, TestNatsBroker
from faststream.nats.annotations import NatsMessage

from services.runtime.bindings import TaskBindings
from services.runtime.main import build_runtime
from services.runtime.routing import relay_id
from services.runtime.service import RuntimeService
from shared.commands import ExecuteAction, ForgetTaskRequest, PrepareSandbox, ReleaseSandbox
from shared.events import (
    AgentState,
    AnswerMissingObservation,
    CmdOutputObservation,
    ErrorObservation,
    EventAdapter,
    EventBase,
)
from shared.subjects import (
    DELETIONS_STREAM,
    DLQ_STREAM,
    ROUTED_STREAM,
    WORK_STREAM,
    Service,
    deletion_subject,
    dlq_subject,
    routed_subject,
    work_subject,
)
from shared.workspace import RepositoryRecords
from tests.fakes.engine import FAKE_ENGINE
from tests.fakes.runtime import RuntimeHarness, cmd, unit_settings


@dataclass
class Wired:
    """build_runtime's broker in memory, its service on the fake engine."""

    broker: NatsBroker
    service: RuntimeService
    rt: RuntimeHarness  # the tasks' States, the engine
    dead: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def deliver(
        self,
        order: ExecuteAction | PrepareSandbox | ReleaseSandbox | bytes,
        delivered: int = 1,
        task_id: str | None = None,
    ) -> int:
        """Deliver an order (or raw bytes) from the work stream, as its `delivered`th delivery;
        its stream sequence is returned."""
        data = order if isinstance(order, bytes) else order.model_dump_json().encode()
        task_id = task_id or (order.task_id if not isinstance(order, bytes) else "t")
        seq = next(self._seq)
        reply = f"$JS.ACK.{WORK_STREAM}.runtime.{delivered}.{seq}.{seq}.{time.time_ns()}.0"
        await self.broker.publish(data, work_subject(Service.RUNTIME, task_id), reply_to=reply)
        return seq

    def published(self, subjects: str) -> list[tuple[str, bytes, dict[str, Any]]]:
        """What the runtime published to JetStream on `subjects` (ending in a wildcard
        token): (subject, body, keyword arguments)."""
        prefix = subjects.removesuffix("*")
        stream = self.broker.config.connection_state.stream
        return [
            (call.args[0], call.args[1], call.kwargs)
            for call in stream.publish.await_args_list
            if call.args[0].startswith(prefix)
        ]

    def to_controller(self) -> list[EventBase]:
        sent = self.published(work_subject(Service.CONTROLLER))
        for subject, body, kwargs in sent:
            event = EventAdapter.validate_json(body)
            assert subject == work_subject(Service.CONTROLLER, event.task_id)
            assert kwargs["stream"] == WORK_STREAM
            assert kwargs["headers"]["Nats-Msg-Id"] == event.id  # JetStream keeps one copy
        return [EventAdapter.validate_json(body) for _, body, _ in sent]


@pytest.fixture
async def wired(redis_url: str) -> AsyncIterator[Wired]:
    settings = unit_settings(redis_url, workspace_retention_s=0)
    app, service = build_runtime(settings, engine=FAKE_ENGINE)
    broker = app.broker
    assert isinstance(broker, NatsBroker)
    box = Wired(broker, service, RuntimeHarness(settings, service=service))

    @broker.subscriber(dlq_subject(Service.RUNTIME), stream=JStream(DLQ_STREAM, declare=False))
    async def dead_letters(body: Any, msg: NatsMessage) -> None:
        box.dead.append((msg.body, dict(msg.headers)))

    async with TestNatsBroker(broker):
        # What the server's INFO would say: how large a message may be.
        broker.config.connection_state.connection.max_payload = 1 << 20
        yield box
    await service.stop()


async def test_an_order_is_run_and_its_observation_sent_to_the_controller_once(
    wired: Wired,
) -> None:
    rt = wired.rt
    task_id = await rt.task()
    action = cmd(task_id, "pytest -q")
    order = await rt.order(action)
    await wired.deliver(order)
    [answer] = wired.to_controller()
    assert isinstance(answer, CmdOutputObservation) and answer.cause == action.id
    assert answer.content == "ran: pytest -q\n"
    assert answer.runtime_replica == wired.service.replica

    await wired.deliver(order, delivered=2)  # redelivered: its ack was lost
    assert wired.to_controller() == [answer, answer]  # the same id: stored once
    assert rt.engine.commands_run() == ["pytest -q"] and wired.dead == []


async def test_a_malformed_order_is_dead_lettered_and_its_task_told(wired: Wired) -> None:
    task_id = await wired.rt.task()
    # An action lacking its fields: no schema reading makes it an order.
    bad = (
        f'{{"kind": "execute_action", "task_id": "{task_id}", '
        '"action": {"id": "act-1", "kind": "run"}}'
    ).encode()
    await wired.deliver(bad, task_id=task_id)
    await wired.deliver(b"\xff not json at all", task_id=task_id)

    [(body, headers), (garbage, _)] = wired.dead
    assert body == bad and garbage == b"\xff not json at all"
    assert headers["Deckhands-Dlq-Subject"] == work_subject(Service.RUNTIME, task_id)
    assert headers["Deckhands-Dlq-Service"] == "runtime"
    assert "ValidationError" in headers["Deckhands-Dlq-Reason"]
    # The task waits for that action's answer: it is told none is coming (the garbage names
    # no action, so nobody is told of it).
    [notice] = wired.to_controller()
    assert isinstance(notice, AnswerMissingObservation) and notice.task_id == task_id
    assert (notice.cause, notice.why, notice.awaiting) == ("act-1", "dead_lettered", "runtime")
    assert wired.rt.engine.calls == []


async def test_an_order_for_an_unknown_task_is_dead_lettered_and_starts_nothing(
    wired: Wired,
) -> None:
    action = cmd("deleted-task", "echo should not run")
    await wired.deliver(ExecuteAction(task_id="deleted-task", action=action))
    [(_, headers)] = wired.dead
    assert "PermanentError" in headers["Deckhands-Dlq-Reason"]
    [notice] = wired.to_controller()
    assert isinstance(notice, AnswerMissingObservation) and notice.cause == action.id
    assert "unknown task" in notice.detail
    assert wired.rt.engine.calls == [] and await wired.rt.seated() == set()


async def test_no_sandbox_is_retried_until_the_last_delivery_then_answered(
    wired: Wired,
) -> None:
    rt = wired.rt
    task_id = await rt.task()
    action = cmd(task_id, "make")
    order = await rt.order(action)
    rt.engine.fail_starts = 2  # the engine refuses the next two starts

    await wired.deliver(order, delivered=1)  # transient: retried with backoff, nothing said
    assert wired.to_controller() == [] and wired.dead == []

    await wired.deliver(order, delivered=wired.service.settings.max_deliveries)  # its last
    [answer] = wired.to_controller()
    assert isinstance(answer, ErrorObservation) and answer.error_code == "no_sandbox"
    assert answer.cause == action.id and "the engine refused it" in answer.content
    assert rt.engine.commands_run() == [] and wired.dead == []


async def test_prepare_and_release_orders_bind_and_remove_the_tasks_sandbox(
    wired: Wired,
) -> None:
    rt = wired.rt
    task_id = await rt.task()
    await wired.deliver(PrepareSandbox(task_id=task_id))
    container_id = await rt.bound(task_id)
    assert container_id is not None and rt.engine.ops("create") == [container_id]
    assert task_id in await rt.seated()

    await rt.set_state(task_id, AgentState.FINISHED)
    await wired.deliver(ReleaseSandbox(task_id=task_id, reason="finished"))
    assert rt.engine.ops("remove") == [container_id] and rt.engine.containers == {}
    assert await rt.bound(task_id) is None and await rt.seated() == set()
    assert wired.to_controller() == [] and wired.dead == []


async def test_an_order_whose_sandbox_another_live_replica_holds_is_passed_on(
    wired: Wired,
) -> None:
    rt = wired.rt
    task_id = await rt.task()
    other = TaskBindings(wired.service.redis, rt.settings.pool_name, 3600, "other-replica")
    await other.bind(task_id, "c0ffee")  # on the other replica's engine
    await other.name_heartbeat(30)  # and that replica is alive
    order = await rt.order(cmd(task_id, "ls"))
    seq = await wired.deliver(order)

    [(subject, body, kwargs)] = wired.published(routed_subject(Service.RUNTIME, "other-replica"))
    assert subject == routed_subject(Service.RUNTIME, "other-replica", task_id)
    assert ExecuteAction.model_validate_json(body) == order and kwargs["stream"] == ROUTED_STREAM
    assert kwargs["headers"]["Nats-Msg-Id"] == relay_id(order.id, WORK_STREAM, seq)
    assert wired.to_controller() == [] and rt.engine.calls == []


async def test_a_deleted_task_s_checkout_records_are_removed(wired: Wired) -> None:
    """The deletions stream tells the runtime a task is deleted: what its checkout recorded
    (its commit, its repository's instructions), the runtime's records, go; the repository the
    gateway recorded is the gateway's to remove."""
    task_id = await wired.rt.task()
    records = RepositoryRecords(wired.service.redis)
    await records.mark_checked_out(task_id, "0" * 40)
    await records.put_instructions(task_id, "AGENTS.md", "run the tests")
    reply = f"$JS.ACK.{DELETIONS_STREAM}.runtime.1.1.1.{time.time_ns()}.0"
    await wired.broker.publish(
        ForgetTaskRequest(task_id=task_id).model_dump_json().encode(),
        deletion_subject(task_id),
        reply_to=reply,
    )
    assert await records.checked_out(task_id) is None
    assert await records.instructions(task_id) is None
    assert wired.dead == []
